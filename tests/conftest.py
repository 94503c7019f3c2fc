"""Node ports per worker, the files longest first (tests/suite_order.py), no test leaving a
cloud's credential variables behind, and the suite's last check: nothing of it is left on this
machine (issue 16).

After every test and fixture has been torn down, `pytest_sessionfinish` asks
tests/fakes/netns.leftovers() for `ctb*` namespaces, links and /etc/netns folders, mounts under a
"/ctb-" path and processes inside a `ctb*` namespace. If anything is left, it is listed and the
session fails (exit status 1) even when every test passed. What another live process owns (a
test session running beside this one, see netns.claim) is not this session's leftover.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from cloudtrain.providers.local_sessions import PORTS_ENV, _port_range
from tests.fakes.port_slices import worker_slice


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist, this worker's node ports come from its own slice (tests/fakes/port_slices).
    With `--dist loadfile`, the files go to the workers in the collection's order (which
    `pytest_collection_modifyitems` below sets: longest first), not xdist's most-tests-first,
    which started the long end-to-end files (few tests each) last (tests/suite_order.py)."""
    if getattr(config.option, "dist", None) == "loadfile":
        config.option.loadscopereorder = False  # as --no-loadscope-reorder
    if PORTS_ENV in os.environ:  # set by whoever runs the suite: theirs to split
        return
    low, high = _port_range()
    got = worker_slice(
        os.environ.get("PYTEST_XDIST_WORKER"),
        int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")),
        low,
        high + 1,
    )
    if got is not None:
        os.environ[PORTS_ENV] = f"{got[0]}-{got[1]}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under xdist, the files in tests/suite_order.py's order (the longest first, each file's
    tests in their own order): xdist's reorder off (`pytest_configure`), this is the order the
    workers take the files in. Not under xdist, the collection's order is kept."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from tests.suite_order import order_files, read_table

    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    items[:] = [item for path in order_files(by_file, read_table()) for item in by_file[path]]


def _credential_variables() -> tuple[str, ...]:
    """Every variable a cloud's credential chain reads (`ProviderInfo.credential_env`), the ones
    that `plan` looks at to decide whether to ask an account (loading that cloud's SDK)."""
    from cloudtrain.providers.registry import infos

    return tuple(
        dict.fromkeys(n for i in infos() for n in (*i.credential_env, "AWS_SECRET_ACCESS_KEY"))
    )


@pytest.fixture(autouse=True)
def _no_credentials_left_behind() -> Iterator[None]:
    """Fail the test that changes a cloud's credential variables in this process and leaves them
    so: the tests after it in this worker would see an account (one did: `plan` on `cheapest`
    loaded botocore in CI, after a test whose monkeypatch restored moto's fake keys). Set up
    before the test's own fixtures, so checked after they are undone."""
    names = _credential_variables()
    before = {n: os.environ.get(n) for n in names}
    yield
    after = {n: os.environ.get(n) for n in names}
    changed = sorted(n for n in names if before[n] != after[n])
    for name in changed:  # put back, so that one leak fails one test, not the ones after it
        if before[name] is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before[name]  # type: ignore[assignment]
    assert not changed, f"the test left these credential variables changed: {changed}"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session if it left namespaces, links, mounts or processes behind."""
    if shutil.which("ip") is None:  # no iproute2: nothing of the kind can have been made
        return
    from tests.fakes.netns import leftovers

    left = leftovers(skip_live_owners=True)
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"error: the test session left {len(left)} thing(s) on this machine:"]
    lines += [f"  {item}" for item in left]
    if reporter is not None:
        reporter.ensure_newline()
    for line in lines:
        if reporter is not None:
            reporter.write_line(line, red=True, bold=True)
        else:
            print(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
