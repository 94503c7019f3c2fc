"""The suite's files reach its workers longest first (tests/suite_order.py, tests/conftest.py),
so that no long end-to-end file starts last while the other worker has nothing left to do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from cloudtrain.providers.local_sessions import PORTS_ENV
from tests.conftest import pytest_configure
from tests.suite_order import (
    UNKNOWN_E2E_S,
    file_seconds,
    order_files,
    read_table,
)

REPO = Path(__file__).resolve().parents[2]


def _pytest(cwd: Path, *args: str, check: bool = True, **env: str) -> str:
    """Run pytest ARGS in `cwd` as a session of its own (no PYTEST_* of this one's, `env`
    added); its output, once it passed (`check`: a collection in this repository can end in
    tests/conftest.py's leftovers error while another session's box runs)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 or not check, done.stdout + done.stderr
    return done.stdout


def test_longest_first_new_e2e_files_early_ties_in_given_order() -> None:
    table = {"tests/unit/a.py": 3.0, "tests/e2e/test_b.py": 400.0, "tests/unit/c.py": 3.0}
    table["tests/unit/long.py"] = UNKNOWN_E2E_S + 1
    given = ["tests/unit/a.py", "tests/unit/new.py", "tests/unit/c.py", "tests/e2e/test_new.py"]
    given += ["tests/unit/long.py", "tests/e2e/test_b.py", "tests/unit/a.py"]
    assert order_files(given, table) == [
        "tests/e2e/test_b.py",
        "tests/unit/long.py",
        "tests/e2e/test_new.py",  # not measured yet: taken for a long one
        "tests/unit/a.py",
        "tests/unit/c.py",
        "tests/unit/new.py",  # not measured yet: taken for a short one
    ]


def test_the_committed_table_reads_and_names_the_e2e_files() -> None:
    table = read_table()
    assert len(table) > 100, len(table)
    slowest = max(table, key=lambda p: table[p])
    assert slowest.startswith("tests/") and slowest.endswith(".py"), slowest


def test_seconds_per_file_from_a_real_junit_report(tmp_path: Path) -> None:
    """pytest itself writes the report the table is made from: a module and a class in it."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    folder = tmp_path / "tests" / "unit"
    folder.mkdir(parents=True)
    (folder / "test_two.py").write_text(
        "import time\n"
        "def test_a():\n    time.sleep(0.2)\n"
        "class TestB:\n    def test_b(self):\n        time.sleep(0.3)\n"
    )
    (folder / "test_one.py").write_text("def test_c():\n    pass\n")
    report = tmp_path / "report.xml"
    _pytest(tmp_path, "-p", "no:xdist", "--rootdir", str(tmp_path), f"--junitxml={report}", "tests")
    got = file_seconds(report)
    assert set(got) == {"tests/unit/test_two.py", "tests/unit/test_one.py"}, got
    assert got["tests/unit/test_two.py"] >= 0.5
    assert got["tests/unit/test_one.py"] < 0.5


def test_a_worker_collects_the_longest_file_first() -> None:
    """Under xdist (a worker's $PYTEST_XDIST_WORKER), the conftest hook reorders the files:
    named short one first, the e2e one still comes first."""
    table = read_table()
    short, long = "tests/unit/test_python_gate.py", "tests/e2e/test_scale.py"
    assert table.get(long, UNKNOWN_E2E_S) > table.get(short, 0.0)

    def collected(worker: str | None) -> list[str]:
        extra = {"PYTEST_XDIST_WORKER": worker} if worker else {}
        out = _pytest(REPO, "--collect-only", "-n", "0", short, long, check=False, **extra)
        ids = [line for line in out.splitlines() if "::" in line]
        return list(dict.fromkeys(i.split("::", 1)[0] for i in ids))

    assert collected(None) == [short, long]  # not under xdist: as given
    assert collected("gw0") == [long, short]


def test_loadfile_keeps_the_collection_order(
    pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """xdist's own most-tests-first order is off under --dist loadfile (the option the
    conftest sets is xdist's), left alone under another mode."""
    monkeypatch.setenv(PORTS_ENV, "20000-20100")  # the conftest's port slicing: nothing to do
    assert pytestconfig.getoption("loadscopereorder") in (True, False)  # xdist's option name
    for dist, want in (("loadfile", False), ("loadscope", True), ("no", True)):
        config = SimpleNamespace(option=SimpleNamespace(dist=dist, loadscopereorder=True))
        pytest_configure(config)  # type: ignore[arg-type]
        assert config.option.loadscopereorder is want, dist
