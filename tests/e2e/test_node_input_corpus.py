"""The corpus of node-originated input (issue 29), end to end through the real CLI on `local`.

Everything a node writes (its printed lines, its metrics file, what its user code puts in the
run's bucket prefix) is untrusted. Each test is one tiny local run without TensorFlow that
carries several hostile inputs at once, and then goes through `run` (on a pseudo-terminal,
`--json` or plain), `status`, `status --json`, `logs`, `report` and `down`. For every command:
the expected exit code, no traceback, an end within its bound (node_input_kit.BOUND_S), no
payload of the node's on a terminal; after the run: teardown done, no process left, and nothing
outside the run deleted (another run's bucket objects and node folder beside it survive `down`).

The classes, and the test that holds each:
  1. forged control/records (lease, journal entry, yield):  test_bucket_documents
  2. crash inputs: markup (test_terminal_output), non-finite and huge numbers in the metrics
     file and Keras lines (test_numbers_and_long_line), nested JSON, a wrongly typed log index,
     a FIFO and a symlink loop in the prefix (test_bucket_documents)
  3. hangs: a 5000-digit Keras line then a flood (test_terminal_output), a 24 MB line with no
     newline (test_numbers_and_long_line)
  4. unbounded reads: 65 MiB documents, a trace of 100,000 spans (test_bucket_documents)
  5. terminal control: OSC 0/52/8, CSI 2J, cursor moves, CSI 6n, C1 CSI (test_terminal_output)
  6. invalid JSON: NaN/Infinity for `run --json`, `status --json` (test_numbers_and_long_line)
  7. escaping processes: a setsid'd daemon of the job (test_terminal_output)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from cloudtrain.core.procid import stat_fields
from cloudtrain.jobs.protocol import journal_prefix
from cloudtrain.state.journal import entry_key
from tests.e2e.conftest import Env, assert_clean
from tests.e2e.node_input_kit import (
    BOUND_S,
    MARKUP_PAYLOADS,
    TERMINAL_PAYLOADS,
    Piped,
    Result,
    assert_no_payload,
    check,
    large_document,
    nested,
    on_terminal,
    one_node_job,
    piped,
    plant,
    strict_json,
)

pytestmark = pytest.mark.e2e

OTHER_RUN = "other-0a0b0c"  # a run beside the corpus's: nothing of it may go
OTHER_NODE = f"ct-{OTHER_RUN}-chief-0"
OVER_EVERY_CAP = 65 * 1024 * 1024  # the largest cap is a log segment's 64 MiB


def _sentinels(ct: Env) -> list[Path]:
    """Another run's bucket object and node folder (its disk, its record), made beside the
    corpus's run: a forged ledger entry names that node, so a replayed one would delete it."""
    node = ct.home / "local" / "runs" / OTHER_RUN / "nodes" / OTHER_NODE
    meta = plant(node / "node.json", json.dumps({"pid": 2**22 + 7, "token": "x"}).encode())
    return [
        plant(ct.bucket / OTHER_RUN / "checkpoints" / "keep.bin", b"another run's checkpoint"),
        plant(node / "disk" / "keep.txt", b"another run's disk"),
        meta,
    ]


def _assert_survived(sentinels: list[Path], contents: dict[Path, bytes], case: str) -> None:
    for path in sentinels:
        assert path.exists(), f"[{case}] {path} outside the run was deleted"
        assert path.read_bytes() == contents[path], f"[{case}] {path} outside the run changed"


def _after_the_run(ct: Env, run_id: str, case: str, sentinels: list[Path]) -> dict[str, Result]:
    """`status`, `status --json`, `logs` (on a terminal, and `--raw` into a pipe), `report` and
    `down` of the ended run, each checked (exit 0, no traceback, within its bound, no node
    payload on a terminal, strict JSON); then teardown done and the sentinels whole."""
    contents = {p: p.read_bytes() for p in sentinels}
    got = {
        "status": on_terminal(ct, "status", run_id, bound=BOUND_S["status"]),
        "status --json": piped(ct, "status", run_id, "--json", bound=BOUND_S["status"]),
        "logs": on_terminal(ct, "logs", run_id, bound=BOUND_S["logs"]),
        "logs --raw": piped(ct, "logs", run_id, "--raw", bound=BOUND_S["logs"]),
    }
    html = ct.home / f"{run_id}-report.html"
    got["report"] = piped(ct, "report", run_id, "--html", str(html), bound=BOUND_S["report"])
    got["down"] = piped(ct, "down", run_id, bound=BOUND_S["down"])
    for result in got.values():
        check(result, case)
    for name in ("status", "logs"):
        for payload_name, payload in TERMINAL_PAYLOADS.items():
            if payload_name != "osc8-link":  # rich's own links are checked by the prefix
                assert payload not in got[name].out, f"[{case}] {name}: {payload_name} shown"
        assert b"\x1b]8;" not in got[name].out, f"[{case}] {name}: a hyperlink reached it"
    try:
        strict_json(got["status --json"].out)
    except ValueError as exc:
        raise AssertionError(f"[{case}] status --json is not strict JSON: {exc}") from None
    assert html.stat().st_size > 0, f"[{case}] report wrote no page"
    assert "nothing of it is left" in got["down"].text, f"[{case}] {got['down'].text}"
    assert_clean(ct, run_id)
    _assert_survived(sentinels, contents, case)
    return got


