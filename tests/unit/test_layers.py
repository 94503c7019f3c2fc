"""The layers (ARCHITECTURE.md, "Layout and layers") hold: `lint-imports` keeps every
import-linter contract in pyproject.toml; the contracts name folders, every module of cloudtrain/
lives in one of them; and a planted upward import or a planted cycle breaks them.

The packages cloudtrain.providers and cloudtrain.jobs live in providers/ and jobs/ (pyproject's
package-dir), where import-linter's module discovery does not look, so the check runs on a
shadow tree (tests/lint_imports.py, `python3 -m tests.lint_imports` by hand).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import tomllib

from tests.lint_imports import lint_imports

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"


def contracts() -> dict[str, dict[str, Any]]:
    """The import-linter contracts in pyproject.toml, by id."""
    config = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def test_the_import_contracts_are_kept() -> None:
    # the documented command itself, as a developer runs it (ARCHITECTURE.md)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.lint_imports"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
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


def layer_folders() -> list[str]:
    """The folders the layers contract names, top first (`jobspec | catalog` is two). Pure."""
    layers = contracts()["layers"]["layers"]
    return [name for layer in layers for name in re.split(r"\s*[|:]\s*", layer)]


def test_every_module_lives_in_a_layer_folder() -> None:
    folders = set(layer_folders())
    top = ROOT / "cloudtrain"
    loose = sorted(p.name for p in top.glob("*.py") if p.name != "__init__.py")
    packages = {p.name for p in top.iterdir() if (p / "__init__.py").is_file()}
    assert loose == [], "a module belongs in a layer folder"
    assert packages | {"providers", "jobs"} == folders, "every folder is one layer"


def test_the_contracts_name_folders_never_modules() -> None:
    folders = {f"cloudtrain.{name}" for name in layer_folders()}
    named = set()
    for contract in contracts().values():
        for key in ("source_modules", "modules", "ancestors"):
            named.update(contract.get(key, []))
    assert named <= folders | {f"{f}.{c}" for f in ["cloudtrain.providers"] for c in CLOUDS}


CLOUDS = ("aws", "azure", "gcp", "local", "slurm")


def test_an_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    planted = {"state/planted_upward.py": "from cloudtrain.run import orchestrator\n"}
    proc = lint_imports(tmp_path, planted)
    report = proc.stdout + proc.stderr
    assert proc.returncode != 0, report
    assert "cloudtrain.state is not allowed to import cloudtrain.run" in report
    assert "cloudtrain.state.planted_upward -> cloudtrain.run.orchestrator" in report


def test_a_cycle_inside_a_folder_breaks_the_acyclic_contract(tmp_path: Path) -> None:
    planted = {
        "run/planted_a.py": "from cloudtrain.run import planted_b\n",
        "run/planted_b.py": "from cloudtrain.run import planted_a\n",
    }
    proc = lint_imports(tmp_path, planted)
    report = proc.stdout + proc.stderr
    assert proc.returncode != 0, report
    assert "No cycles are allowed in cloudtrain.run." in report
    assert re.search(r"\.planted_[ab] -> \.planted_[ab]", report), report


def test_every_package_folder_is_in_the_distribution() -> None:
    """pyproject lists packages by name (package-dir maps three folders): a folder missing there
    would be left out of a regular install's wheel."""
    listed = set(tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["packages"])
    roots = {"cloudtrain": ROOT / "cloudtrain", "cloudtrain.providers": ROOT / "providers"}
    roots["cloudtrain.jobs"] = ROOT / "jobs"
    found = set()
    for name, folder in roots.items():
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder).parts
            if "__pycache__" not in rel and not any(p.startswith(".") for p in rel):
                found.add(".".join((name, *rel)))
    assert found == listed


def checkout_only_imports(top: Path, root: Path = ROOT) -> list[str]:
    """`file:line module` for each import under `top` of a name that exists only in a checkout:
    `providers` and `jobs` are installed as cloudtrain.providers and cloudtrain.jobs
    (pyproject's package-dir), so such an import fails once cloudtrain is installed. Pure."""
    import ast

    found = []
    for path in sorted(top.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                if name.split(".")[0] in ("providers", "jobs"):
                    found.append(f"{path.relative_to(root)}:{node.lineno} {name}")
    return found


def test_modules_import_the_installed_package_names() -> None:
    tops = ("cloudtrain", "providers", "jobs")
    found = [i for top in tops for i in checkout_only_imports(ROOT / top)]
    assert found == [], found


def test_a_checkout_only_import_is_found(tmp_path: Path) -> None:
    (tmp_path / "providers").mkdir()
    planted = tmp_path / "providers" / "planted.py"
    planted.write_text(
        "import os\nfrom providers.local_sessions import NODE_ENV\nimport jobs.agent\n"
    )
    assert checkout_only_imports(tmp_path / "providers", tmp_path) == [
        "providers/planted.py:2 providers.local_sessions",
        "providers/planted.py:3 jobs.agent",
    ]
