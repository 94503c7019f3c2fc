"""The Python-version gate for node-side code: what runs on a node must run on the Pythons the
clouds' images ship, from 3.10 (Ubuntu 22.04: the AWS DLAMI, GCP's DLVM ubuntu-2204 and Azure's
Ubuntu 22.04 images) upward.

`node_side_files()` is the node's import closure, found statically: every module that the node's
entry points (the agent, the training runtime, the preemption watcher, Horovod's launcher) import,
anywhere in their files (also inside functions), plus the provider packages the registry loads by
name (`open_store` builds a provider to open its bucket), and so on transitively. A module reached
only by the controller is not in it: the controller may use 3.11.

`violations(files)` runs vermin (the tool made for this: it knows the standard library's API by
version, members and keyword arguments included) with 3.10 as the target and returns its report
lines for anything newer. Vermin must be installed (tests/run.sh installs the dev extras): a
missing vermin is an error here, never a pass.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the setuptools package-dir mapping of pyproject.toml: import name -> folder
PACKAGE_DIRS = {
    "cloudtrain.providers": ROOT / "providers",
    "cloudtrain.jobs": ROOT / "jobs",
    "cloudtrain": ROOT / "cloudtrain",
}
NODE_ENTRY_POINTS = (
    "cloudtrain.jobs.agent",  # started by the startup script
    "cloudtrain.jobs.runtime",  # imported by the user's train.py
    "cloudtrain.jobs.preemption",
    "cloudtrain.jobs.horovod",
    "cloudtrain.jobs.tf_config",
    # the controller node's process (issue 17), started by the startup script of a node of role
    # controller on the image's Python: the controller's whole watch loop runs on 3.10 there
    "cloudtrain.managed.controller_node",
    # the Slurm provider's bucket, served on the cluster by its Python (issue 33)
    "cloudtrain.providers.slurm.folder_serve",
)
MIN_NODE_PYTHON = "3.10"
# a dotted module name, or a "module:attr" reference (a ProviderInfo field: providers/info.py)
_DOTTED = re.compile(r"^(cloudtrain(?:\.[a-z_][a-z0-9_]*)+)(?::[A-Za-z_][A-Za-z0-9_.]*)?$")


def module_file(name: str) -> Path | None:
    """The source file of a cloudtrain module or package, or None (not ours, or missing)."""
    for prefix, folder in PACKAGE_DIRS.items():  # the longest prefixes first
        if name == prefix:
            candidates = [folder / "__init__.py"]
        elif name.startswith(prefix + "."):
            base = folder.joinpath(*name[len(prefix) + 1 :].split("."))
            candidates = [base.with_suffix(".py"), base / "__init__.py"]
        else:
            continue
        return next((path for path in candidates if path.is_file()), None)
    return None


def _imports(path: Path, module: str) -> set[str]:
    """The cloudtrain modules a file names: imports anywhere in it, and dotted `cloudtrain.x`
    strings (the provider registry loads modules by name)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import mod`
        elif isinstance(node, ast.Constant) and (dotted := _DOTTED.match(str(node.value))):
            found.add(dotted[1])
    return {name for name in found if name == "cloudtrain" or name.startswith("cloudtrain.")}


def node_side_files(entry_points: tuple[str, ...] = NODE_ENTRY_POINTS) -> list[Path]:
    """Every source file in the node's import closure (packages bring their __init__). Pure."""
    seen: dict[str, Path] = {}
    todo = list(entry_points)
    while todo:
        name = todo.pop()
        parts = name.split(".")
        # importing a.b.c runs a/__init__ and a/b/__init__ first
        for i in range(1, len(parts) + 1):
            sub = ".".join(parts[:i])
            if sub in seen:
                continue
            path = module_file(sub)
            if path is None:
                continue
            seen[sub] = path
            todo.extend(_imports(path, sub))
    return sorted(set(seen.values()))


def violations(files: list[Path], target: str = MIN_NODE_PYTHON) -> list[str]:
    """Vermin's report of every construct in `files` that needs a Python newer than `target`;
    empty when all of them run on it. Raises RuntimeError when vermin cannot run."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, vermin; sys.exit(vermin.main())",
            f"--target={target}-",
            "--violations",
            "--no-tips",
            "--no-parse-comments",
            *map(str, files),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    if "No module named 'vermin'" in out:
        raise RuntimeError("vermin is not installed: pip install -e '.[dev]'")
    if proc.returncode == 0:
        return []
    report = [line for line in out.splitlines() if "requires" in line]
    if not report:
        raise RuntimeError(f"vermin failed without a report (exit {proc.returncode}):\n{out}")
    return report