# --- classes 5, 2 (markup), 3 (a huge Keras number, then a flood) and 7 -----------------------

TERMINAL_JOB = f"""\
import subprocess, sys, time
from pathlib import Path

pidfile = Path(sys.argv[1])
subprocess.Popen(
    ["setsid", "sh", "-c", 'echo $$ > "$0.tmp" && mv "$0.tmp" "$0"; exec sleep 600', str(pidfile)],
    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
while not pidfile.exists():  # the daemon is up before the job goes on
    time.sleep(0.02)
out = sys.stdout.buffer
big = b"9" * 5000
out.write(b"Epoch 1/1\\n" + big + b"/" + big + b" - 1s - loss: " + big + b" - 5ms/step\\n")
for i in range(20000):
    out.write(b"after the big number %d\\n" % i)
for name, payload in {TERMINAL_PAYLOADS!r}.items():
    out.write(b"case " + name.encode() + b": " + payload + b"\\n")
for name, markup in {MARKUP_PAYLOADS!r}.items():
    out.write(b"case " + name.encode() + b": " + markup.encode() + b"\\n")
out.write(b"ct-job-done\\n")
out.flush()
"""


def _alive(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def test_terminal_output(ct: Env, tmp_path: Path) -> None:
    sentinels = _sentinels(ct)
    pidfile = tmp_path / "daemon.pid"
    job = one_node_job(ct, "terminal", TERMINAL_JOB, entrypoint=f"python job.py {pidfile}")
    daemon = 0
    try:
        run = on_terminal(ct, "run", str(job), bound=BOUND_S["run"])
        daemon = int(pidfile.read_text()) if pidfile.exists() else 0
        check(run, "terminal: run on a terminal")
        assert_no_payload(run, "terminal: run on a terminal")
        for name in [*TERMINAL_PAYLOADS, *MARKUP_PAYLOADS]:  # each line was shown, as text
            assert f"case {name}: ".encode() in run.out, f"[{name}] its line was not shown"
        assert b"ct-styled" in run.out and b"ct-job-done" in run.out, run.text[-3000:]
        assert daemon, "[setsid-daemon] the job's daemon never started"
        assert not _alive(daemon), "[setsid-daemon] the job's daemon outlived the run"
        run_id = ct.run_ids()[0]
        got = _after_the_run(ct, run_id, "terminal", sentinels)
        logs, raw = got["logs"].out, got["logs --raw"].out
        for name in [*TERMINAL_PAYLOADS, *MARKUP_PAYLOADS]:
            assert f"case {name}: ".encode() in logs, f"[{name}] not in `logs` on a terminal"
        assert logs.count(b"after the big number") == 20000, "[keras-5000-digits] lines lost"
        for name, payload in TERMINAL_PAYLOADS.items():  # the payloads really were printed
            if name != "c1-csi-byte":  # not UTF-8: the agent reads the stream as UTF-8 text
                assert payload in raw, f"[{name}] `logs --raw` into a pipe lost {payload!r}"
    finally:
        if daemon and _alive(daemon):
            with contextlib.suppress(ProcessLookupError):
                os.kill(daemon, signal.SIGKILL)


# --- classes 2 (numbers), 3 (a long line) and 6 ------------------------------------------------

NUMBERS_JOB = """\
import json, os, sys, time
from pathlib import Path

release = Path(sys.argv[1])
now = time.time()
sane = {"time": now, "kind": "epoch", "epoch": 1, "seconds": 2.0, "loss": 0.5,
        "examples_per_s": 100.0, "steps_per_s": 10.0, "source": "runtime"}
hostile = [
    '{"time": %r, "kind": "epoch", "epoch": 2, "loss": NaN, "examples_per_s": Infinity}' % now,
    '{"time": %r, "kind": "epoch", "epoch": 3, "loss": 1e999, "seconds": -1e999}' % now,
    '{"time": %r, "kind": "window", "examples_per_s": %s, "steps_per_s": 1e308}' % (now, "9" * 400),
    '{"time": %r, "kind": "epoch", "epoch": %s, "steps": %s}' % (now, "9" * 5000, "9" * 30),
    '{"time": 1e999, "kind": "process", "cpu_percent": NaN, "rss_bytes": -Infinity}',
    '{"time": %r, "kind": "gpu", "gpus": [{"index": 0, "util_percent": NaN}]}' % now,
    '{"time": %r, "kind": "epoch", "metrics": %s}' % (now, "[" * 5000 + "]" * 5000),
]
with open(os.environ["CLOUDTRAIN_METRICS_FILE"], "a") as f:
    f.write(json.dumps(sane) + "\\n" + "\\n".join(hostile) + "\\n")
print("Epoch 1/3", flush=True)
print("10/10 - 1s - loss: nan - accuracy: inf - 100ms/step", flush=True)
print("Epoch 2/3", flush=True)
print("10/10 - 1s - loss: 1e999 - accuracy: -inf - " + "9" * 300 + "ms/step", flush=True)
print("Epoch 3/3", flush=True)
print("10/10 - 99999999999999999999999s - loss: -0.0 - 1e-320ms/step", flush=True)
sys.stdout.write("y" * (24 * 1024 * 1024))  # tens of MB, no newline
sys.stdout.flush()
while not release.exists():
    time.sleep(0.05)
"""


def _heartbeat_figures(ct: Env, run_id: str) -> dict[str, object]:
    """The chief's last heartbeat's figures in the bucket ({} before one parses)."""
    with contextlib.suppress(OSError, ValueError):
        figures = ct.heartbeat(run_id, "chief-0").get("metrics")
        return figures if isinstance(figures, dict) else {}
    return {}


def test_numbers_and_long_line(ct: Env, tmp_path: Path) -> None:
    sentinels = _sentinels(ct)
    release = tmp_path / "release"
    job = one_node_job(ct, "numbers", NUMBERS_JOB, entrypoint=f"python job.py {release}")
    run = Piped(ct, "run", "--json", str(job))
    try:
        deadline = time.monotonic() + 120
        while not (ct.run_ids() and _heartbeat_figures(ct, ct.run_ids()[0]).get("source")):
            assert run.proc.poll() is None, run.output()[-4000:]
            assert time.monotonic() < deadline, "[metrics-file] no heartbeat took the figures"
            time.sleep(0.1)
    finally:
        release.touch()
    result = run.wait(BOUND_S["run"])
    check(result, "numbers: run --json")
    try:
        summary = strict_json(result.out)
    except ValueError as exc:
        raise AssertionError(f"[run --json NaN/Infinity] not strict JSON: {exc}") from None
    assert summary["outcome"] == "succeeded", summary
    run_id = ct.run_ids()[0]
    got = _after_the_run(ct, run_id, "numbers", sentinels)
    raw = got["logs --raw"].out  # the line's head and tail are kept, the middle cut and said
    assert b"y" * 60_000 in raw, "[24-MB-line] its head is not in `logs --raw`"
    assert re.search(rb"\[\.\.\. \d+ bytes cut \.\.\.\]", raw), "[24-MB-line] the cut not said"
    assert len(raw) < 1024 * 1024, f"[24-MB-line] `logs --raw` printed {len(raw)} bytes"


# --- classes 1, 2 (documents, FIFO, symlink loop, log index) and 4 ------------------------------

WAITING_JOB = """\
import sys, time
from pathlib import Path

print("ct-ready", flush=True)
while not Path(sys.argv[1]).exists():
    time.sleep(0.05)
print("ct-job-done", flush=True)
"""


def _forge_journal(prefix: Path) -> None:
    """Entries a node puts under the run's ledger/: a resource of another run, a success."""
    now = time.time_ns()
    forged = [
        {
            "op": "record_intent",
            "at": time.time(),
            "run_id": prefix.name,
            "provider": "local",
            "kind": "node",
            "resource_id": OTHER_NODE,
            "region": "local",
            "cloud_id": None,
            "price_hourly": 0.0,
        },
        {
            "op": "set_status",
            "at": time.time(),
            "run_id": prefix.name,
            "status": "stopping",
            "outcome": "failed",
            "detail": "ct-forged-by-a-node",
        },
    ]
    for seq, entry in enumerate(forged, start=900):
        key = journal_prefix(prefix.name) + entry_key(now + seq, seq, "node")
        plant(prefix.parent.parent.parent / key, json.dumps(entry).encode())


def _plant_live(prefix: Path) -> dict[str, str]:
    """While the run is live: what each poll or the lease reads. Returns case -> the text the
    run's output must show for it (its warning), so the test waits until each was met."""
    # first what is no object (a FIFO, a symlink loop: nothing is said of them), then the
    # documents a poll warns of: the poll that warns read worker-1's keys too
    (prefix / "notice").mkdir(exist_ok=True)
    os.mkfifo(prefix / "notice" / "worker-1.json")
    (prefix / "status" / "worker-1.json").unlink(missing_ok=True)
    (prefix / "status" / "worker-1.json").symlink_to("worker-1.json")  # a loop
    forged_lease = {"owner": "attach:evil", "term": 99, "expires": time.time() + 3600}
    plant(prefix / "control" / "lease", json.dumps({**forged_lease, "version": 1}).encode())
    plant(prefix / "control" / "yield", b"attach:evil")
    _forge_journal(prefix)
    plant(prefix / "status" / "worker-0.json", nested(100_000))
    plant(prefix / "notice" / "worker-0.json", large_document(OVER_EVERY_CAP))
    return {
        "forged-lease": "written without the run's key",
        "nested-status": f"{prefix.name}/status/worker-0.json",
        "large-notice": f"{prefix.name}/notice/worker-0.json",
    }


def _trace(node: str, spans: int) -> bytes:
    start = time.time() - 60
    body = [
        {"name": f"s{i}", "start": start, "end": start + 1, "node": node, "attempt": 1}
        for i in range(spans)
    ]
    return json.dumps({"version": 1, "node": node, "spans": body}).encode()


def _plant_after(prefix: Path) -> None:
    """After the run, what `status`, `logs` and `report` read (a node may write until its end)."""
    plant(prefix / "heartbeat" / "worker-0.json", large_document(OVER_EVERY_CAP))
    plant(prefix / "trace" / "worker-0.json", _trace("worker-0", 100_000))
    plant(prefix / "trace" / "worker-9.json", large_document(OVER_EVERY_CAP))
    (prefix / "trace" / "worker-1.json").unlink(missing_ok=True)
    (prefix / "trace" / "worker-1.json").symlink_to("worker-1.json")
    for node in ("worker-0", "worker-1"):
        (prefix / "metrics" / node).mkdir(parents=True, exist_ok=True)
    os.mkfifo(prefix / "metrics" / "worker-0" / "00009998.jsonl")
    (prefix / "metrics" / "worker-1" / "00009999.jsonl").symlink_to("00009999.jsonl")
    bad = b'{"time": NaN, "kind": "epoch"}\n{"time": 1, "kind": "epoch", "loss": 1e999}\n'
    plant(prefix / "metrics" / "worker-0" / "00009997.jsonl", bad + nested(10_000) + b"\n")
    segments = [{"first_seq": "0", "last_seq": [1], "first_line": None, "lines": -1, "key": 5}]
    plant(prefix / "logs" / "worker-0" / "index.json", json.dumps({"segments": segments}).encode())
    plant(prefix / "logs" / "worker-1" / "index.json", b'{"segments": {"a": 1}, "node": 7}')


def test_bucket_documents(ct: Env, tmp_path: Path) -> None:
    sentinels = _sentinels(ct)
    release = tmp_path / "release"
    job = one_node_job(
        ct,
        "documents",
        WAITING_JOB,
        entrypoint=f"python job.py {release}",
        cluster={"strategy": "multi_worker_mirrored", "workers": 2},
    )
    ct.env["CLOUDTRAIN_LEASE_TTL_S"] = "4"  # renewed every ~0.7 s: the forged lease is met soon
    run = Piped(ct, "run", str(job))
    try:
        ct.wait_for_node_line("worker-1", r"ct-ready", timeout=120)
        ct.wait_for_node_line("worker-0", r"ct-ready", timeout=120)
        prefix = ct.bucket / ct.run_ids()[0]
        for case, text in _plant_live(prefix).items():
            run.wait_for(text, timeout=60, case=case)
    finally:
        release.touch()
    result = run.wait(BOUND_S["run"])
    check(result, "documents: run")
    assert "succeeded" in result.text, f"[forged-yield/lease] {result.text[-3000:]}"
    run_id = prefix.name
    _plant_after(prefix)
    got = _after_the_run(ct, run_id, "documents", sentinels)
    status = got["status"].text + got["status --json"].text
    assert "ct-forged-by-a-node" not in status, "[forged-journal] status replayed it"
    ids = {r.resource_id for r in ct.ledger().resources(run_id)}
    assert OTHER_NODE not in ids, "[forged-journal] another run's node became this run's"
    for node in ("worker-0", "worker-1"):  # the log index is skipped, the chunks still read
        assert f"[{node}] ct-job-done" in got["logs"].text, f"[log-index] {node}'s lines lost"
