"""One list of the environment (cloudtrain/core/env.py): every `CLOUDTRAIN_*` variable is declared
there once, read only through it, and every declared one is used.

The checks scan the code's trees (cloudtrain/, providers/, jobs/; not tests/):
- a bypass is a module other than core/env.py naming a variable itself: a string constant that
  starts with `CLOUDTRAIN_` and is not a docstring, a keyword argument so named (`env.update(
  CLOUDTRAIN_X=...)`), or an `os.environ`/`os.getenv` read whose key is such a name;
- every `CLOUDTRAIN_*` name written anywhere in the trees (code, bash in strings, `*.j2`
  templates, comments, docs) is declared;
- every declared variable is used: referenced through cloudtrain.core.env by code, or named in a
  template or in a string the code builds (bash), outside env.py.
Each check also runs on a planted module, to show that it fails.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.core import env

ROOT = Path(__file__).resolve().parents[3]
TREES = ("cloudtrain", "providers", "jobs")
ENV_PY = ROOT / "cloudtrain" / "core" / "env.py"
NAME_RE = re.compile(r"\bCLOUDTRAIN_[A-Z0-9]+(?:_[A-Z0-9]+)*")
ENV_MODULE = "cloudtrain.core.env"
ATTRS = {name: value.name for name, value in vars(env).items() if isinstance(value, env.Var)}


def tree_files() -> Iterator[Path]:
    """Every text file of the trees but env.py itself (caches and binaries left out)."""
    for top in TREES:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path != ENV_PY:
                yield path


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are statements (docstrings, bare strings)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }


def _named_constants(tree: ast.Module) -> dict[str, str]:
    """Module-level `NAME = "CLOUDTRAIN_..."` bindings."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            value = node.value.value
            if isinstance(value, str) and value.startswith(env.PREFIX):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = value
    return found


def _env_read_key(node: ast.AST) -> ast.AST | None:
    """The key of a read: `M[K]`, `M.get(K)`/`.pop`/`.setdefault` (M os.environ or a mapping
    standing for it), `os.getenv(K)`."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        return node.slice
    func = node.func if isinstance(node, ast.Call) and node.args else None
    if isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault", "getenv"):
        return node.args[0]  # type: ignore[union-attr]
    return None


def _key_name(key: ast.AST) -> str:
    """`FOO_ENV` for a key written `FOO_ENV` or `module.FOO_ENV`; "" for any other key."""
    if isinstance(key, ast.Name):
        return key.id
    return key.attr if isinstance(key, ast.Attribute) else ""


def bypasses(source: str, where: str, known: dict[str, str] | None = None) -> list[str]:
    """Each place in one module's source that names a CLOUDTRAIN_* variable itself, or reads
    one by a constant that names it (bound here, or in `known`: every module's such constants,
    for a key imported from another module)."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    constants = {**(known or {}), **_named_constants(tree)}
    out = []
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Constant) and id(node) not in skip:
            if isinstance(node.value, str) and node.value.startswith(env.PREFIX):
                out.append(f"{line}: string {node.value[:40]!r}")
        elif isinstance(node, ast.keyword) and (node.arg or "").startswith(env.PREFIX):
            out.append(f"{line}: keyword {node.arg}")
        key = _env_read_key(node)
        if isinstance(key, ast.Constant) and str(key.value).startswith(env.PREFIX):
            out.append(f"{line}: environment read of {key.value}")
        elif _key_name(key) in constants:
            name = _key_name(key)
            out.append(f"{line}: environment read of {constants[name]} (as {name})")
    return out


def named(text: str) -> set[str]:
    """The CLOUDTRAIN_* names written in a text (a bare `CLOUDTRAIN_` or `CLOUDTRAIN_*` is none)."""
    return set(NAME_RE.findall(text))


def used(source: str) -> set[str]:
    """The variables one module uses: attributes of cloudtrain.core.env it references or imports
    by name, and names in the strings it builds (bash, not docstrings)."""
    tree = ast.parse(source)
    aliases, out = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == ENV_MODULE:
            out |= {ATTRS[a.name] for a in node.names if a.name in ATTRS}
        elif isinstance(node, ast.ImportFrom) and node.module == "cloudtrain.core":
            aliases |= {a.asname or a.name for a in node.names if a.name == "env"}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name == ENV_MODULE and a.asname}
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ATTRS:
            base = node.value
            if (isinstance(base, ast.Name) and base.id in aliases) or ast.unparse(base) == (
                ENV_MODULE
            ):
                out.add(ATTRS[node.attr])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out |= set() if id(node) in skip else named(node.value)
    return out


def scan() -> tuple[list[str], set[str], set[str]]:
    """(bypasses, names written anywhere, names used) over the trees."""
    found, written, in_use = [], set(), set()
    texts = {path: read_text(path) for path in tree_files()}
    known: dict[str, str] = {}
    for path, text in texts.items():
        if text is not None and path.suffix == ".py":
            known.update(_named_constants(ast.parse(text)))
    for path, text in texts.items():
        if text is None:
            continue
        written |= named(text)
        if path.suffix == ".py":
            where = str(path.relative_to(ROOT))
            found += bypasses(text, where, known)
            in_use |= used(text)
        elif path.suffix in (".j2", ".sh"):
            in_use |= named(text)
    return found, written, in_use


SCAN = scan()


def test_no_module_but_env_names_a_variable() -> None:
    assert SCAN[0] == []


def test_every_variable_named_in_the_trees_is_declared() -> None:
    assert sorted(SCAN[1] - set(ATTRS.values())) == []


