"""The agent's output pump against hostile output of the training (issue 29): a Keras-like line
with a 5000-digit number, a non-finite loss, a 50 MB line without a newline, invalid UTF-8 and
NUL bytes. Real agents on a real LocalStore, real bash entrypoints writing into the real pipe:
the pipe is always drained (the job never blocks on a full pipe), a bad line is truncated or
kept as text, and a pump that fails anyway ends the node with a reason naming it."""

# ruff: noqa: F811 - the fixtures (`store`, `work`...) are agent_kit's, taken by name

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from cloudtrain.jobs.agent import Agent
from cloudtrain.jobs.logpump import MAX_LINE_BYTES, LogPump
from cloudtrain.jobs.metrics import KerasProgress
from cloudtrain.jobs.pipe_pump import PipePump
from cloudtrain.providers.local import LocalStore
from tests.unit.agent_kit import (
    HANG_S,
    PREFIX,
    RUN_ID,
    AgentThread,
    base_cluster,
    child_groups,  # noqa: F401 - an autouse fixture: imported, it applies here
    node_env,  # noqa: F401 - an autouse fixture: imported, it applies here
    put_json,
    read_logs,
    run_in_thread,  # noqa: F401 - a fixture, taken by name
    status_of,
    store,  # noqa: F401 - a fixture, taken by name
    wait_for,
    work,  # noqa: F401 - a fixture, taken by name
)

HUGE = "9" * 5000
# after the bad line, 2 MB more: far more than a pipe holds (64 KiB), so a pump that died on the
# bad line leaves the job blocked in write() and the node never reports
FLOOD = "head -c 2000000 /dev/zero | tr '\\0' 'y' | fold -w 100; echo; "


def _final(store: LocalStore, node: str = "chief-0") -> dict[str, object]:
    assert wait_for(lambda: status_of(store, node).get("state") in ("succeeded", "failed")), (
        f"no final status within {HANG_S} s: {status_of(store, node)}"
    )
    return status_of(store, node)


def _run(
    store: LocalStore, work: Path, run_in_thread: Callable[[Agent], AgentThread], entry: str
) -> dict[str, object]:
    put_json(store, "cluster.json", base_cluster(entrypoint=entry, linger_s=0.2))
    run_in_thread(Agent(RUN_ID, "chief", 0, store, work))
    return _final(store)


def test_a_5000_digit_epoch_line_neither_kills_the_pump_nor_blocks_the_job(
    store: LocalStore, work: Path, run_in_thread: Callable[[Agent], AgentThread]
) -> None:
    entry = (
        f"echo 'Epoch 1/{HUGE}'; echo 'cloudtrain: epoch 1/{HUGE} done'; "
        f"echo '12/12 [==============================] - 1s 5ms/step - loss: 1e999999'; "
        f"{FLOOD} echo the-end"
    )
    status = _run(store, work, run_in_thread, entry)
    assert status["state"] == "succeeded", status
    logs = read_logs(store, "chief-0")
    assert f"Epoch 1/{HUGE}" in logs and "the-end" in logs


def test_a_50_mb_line_without_a_newline_is_cut_and_the_job_goes_on(
    store: LocalStore, work: Path, run_in_thread: Callable[[Agent], AgentThread]
) -> None:
    entry = "head -c 50000000 /dev/zero | tr '\\0' 'x'; echo; echo after-the-long-line"
    status = _run(store, work, run_in_thread, entry)
    assert status["state"] == "succeeded", status
    logs = read_logs(store, "chief-0")
    assert "after-the-long-line" in logs
    assert len(logs) < 4 * MAX_LINE_BYTES, len(logs)
    assert "bytes cut" in logs


def test_invalid_utf8_and_nul_bytes_stay_text(
    store: LocalStore, work: Path, run_in_thread: Callable[[Agent], AgentThread]
) -> None:
    entry = "printf 'a\\377\\376b\\000c\\n'; printf 'Epoch 1/2\\000\\n'; echo ok-after"
    status = _run(store, work, run_in_thread, entry)
    assert status["state"] == "succeeded", status
    logs = read_logs(store, "chief-0")
    assert "a\ufffd\ufffdb\x00c" in logs and "ok-after" in logs


def test_a_failing_pump_ends_the_node_naming_it(
    store: LocalStore, work: Path, run_in_thread: Callable[[Agent], AgentThread]
) -> None:
    """A sink that raises (here the metrics parser, broken on purpose) must not leave the job
    blocked on a full pipe: the node fails with `log pump: ValueError ...`."""
    put_json(store, "cluster.json", base_cluster(entrypoint=f"echo boom; {FLOOD} sleep 300"))
    agent = Agent(RUN_ID, "chief", 0, store, work)

    def broken(line: str, now: float | None = None) -> None:
        if "boom" in line:
            raise ValueError("a parser bug")

    agent.metrics.log_line = broken  # type: ignore[method-assign]
    run_in_thread(agent)
    status = _final(store)
    assert status["state"] == "failed", status
    assert str(status.get("reason", "")).startswith("log pump: ValueError: a parser bug"), status


def test_the_pipe_pump_drains_to_the_end_after_a_sink_fails(tmp_path: Path) -> None:
    """Without an agent: the real PipePump on a real process's pipe. After the sink's error the
    rest of the output is read (the process ends on its own) and the failure is kept."""
    proc = subprocess.Popen(
        ["bash", "-c", f"echo first; {FLOOD} echo last"], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    seen: list[str] = []

    def sink(line: str) -> None:
        seen.append(line)
        raise OverflowError("int too large")

    pump = PipePump(proc.stdout, [sink], prefix="[p] ")
    pump.start()
    try:
        assert proc.wait(timeout=HANG_S) == 0
    finally:
        proc.kill()
    pump.join(HANG_S)
    assert not pump.is_alive()
    assert seen == ["[p] first\n"]
    assert pump.failure == "log pump: OverflowError: int too large"


def test_keras_progress_ignores_numbers_it_cannot_hold() -> None:
    keras = KerasProgress()
    assert keras.feed(f"Epoch 1/{HUGE}", 0.0) is None
    assert keras.feed(f"Epoch {HUGE}/2", 0.0) is None
    assert keras.feed("Epoch 1/2", 0.0) is None
    line = f"12/12 [====] - 1s {HUGE}ms/step - loss: 1e999999 - acc: nan"
    assert keras.feed(line, 0.0) is None  # a step time of 5000 digits is no Keras line
    record = keras.feed("12/12 [====] - 1s 5ms/step - loss: 1e999999 - acc: nan", 1.0)
    assert record is not None and record["loss"] is None and record["metrics"] == {}


def test_the_log_pump_keeps_no_epoch_it_cannot_hold(store: LocalStore) -> None:
    pump = LogPump(store, PREFIX + "logs/chief-0/", 0)
    pump.add(f"Epoch 1/{HUGE}")
    pump.add(f"cloudtrain: epoch {HUGE}/3 done")
    assert pump.epoch is None
    pump.add("Epoch 2/3")
    assert pump.epoch == (2, 3)


def test_a_console_that_cannot_take_a_line_does_not_stop_the_stream(store: LocalStore) -> None:
    """The pump echoes each line to the agent's stdout (the node's console): a console that
    cannot take it (closed, or an encoding without U+FFFD) must not stop the stream."""
    pump = LogPump(store, PREFIX + "logs/chief-0/", 0)
    ascii_out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    old = sys.stdout
    sys.stdout = ascii_out
    try:
        pump.add("caf\ufffd")
    finally:
        sys.stdout = old
    pump.flush()
    assert "caf\ufffd" in read_logs(store, "chief-0")
