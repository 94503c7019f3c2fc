"""The layers (ARCHITECTURE.md, "Layout and layers") hold: `lint-imports` keeps every
import-linter contract in pyproject.toml, and those contracts classify every module of
cloudtrain/ as core or controller, naming the same controller everywhere.

The packages cloudtrain.providers and cloudtrain.jobs live in providers/ and jobs/ (pyproject's
package-dir), where import-linter's module discovery does not look, so the check runs on a
shadow tree: a cloudtrain/ folder of symlinks to every entry of the real one, plus providers/
and jobs/.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"


def contracts() -> dict[str, dict[str, Any]]:
    """The import-linter contracts in pyproject.toml, by id."""
    config = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def shadow_tree(tmp_path: Path) -> Path:
    """A folder holding a `cloudtrain` package that contains providers/ and jobs/ (symlinks)."""
    package = tmp_path / "cloudtrain"
    package.mkdir()
    for entry in (ROOT / "cloudtrain").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    (package / "providers").symlink_to(ROOT / "providers")
    (package / "jobs").symlink_to(ROOT / "jobs")
    return tmp_path


def lint_imports(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` over the shadow tree with pyproject.toml's contracts. Blocks."""
    shadow = shadow_tree(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(shadow)}
    code = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run(
        [sys.executable, "-c", code, "--no-cache", str(PYPROJECT)],
        cwd=shadow,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_import_contracts_are_kept(tmp_path: Path) -> None:
    proc = lint_imports(tmp_path)
    report = proc.stdout + proc.stderr
    analyzed = re.search(r"Analyzed (\d+) files", report)
    modules = [
        path
        for top in ("cloudtrain", "providers", "jobs")
        for path in (ROOT / top).rglob("*.py")
        if all((d / "__init__.py").is_file() for d in path.parents if d.is_relative_to(ROOT / top))
    ]
    assert analyzed and int(analyzed[1]) == len(modules), report  # providers/ and jobs/ too
    assert proc.returncode == 0, report


def test_every_module_is_core_or_controller_and_the_contracts_agree() -> None:
    by_id = contracts()
    core = set(by_id["core"]["source_modules"])
    controller = set(by_id["providers"]["forbidden_modules"])
    modules = {
        f"cloudtrain.{p.stem}"
        for p in (ROOT / "cloudtrain").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    assert not core & controller, core & controller
    assert modules - core - controller == set(), "classify these in pyproject.toml"
    assert core | controller <= modules, "pyproject.toml names modules that do not exist"
    layers = {"cloudtrain.providers", "cloudtrain.jobs"}
    assert set(by_id["core"]["forbidden_modules"]) == layers | controller
    assert set(by_id["node-side"]["forbidden_modules"]) == controller
    assert set(by_id["protocol"]["source_modules"]) == controller
    assert set(by_id["one-retry-layer"]["source_modules"]) == {"cloudtrain.jobs"} | controller