def test_every_declared_variable_is_used() -> None:
    assert sorted(set(ATTRS.values()) - SCAN[2]) == []


def test_declarations_are_one_each_and_well_formed() -> None:
    names = [v.name for v in env.VARS]
    assert len(names) == len(set(names)) == len(ATTRS)
    for var in env.VARS:
        assert var.meaning and var.type in env.TYPES
        assert set(var.readers) <= {env.CONTROLLER, env.AGENT, env.JOB, env.BOOTSTRAP}
        assert env.by_name(var.name) is var
    with pytest.raises(KeyError):
        env.by_name("CLOUDTRAIN_NOT_DECLARED")


# --- each check fails on a planted module ------------------------------------------------------
PLANTED = '''"""Reads $CLOUDTRAIN_HOME (a docstring: no bypass)."""
import os
from cloudtrain.core import env
A_ENV = "CLOUDTRAIN_HOME"
home = os.environ.get(A_ENV)
port = os.getenv("CLOUDTRAIN_NODE_PORT")
os.environ.update(CLOUDTRAIN_ROLE="chief")
given = {}.get(streams.B_ENV) or os.environ[B_ENV]
label = f"CLOUDTRAIN_TTL={home}"
fine = env.HOME.get(), env.ROLE.name
'''


def test_a_planted_bypass_is_found() -> None:
    found = bypasses(PLANTED, "planted.py", {"B_ENV": "CLOUDTRAIN_MAX_STEPS"})
    assert sorted(f.split(": ", 1)[1] for f in found) == [
        "environment read of CLOUDTRAIN_HOME (as A_ENV)",
        "environment read of CLOUDTRAIN_MAX_STEPS (as B_ENV)",
        "environment read of CLOUDTRAIN_MAX_STEPS (as B_ENV)",
        "environment read of CLOUDTRAIN_NODE_PORT",
        "keyword CLOUDTRAIN_ROLE",
        "string 'CLOUDTRAIN_HOME'",
        "string 'CLOUDTRAIN_NODE_PORT'",
        "string 'CLOUDTRAIN_TTL='",
    ]
    assert bypasses('"""$CLOUDTRAIN_HOME"""\nfrom cloudtrain.core import env\n', "x.py") == []


def test_an_undeclared_name_and_an_unused_declaration_are_found() -> None:
    assert named(PLANTED) - set(ATTRS.values()) == {"CLOUDTRAIN_TTL"}
    assert named("see CLOUDTRAIN_* and the CLOUDTRAIN_ prefix") == set()
    got = used(PLANTED)
    assert {"CLOUDTRAIN_HOME", "CLOUDTRAIN_ROLE"} <= got and "CLOUDTRAIN_INDEX" not in got
    assert used("from cloudtrain.core.env import INDEX\nimport cloudtrain.core.env as e\ne.ROLE\n")
    assert used("import cloudtrain.core.env\ncloudtrain.core.env.STRATEGY.get()\n") == {
        "CLOUDTRAIN_STRATEGY"
    }


# --- the accessors ---------------------------------------------------------------------------
def test_accessors_read_the_given_mapping_typed() -> None:
    environ = {
        "CLOUDTRAIN_HOME": " ~/ct ",
        "CLOUDTRAIN_INDEX": "3",
        "CLOUDTRAIN_IS_CHIEF": "0",
        "CLOUDTRAIN_FAULTS": '{"latency_s": 1}',
        "CLOUDTRAIN_LEASE_TTL_S": "2.5",
        "CLOUDTRAIN_ROLE": " ",
    }
    assert env.HOME.get(environ) == Path("~/ct").expanduser()
    assert env.HOME.raw(environ) == " ~/ct " and env.HOME.text(environ) == "~/ct"
    assert env.INDEX.get(environ) == 3 and env.IS_CHIEF.get(environ) is False
    assert env.FAULTS.get(environ) == {"latency_s": 1} and env.LEASE_TTL.get(environ) == 2.5
    assert env.ROLE.get(environ) is None and env.ROLE.raw(environ) == " "
    assert env.MODEL_DIR.get(environ) is None and env.MODEL_DIR.raw(environ) is None
    assert env.MODEL_DIR.text(environ) == ""


def test_accessors_read_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.MAX_STEPS.name, " 7 ")
    assert env.MAX_STEPS.get() == 7
    monkeypatch.delenv(env.MAX_STEPS.name)
    assert env.MAX_STEPS.get() is None


@pytest.mark.parametrize(
    "var, value", [(env.INDEX, "two"), (env.LEASE_TTL, "soon"), (env.IS_CHIEF, "maybe")]
)
def test_a_value_of_the_wrong_type_is_a_value_error(var: env.Var, value: str) -> None:
    with pytest.raises(ValueError):
        var.get({var.name: value})
    with pytest.raises(ValueError):
        env.FAULTS.get({env.FAULTS.name: "{"})


def test_a_declaration_outside_the_prefix_or_types_is_refused() -> None:
    with pytest.raises(ValueError):
        env.Var("HOME", "str", (), "no prefix")
    with pytest.raises(ValueError):
        env.Var("CLOUDTRAIN_X", "list", (), "no such type")


def test_the_table_has_a_row_per_variable() -> None:
    table = env.table_markdown().splitlines()
    assert table[0] == "| Variable | Type | Read by | Test-only | Meaning |"
    assert len(table) == 2 + len(env.VARS)
    ssh = [line for line in table if line.startswith("| `CLOUDTRAIN_SSH_CIDR` |")]
    assert len(ssh) == 1 and "deprecated, use `providers.<cloud>.ssh_cidr`" in ssh[0]
