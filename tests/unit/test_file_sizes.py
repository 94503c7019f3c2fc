"""No Python file of the program or its tests is over 600 lines (the project's style rule: small
modules with one job). A file that grows past it is split by job, not raised a limit for."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CAP = 600
# the tests' own virtual environments and node packages are not ours
NOT_OURS = ("tests/.venvs/", "tests/.azurite/")


def over_cap(files: Iterable[Path], cap: int = CAP) -> list[str]:
    """`path: N lines` for each file longer than `cap` lines. Reads the files."""
    found = []
    for path in files:
        lines = len(path.read_text(encoding="utf-8", errors="replace").splitlines())
        if lines > cap:
            found.append(f"{path}: {lines} lines")
    return found


def our_python_files() -> list[Path]:
    """cloudtrain/, providers/, jobs/ and tests/ Python files, but the tests' environments."""
    files = []
    for top in ("cloudtrain", "providers", "jobs", "tests"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not rel.startswith(NOT_OURS) and "__pycache__" not in rel:
                files.append(path)
    return files


def test_a_planted_long_file_is_found(tmp_path: Path) -> None:
    long = tmp_path / "long.py"
    long.write_text("x = 1\n" * (CAP + 1))
    short = tmp_path / "short.py"
    short.write_text("x = 1\n" * CAP)
    assert over_cap([long, short]) == [f"{long}: {CAP + 1} lines"]
    assert len(our_python_files()) > 500


def test_no_python_file_is_over_the_cap() -> None:
    assert over_cap(our_python_files()) == [], "split the file by job"
