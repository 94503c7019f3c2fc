"""No module outside providers/ (and tests/) names a provider: what cloudtrain knows of a cloud,
or of `local`, is in its package, declared in its INFO (providers/README.md), and the rest asks
the registry.

Checked over cloudtrain/ and jobs/: every string literal of the Python code (docstrings are
prose, and comments are not code), every identifier, and every non-comment line of the other
files (the bootstrap template). A cloud name is `aws`, `gcp` or `azure` as a word, in any case.
`local` is a word with other meanings (a local file, local time, a shell's `local`), so only
its spellings as a provider's name count: a string literal that is exactly "local", and the
identifier `LOCAL`. Each exception is listed in ALLOWED with its reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("cloudtrain", "jobs")
CLOUD = re.compile(r"(?<![A-Za-z0-9])(aws|gcp|azure)(?![A-Za-z0-9])", re.IGNORECASE)
IDENTIFIER = re.compile(r"(?:^|_)(aws|gcp|azure)(?:_|$)", re.IGNORECASE)
LOCAL_LITERAL = "local"  # the provider's name as a string constant, exactly
LOCAL_IDENTIFIER = "LOCAL"  # ... and as a constant's name
# folders whose files other than Python are data, not code
DATA_DIRS = {
    # the bundled price catalog: one CSV per provider, each row keyed by the provider's name
    # (package data, written by cloudtrain/catalog/build.py); its README documents those files
    "cloudtrain/catalog",
}

# Python modules that are data, not code: why. Nothing in them decides anything by a cloud's name.
DATA_MODULES = {
    # the one list of the environment (ARCHITECTURE.md, "The environment"): each CLOUDTRAIN_*
    # variable's name and meaning, some of them a cloud's deprecated option or test endpoint
    # (CLOUDTRAIN_GCP_NETWORK, CLOUDTRAIN_ARM_ENDPOINT); what reads them is the cloud's package
    "cloudtrain/core/env.py": "the declarations of the environment's variables",
}

# (file, literal text it may contain): why. Nothing else may name a cloud.
ALLOWED: dict[tuple[str, str], str] = {
    (
        "cloudtrain/cli/main.py",
        "Run a TensorFlow training job on the cheapest GPU VMs of AWS, GCP, Azure or this ",
    ): "the product's one-line description in `cloudtrain --help` (prose, like the README)",
    (
        "cloudtrain/catalog/build.py",
        "local",
    ): "LOCAL_ROW, the one row build writes to the bundled local.csv: data (the provider's name, "
    "and its instance type, region and zone, each this machine), as the CSVs are",
    (
        "jobs/tf_strategies.py",
        "local",
    ): "TensorFlow's own name for a TPU VM's chips, TPUClusterResolver(tpu=\"local\"), no provider",
}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _identifiers(node: ast.AST) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.alias):
        return [node.asname or node.name.rsplit(".", 1)[-1]]
    return []


def python_findings(path: Path, rel: str) -> list[tuple[str, int, str]]:
    """(file, line, text) of each string literal (not a docstring) or identifier naming a
    cloud in one Python file. Pure but for reading it."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        text = node.value if isinstance(node, ast.Constant) else None
        named = isinstance(text, str) and (CLOUD.search(text) or text == LOCAL_LITERAL)
        if named and id(node) not in docstrings:
            found.append((rel, node.lineno, text))
        for name in _identifiers(node):
            if IDENTIFIER.search(name) or name == LOCAL_IDENTIFIER:
                found.append((rel, getattr(node, "lineno", 0), name))
    return found


def text_findings(path: Path, rel: str) -> list[tuple[str, int, str]]:
    """(file, line, text) of each non-comment line naming a cloud in a template or script."""
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith(("#", "{#")):
            continue
        if CLOUD.search(line):
            found.append((rel, number, stripped))
    return found


def _allowed(snippet: str, text: str) -> bool:
    """Whether an ALLOWED snippet covers a finding: a part of its text, but `local` only
    as the whole literal (a part of "local" is no provider's name). Pure."""
    return text == snippet if snippet == LOCAL_LITERAL else snippet in text


def findings(root: Path = ROOT) -> list[tuple[str, int, str]]:
    """Every place in cloudtrain/ and jobs/ that names a cloud and is not in ALLOWED."""
    out = []
    for folder in SCANNED:
        for path in sorted((root / folder).rglob("*")):
            rel = path.relative_to(root).as_posix()
            if not path.is_file() or "__pycache__" in rel:
                continue
            if rel in DATA_MODULES:
                continue
            in_data = any(rel.startswith(data + "/") for data in DATA_DIRS)
            if in_data and path.suffix != ".py":
                continue
            if path.suffix == ".py":
                found = python_findings(path, rel)
            elif path.suffix in (".pyc", ".typed"):
                continue
            else:
                found = text_findings(path, rel)
            out += [
                (file, line, text)
                for file, line, text in found
                if not any(file == f and _allowed(snippet, text) for f, snippet in ALLOWED)
            ]
    return out


def test_no_module_outside_providers_names_a_provider() -> None:
    found = findings()
    report = "\n".join(f"{file}:{line}: {text[:120]!r}" for file, line, text in found)
    assert not found, (
        "these name a provider outside providers/: ask the registry (cloudtrain.providers: "
        "names, info, declared, INFO fields) instead, or add the exception to ALLOWED with its "
        "reason\n" + report
    )


def test_the_scan_finds_a_planted_cloud_name(tmp_path: Path) -> None:
    planted = tmp_path / "jobs"
    planted.mkdir()
    (planted / "probe.py").write_text(
        '"""Docstrings may say AWS."""\n'
        "# and so may comments: gcp\n"
        'SCHEMES = {"s3": "aws"}\n'
        "def azure_only() -> None: ...\n"
    )
    (planted / "boot.sh.j2").write_text("# comments may: Azure\ncurl http://gcp.example\n")
    found = findings(tmp_path)
    assert sorted((f, line) for f, line, _ in found) == [
        ("jobs/boot.sh.j2", 2),
        ("jobs/probe.py", 3),
        ("jobs/probe.py", 4),
    ]


def test_the_scan_finds_local_as_a_provider_name_only(tmp_path: Path) -> None:
    planted = tmp_path / "cloudtrain" / "plan"
    planted.mkdir(parents=True)
    (planted / "probe.py").write_text(
        '"""On "local" a docstring may say local."""\n'
        '# a comment may too: provider == "local"\n'
        "def local_files(localtime: str) -> str: ...\n"
        'KIND = "local file"\n'
        'if PROVIDER == "local":\n'
        "    LOCAL = 1\n"
    )
    (planted / "boot.sh.j2").write_text('f() { local x="local"; }\n')
    data = tmp_path / "cloudtrain" / "catalog"
    data.mkdir()
    (data / "local.csv").write_text("provider\nlocal\n")
    found = findings(tmp_path)
    assert sorted((f, line) for f, line, _ in found) == [
        ("cloudtrain/plan/probe.py", 5),
        ("cloudtrain/plan/probe.py", 6),
    ]
