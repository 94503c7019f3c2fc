"""A job that prints a flood of lines (issue 29). On a terminal the live view printed every line
before the watch judged the chief's end: 200,000 lines a worker held the end of the run for about
a minute of billed idle nodes. The watch now shows the last lines of each poll, says how many it
left out (`cloudtrain logs` has them all), and sees the end at once.
"""

from __future__ import annotations

import re

import pytest

from tests.e2e.conftest import Env, assert_clean
from tests.e2e.node_input_kit import on_terminal

pytestmark = pytest.mark.e2e
FLOOD = 200_000
JOB = f"""\
import sys
out = sys.stdout
for i in range({FLOOD}):
    out.write(f"line {{i}} of a chatty job\\n")
out.flush()
"""


def test_a_flood_of_lines_is_shown_bounded_and_nothing_is_lost(ct: Env) -> None:
    job = ct.tick_job("chatty")
    (job.parent / "chatty.py").write_text(JOB)
    job.write_text(job.read_text().replace("python tick.py 200 0.5", "python chatty.py"))
    result = on_terminal(ct, "run", str(job), bound=600)
    code, out = result.code, result.text
    assert code == 0, out[-4000:]
    run_id = ct.run_ids()[0]
    shown = len(re.findall(r"line \d+ of a chatty job", out))
    # the two workers printed 2 * FLOOD lines; each poll shows 200 at most (a poll a second or
    # so while they print): before, the live view printed most of them (87,059 in one run)
    assert shown < 10_000, shown
    assert re.search(r"\d+ lines not shown", out), out[-3000:]
    assert f"cloudtrain logs {run_id}` has them all" in out
    assert_clean(ct, run_id)
    logs = ct.cli("logs", run_id, "--node", "worker-1", timeout=300)
    assert logs.stdout.count("of a chatty job") == FLOOD  # nothing is lost, only not shown
