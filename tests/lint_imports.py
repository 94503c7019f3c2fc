"""`lint-imports` over this repo as it is installed: `python3 -m tests.lint_imports [ARGS]`.

The packages cloudtrain.providers and cloudtrain.jobs live in providers/ and jobs/ (pyproject's
package-dir), where import-linter's module discovery (grimp walks the root package's one folder)
does not look: a bare `lint-imports` in the repo root sees cloudtrain/ alone and fails on the
contracts that name them. So the check runs on a shadow tree: a cloudtrain/ folder of symlinks
to every entry of the real one, plus providers/ and jobs/, with pyproject.toml's contracts.
Extra ARGS go to `lint-imports` (`--no-cache` is always passed). The exit status is its own.
`tests/unit/test_layers.py` plants modules in the tree (`planted`) to show a contract breaks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"


def _link_entries(real: Path, into: Path) -> None:
    for entry in real.iterdir():
        if entry.name != "__pycache__":
            (into / entry.name).symlink_to(entry)


def shadow_tree(folder: Path, planted: dict[str, str] | None = None) -> Path:
    """Fill `folder` with a `cloudtrain` package that contains providers/ and jobs/ (symlinks),
    plus `planted` modules (path under cloudtrain/ -> source) in real copies of their folders.
    Returns `folder`. Touches nothing of the repo."""
    package = folder / "cloudtrain"
    package.mkdir()
    _link_entries(ROOT / "cloudtrain", package)
    (package / "providers").symlink_to(ROOT / "providers")
    (package / "jobs").symlink_to(ROOT / "jobs")
    for rel, source in (planted or {}).items():
        parent = package / Path(rel).parent
        if parent.is_symlink():  # a real folder of links to the real one's entries
            real = parent.resolve()
            parent.unlink()
            parent.mkdir()
            _link_entries(real, parent)
        (package / rel).write_text(source)
    return folder


def lint_imports(
    folder: Path,
    planted: dict[str, str] | None = None,
    args: Sequence[str] = (),
    capture: bool = True,
) -> subprocess.CompletedProcess[str]:
    """`lint-imports --no-cache ARGS` with pyproject.toml's contracts over a shadow tree made in
    `folder` (empty), output captured unless `capture` is false. Blocks."""
    shadow = shadow_tree(folder, planted)
    env = {**os.environ, "PYTHONPATH": str(shadow)}
    code = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run(
        [sys.executable, "-c", code, "--no-cache", *args, str(PYPROJECT)],
        cwd=shadow,
        env=env,
        capture_output=capture,
        text=True,
        timeout=300,
    )


def main(argv: Sequence[str]) -> int:
    """Run the check over a throw-away shadow tree; the exit status is lint-imports'."""
    with tempfile.TemporaryDirectory(prefix="ct-lint-imports-") as folder:
        return lint_imports(Path(folder), args=argv, capture=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
