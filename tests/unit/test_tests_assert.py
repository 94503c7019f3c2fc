"""Every test function can fail: it asserts, expects an exception (`pytest.raises`, `.fail`,
`.warns`), or calls a helper that does. Read from the source with `ast`, without running the
tests. DELEGATES lists the tests that run other tests by name.

A helper counts when it is a function of the same module, or one imported by name from a module
under tests/, whose body asserts (followed through helpers up to 4 calls deep), or a method whose
name says it asserts (`assert_*`, `_assert_*`, `expect_*`). A test that checks only that its calls
do not raise is a defect: it passes while doing nothing. OWED lists those known today in files
this check's author could not change; fix one, then remove it here (the test fails while a
listed test asserts, so the list cannot grow stale).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
SKIPPED_DIRS = {".venvs", ".azurite", "__pycache__", "golden", "fixtures"}
EXPECTS = {"raises", "fail", "warns", "deprecated_call"}  # pytest's ways to expect an outcome
ASSERTING_PREFIXES = ("assert_", "_assert_", "expect_")
# test functions with no assertion, in files owned elsewhere (issue 14): "path::name" -> why
OWED: dict[str, str] = {
}


# tests that run other tests, picked by name at run time (the scan cannot follow a getattr)
DELEGATES: dict[str, str] = {
    "tests/unit/providers/gcp/test_gcp_storage.py::test_object_store_contract": (
        "runs each ObjectStore test of tests/providers/test_contract.py on the GCS emulator"
    ),
}


@dataclass
class Module:
    """One parsed file: its functions and the names it imports from tests/ modules."""

    path: Path
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    imported: dict[str, str] = field(default_factory=dict)  # local name -> module path


def _files() -> list[Path]:
    return sorted(
        p for p in TESTS.rglob("*.py") if not SKIPPED_DIRS & set(p.relative_to(TESTS).parts)
    )


def _parse(path: Path) -> Module:
    module = Module(path)
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            module.functions.setdefault(node.name, node)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
            source = REPO.joinpath(*node.module.split(".")).with_suffix(".py")  # type: ignore[union-attr]
            for alias in node.names:
                module.imported[alias.asname or alias.name] = str(source)
    return module


def _called(fn: ast.AST) -> list[ast.expr]:
    return [n.func for n in ast.walk(fn) if isinstance(n, ast.Call)]


def _asserts(
    fn: ast.FunctionDef | ast.AsyncFunctionDef,
    module: Module,
    modules: dict[str, Module],
    depth: int = 4,
) -> bool:
    """Whether `fn` asserts, expects an exception, or calls a helper that does. Pure."""
    if any(isinstance(n, ast.Assert) for n in ast.walk(fn)):
        return True
    for func in _called(fn):
        if isinstance(func, ast.Attribute):
            if func.attr in EXPECTS or func.attr.startswith(ASSERTING_PREFIXES):
                return True
            continue
        if not isinstance(func, ast.Name) or depth == 0:
            continue
        if func.id.startswith(ASSERTING_PREFIXES):
            return True
        where = module
        if func.id not in module.functions and func.id in module.imported:
            where = modules.get(module.imported[func.id], module)
        helper = where.functions.get(func.id)
        if helper is not None and helper is not fn and _asserts(helper, where, modules, depth - 1):
            return True
    return False


def find_tests_without_assertion() -> list[str]:
    """'path::name' of every test function under tests/ that cannot fail. Read-only."""
    modules = {str(p): _parse(p) for p in _files()}
    found = []
    for module in modules.values():
        if not module.path.name.startswith("test_"):
            continue
        for name, fn in module.functions.items():
            if name.startswith("test_") and not _asserts(fn, module, modules):
                found.append(f"{module.path.relative_to(REPO)}::{name}")
    return sorted(found)


def test_every_test_function_can_fail() -> None:
    assert find_tests_without_assertion() == sorted({*OWED, *DELEGATES})


def test_the_scan_finds_a_test_without_assertion(tmp_path: Path) -> None:
    """The scan itself can fail: a do-nothing test is found, an asserting one is not."""
    source = (
        "def helper(x):\n    assert x\n\n"
        "def test_nothing():\n    sum([1, 2])\n\n"
        "def test_via_helper():\n    helper(1)\n\n"
        "def test_raises():\n    import pytest\n    with pytest.raises(ValueError):\n"
        "        int('x')\n"
    )
    path = tmp_path / "test_sample.py"
    path.write_text(source)
    module = _parse(path)
    verdicts = {
        name: _asserts(fn, module, {str(path): module})
        for name, fn in module.functions.items()
        if name.startswith("test_")
    }
    assert verdicts == {"test_nothing": False, "test_via_helper": True, "test_raises": True}
