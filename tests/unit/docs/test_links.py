"""The documents point at what exists: every relative markdown link resolves to a file (and, with
`#anchor` into a markdown file, to one of its headings by GitHub's slug rules), and every repo path
written in backticks (`cloudtrain/run/orchestrator.py`, `jobs/agent.py`, `tests/fakes/`) names a
file or folder of this checkout. Paths drift when code moves; this is where it shows.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# the documents checked: the front door, the design, the provider checklist, the catalog's notes,
# and every page under docs/
NAMED = ("README.md", "ARCHITECTURE.md", "providers/README.md", "cloudtrain/catalog/README.md")
# ARCHITECTURE.md is being rewritten for the layer folders (issue 31): its stale paths are known
# documents known to name stale paths, with why (none: keep it empty)
STALE_PATHS: dict[str, str] = {}

# the top-level folders whose paths a document may name in backticks
REPO_ROOTS = ("cloudtrain/", "jobs/", "providers/", "tests/", "benchmarks/", "docs/", ".ci/")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, ...
# a path in backticks: no spaces, no placeholders (<cloud>, $VAR, ~, *, ...)
PATH_TEXT = re.compile(r"^[A-Za-z0-9_./{},-]+$")
PLACEHOLDER = re.compile(r"(?<![A-Za-z])(NAME|RUN|NODE|CLOUD|PROVIDER|P)(?![A-Za-z])")
BARE_MODULE = re.compile(r"^[a-z_][a-z0-9_]*\.py$")
DOTTED = re.compile(r"^cloudtrain(\.[A-Za-z_][A-Za-z0-9_]*)+$")
# paths the suite makes on first use, not in a fresh checkout: (path): who makes it
GENERATED = {
    "tests/.venvs": "tests/run.sh, the node-side Pythons' venvs",
    "tests/.azurite": "tests/run.sh, Azurite from npm",
}


def documents() -> list[str]:
    """The checked documents, relative to the repository root."""
    pages = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md"))
    return [*NAMED, *pages]


def prose(text: str) -> str:
    """The text with fenced code blocks blanked (their lines kept, so line numbers hold)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else line)
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (github-slugger): the rendered text, lower case,
    punctuation dropped (letters, digits, `_`, `-` and spaces kept), each space a `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = text.strip().lower()
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a markdown text, duplicates numbered as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose(text).splitlines():
        match = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of each inline and reference link outside code."""
    out = []
    for number, line in enumerate(prose(text).splitlines(), 1):
        line = CODE_SPAN.sub("", line)
        out += [(number, m.group(1)) for m in LINK.finditer(line)]
        out += [(number, m.group(1)) for m in REFERENCE.finditer(line)]
    return out


def broken_links(doc: str) -> list[str]:
    """Each relative link of `doc` whose file, or whose anchor in a markdown file, is missing."""
    source = ROOT / doc
    problems = []
    for number, target in links(source.read_text(encoding="utf-8")):
        if EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (source.parent / file_part).resolve() if file_part else source
        where = f"{doc}:{number}: ({target})"
        if not dest.is_relative_to(ROOT):
            problems.append(f"{where}: leaves the repository")
        elif not dest.exists():
            problems.append(f"{where}: no such file")
        elif (
            anchor
            and dest.suffix == ".md"
            and anchor.lower() not in anchors(dest.read_text(encoding="utf-8"))
        ):
            problems.append(f"{where}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    return problems


def expand(path: str) -> list[str]:
    """`a/{b,c}.py` as `a/b.py`, `a/c.py`."""
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def code_paths(text: str) -> list[tuple[int, str]]:
    """(line, path) of each backticked repo name outside fenced code: a path rooted at a
    top-level folder, a bare `name.py`, or a dotted `cloudtrain.` module; none with a placeholder
    in it (`<cloud>`, `NAME`, `$VAR`, `*`); a `:LINE` or `#anchor` suffix is dropped."""
    out = []
    for number, line in enumerate(prose(text).splitlines(), 1):
        for match in CODE_SPAN.finditer(line):
            name = re.sub(r"(:\d+(-\d+)?|#[\w-]+)$", "", match.group(2).strip())
            if not PATH_TEXT.match(name) or PLACEHOLDER.search(name) or ".." in name:
                continue
            if name.startswith(REPO_ROOTS) or BARE_MODULE.match(name) or DOTTED.match(name):
                out += [(number, p) for p in expand(name)]
    return out


def tracked_names() -> set[str]:
    """The file names (no folder) of every .py file in the checkout, tests' own kits included."""
    return {
        p.name
        for top in REPO_ROOTS
        for p in (ROOT / top).rglob("*.py")
        if not any(part.startswith(".") for part in p.relative_to(ROOT).parts[1:])
    }


def module_file(path: str) -> Path | None:
    """The file of a module named by path (`jobs/agent`) or dotted (`cloudtrain.run.orchestrator`;
    `cloudtrain.jobs` is `jobs/`, `cloudtrain.providers` is `providers/`), if there is one."""
    if DOTTED.match(path):
        parts = path.split(".")
        path = "/".join(parts[1:] if parts[1:2] in (["jobs"], ["providers"]) else parts)
    for candidate in (f"{path}.py", f"{path}/__init__.py"):
        if (ROOT / candidate).is_file():
            return ROOT / candidate
    return None


def names_something(path: str, names: set[str]) -> bool:
    """Whether `path` is a file or folder here, a bare file name found anywhere here, a module, or
    one attribute of a module whose text names it (`jobs/protocol_base.load_json`)."""
    if BARE_MODULE.match(path):
        return path in names
    if path in GENERATED or module_file(path) is not None:
        return True
    if not DOTTED.match(path) and (ROOT / path).exists():
        return True
    head, dot, attr = path.rpartition(".")
    found = module_file(head) if dot and "/" not in attr else None
    return found is not None and re.search(rf"\b{re.escape(attr)}\b", found.read_text()) is not None


def stale_paths(doc: str) -> list[str]:
    """Each backticked repo name in `doc` that names nothing in this checkout."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    names = tracked_names()
    return [f"{doc}:{n}: `{p}`" for n, p in code_paths(text) if not names_something(p, names)]


@pytest.mark.parametrize("doc", documents())
def test_relative_links_resolve(doc: str) -> None:
    assert broken_links(doc) == []


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(d, marks=pytest.mark.xfail(strict=True, reason=STALE_PATHS[d]))
        if d in STALE_PATHS
        else d
        for d in documents()
    ],
)
def test_backticked_repo_paths_exist(doc: str) -> None:
    assert stale_paths(doc) == []


def test_the_checker_sees_what_it_must() -> None:
    text = (
        "# Getting GPUs: quotas & rights\n## `cloudtrain check`\n## Getting GPUs: quotas & rights\n"
        "[a](docs/x.md#y) [b](https://e.com) `jobs/agent.py` `tests/unit/test_{a,b}.py:3` "
        "`logs/<node>/` `$CLOUDTRAIN_HOME/runs` `control/lease`\n```\n[c](z.md) `jobs/z.py`\n```\n"
    )
    assert links(text) == [(4, "docs/x.md#y"), (4, "https://e.com")]
    assert code_paths(text) == [
        (4, "jobs/agent.py"),
        (4, "tests/unit/test_a.py"),
        (4, "tests/unit/test_b.py"),
    ]
    assert anchors(text) == {
        "getting-gpus-quotas--rights",
        "cloudtrain-check",
        "getting-gpus-quotas--rights-1",
    }
    assert slug("`cloudtrain check` (read-only)") == "cloudtrain-check-read-only"
    assert slug("Try it (one command)") == "try-it-one-command"
