"""Node ports per worker, and the suite's last check: nothing of it is left on this machine
(issue 16).

After every test and fixture has been torn down, `pytest_sessionfinish` asks
tests/fakes/netns.leftovers() for `ctb*` namespaces, links and /etc/netns folders, mounts under a
"/ctb-" path and processes inside a `ctb*` namespace. If anything is left, it is listed and the
session fails (exit status 1) even when every test passed. What another live process owns (a
test session running beside this one, see netns.claim) is not this session's leftover.
"""

from __future__ import annotations

import os
import shutil

import pytest

from cloudtrain.providers.local_sessions import PORTS_ENV, _port_range
from tests.fakes.port_slices import worker_slice


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist, this worker's node ports come from its own slice (tests/fakes/port_slices)."""
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
