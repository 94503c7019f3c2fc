"""`cloudtrain report`: what it reads of a run (cloudtrain/insight/report_data.py), the page it
draws (cloudtrain/insight/report_html.py) and the command (cloudtrain/cli/report.py).

The run is written as a run writes it: the plan from the example job's spec (`api.plan`), the
ledger's rows through `Ledger` (its clock set, so every time is known), the bucket's documents
through jobs/protocol.py's keys and classes into a real `LocalStore`, the bootstrap logs in the
startup script's line format and the metrics stream in protocol.METRICS's; a traced run's spans
as production records them (jobs/trace.py's Tracer and PhaseClock: the controller's into the
ledger's "span" events, each node's into its TraceDoc in the bucket). The browser's view of the
page is tests/e2e/test_insight.py's.
"""

from __future__ import annotations

import html
import json
import re
import sys
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from cloudtrain import api
from cloudtrain.insight.report_data import ReportData, collect
from cloudtrain.insight.report_html import INSTALL_HINT, PLOT_IDS, render
from cloudtrain.insight.report_timeline import lanes
from cloudtrain.insight.run_trace import SPAN_EVENT
from cloudtrain.jobs import trace as tr
from cloudtrain.jobs.protocol import (
    NodeStatus,
    Registration,
    bootstrap_log_key,
    metrics_chunk_key,
    registration_key,
    run_prefix,
    status_key,
    trace_key,
)
from cloudtrain.providers.base import Resource, node_name
from cloudtrain.providers.local import LocalStore
from cloudtrain.state.ledger import Ledger

EXAMPLE = Path(__file__).resolve().parents[3] / "jobs" / "examples" / "digits-multiworker"
RUN_ID = "digits-multiworker-abc123"
T0 = 1_800_000_000.0
PRICE = 1.8  # $ per node-hour
HOSTILE = "<script>alert(1)</script>"


class Clock:
    """The ledger's clock: what `now` is set to."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now

    def at(self, offset: float) -> Clock:
        self.now = T0 + offset
        return self


def _boot_log(node: str, start: float) -> str:
    """A bootstrap log as jobs/startup.sh.j2 writes it (phases of 2, 10 and 1 s)."""

    def line(offset: float, text: str) -> str:
        stamp = datetime.fromtimestamp(T0 + start + offset, timezone.utc)
        return f"{stamp:%Y-%m-%dT%H:%M:%SZ} cloudtrain-bootstrap[{node}]: {text}"

    return "\n".join(
        [
            line(0, "start (deadline 2027-01-15T08:00:00Z)"),
            line(0, "phase driver: checking"),
            line(2, "phase driver: done in 2s"),
            line(2, "durations driver=2s"),
            line(2, "phase python: installing tensorflow 2.21.0"),
            "Collecting tensorflow==2.21.0",
            line(12, "phase python: done in 10s"),
            line(12, "durations driver=2s python=10s"),
            line(12, "phase bundle: fetching"),
            line(13, "phase bundle: done in 1s"),
            line(13, "durations driver=2s python=10s bundle=1s"),
            line(13, "phase agent: starting"),
        ]
    )


def _epoch(at: float, epoch: int, loss: float, seconds: float = 8.0) -> dict[str, Any]:
    return {
        "time": T0 + at,
        "kind": "epoch",
        "epoch": epoch,
        "steps": 24,
        "examples": 768,
        "seconds": seconds,
        "examples_per_s": 96.0,
        "loss": loss,
        "metrics": {"loss": loss, "accuracy": 1 - loss / 2, "val_loss": loss + 0.1},
        "source": "runtime",
    }


def _window(at: float, rate: float) -> dict[str, Any]:
    return {"time": T0 + at, "kind": "window", "examples_per_s": rate, "steps_per_s": 3.0}


def _gpu(at: float) -> dict[str, Any]:
    gpus = [{"index": 0, "util_percent": 40}, {"index": 1, "util_percent": 60}]
    return {"time": T0 + at, "kind": "gpu", "gpus": gpus}


def _chunk(records: list[Any]) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records).encode()


def write_run(home: Path, monkeypatch: pytest.MonkeyPatch, metrics: bool = True) -> Ledger:
    """A two-worker run of the example job: created at T0, nodes asked for at +1 and created at
    +3, booted from +5, rendezvous at +20/+22, worker-1 lost at +60 (restart: attempt 2,
    registered at +64/+65), final statuses at +95/+96, nodes deleted at +99/+100, done at +101.
    Returns its ledger (at home/ledger.db)."""
    monkeypatch.setenv("CLOUDTRAIN_LOCAL_PRICE_USD", str(PRICE))
    plan = api.plan(EXAMPLE / "job.yaml")
    store = LocalStore((home / "bucket").as_uri())
    clock = Clock()
    ledger = Ledger(home / "ledger.db", clock=clock)
    ledger.create_run(
        RUN_ID, "digits-multiworker", "local", "local", "local", None, store.uri,
        json.dumps(plan.to_dict()),
    )  # fmt: skip
    names = [node_name(RUN_ID, "worker", i) for i in (0, 1)]
    clock.at(1)
    for name in names:
        ledger.record_intent(Resource("local", "node", name, "local", RUN_ID), PRICE)
    clock.at(3)
    for name in names:
        ledger.mark_created(RUN_ID, "node", name, "1234")
        ledger.event(RUN_ID, "node", f"created {name}")
    ledger.set_status(RUN_ID, "running")
    clock.at(60)
    ledger.event(RUN_ID, "restart", "attempt 2: worker-1")
    for name, at in zip(names, (99, 100), strict=True):
        clock.at(at)
        ledger.mark_deleted(RUN_ID, "node", name)
    clock.at(101)
    ledger.set_status(RUN_ID, "done", "succeeded", "worker-0 finished")
    ledger.event(RUN_ID, "end", f"succeeded: {HOSTILE}")

    for i, node in enumerate(("worker-0", "worker-1")):
        store.put(bootstrap_log_key(RUN_ID, node), _boot_log(node, 5 + i).encode())
        for attempt, at in ((1, 20 + 2 * i), (2, 64 + i)):
            reg = Registration(address="127.0.0.1:2222", time=T0 + at)
            store.put(registration_key(RUN_ID, attempt, node), reg.to_json())
        done = NodeStatus(state="succeeded", attempt=2, time=T0 + 95 + i, exit_code=0)
        store.put(status_key(RUN_ID, node), done.to_json())
        if not metrics:
            continue
        first = [_gpu(26), _window(28, 100.0 + i), _epoch(35, 1, 1.0), _epoch(45, 2, 0.8)]
        # after the restart epoch 2 is trained again; one line is not JSON
        second = [_epoch(80, 2, 0.7), _window(85, 90.0), "{not json", _epoch(90, 3, 0.5)]
        store.put(metrics_chunk_key(RUN_ID, node, 0), _chunk(first))
        store.put(metrics_chunk_key(RUN_ID, node, 1), _chunk(second))
    # keys that are no node's stream: not read
    prefix = run_prefix(RUN_ID)
    store.put(f"{prefix}metrics/admin-0/00000000.jsonl", _chunk([_gpu(30)]))
    store.put(f"{prefix}metrics/worker-0/notes.txt", b"{}")
    return ledger


def collect_run(home: Path, ledger: Ledger) -> ReportData:
    rec = ledger.get_run(RUN_ID)
    assert rec is not None
    return collect(ledger, rec, LocalStore((home / "bucket").as_uri()), now=T0 + 500)


def lane(data: ReportData, name: str) -> list[tuple[str, float, float]]:
    return [(s.label, s.start - T0, s.end - T0) for s in data.spans if s.lane == name]


def test_collect_reads_the_ledger_and_the_bucket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = write_run(tmp_path, monkeypatch)
    data = collect_run(tmp_path, ledger)

    assert data.nodes == ["worker-0", "worker-1"]
    assert data.instance_types == {"worker-0": "local", "worker-1": "local"}
    assert (data.outcome, data.attempts, data.wall_s) == ("succeeded", 2, 101.0)
    assert data.skipped == 2  # the line that is not JSON, once per node
    # the restarted attempt's epoch 2 replaces the first one's
    assert [(r["epoch"], r["loss"]) for r in data.epochs("worker-0")] == [
        (1, 1.0),
        (2, 0.7),
        (3, 0.5),
    ]
    assert [r["examples_per_s"] for r in data.of_kind("worker-1", "window")] == [101.0, 90.0]
    assert len(data.of_kind("worker-0", "gpu")) == 1
    # cost: the ledger's rule, two nodes billed from +1 to +99 and +100
    billed = ledger.billed_cost(RUN_ID, now=T0 + 500)
    assert billed == pytest.approx(PRICE * (98 + 99) / 3600)
    assert data.cost_usd == pytest.approx(billed)
    assert [round(t - T0) for t, _ in data.cost_points] == [0, 1, 99, 100]
    assert data.cost_points[-1][1] == pytest.approx(billed)
    assert data.hourly_usd == pytest.approx(2 * PRICE)
    # the timeline
    assert lane(data, "provision") == [("nodes", 0, 3)]
    assert lane(data, "boot worker-1") == [("driver", 6, 8), ("python", 8, 18), ("bundle", 18, 19)]
    # attempt 1 from the first agent's start (+18) to the last registration; attempt 2 from
    # the restart event
    assert lane(data, "rendezvous") == [("attempt 1", 18, 22), ("attempt 2", 60, 65)]
    # per attempt: from the rendezvous to the first record (its start: an epoch's end less its
    # seconds), then to the last record
    assert lane(data, "training") == [
        ("starting", 22, 27),
        ("starting", 65, 72),
        ("epochs", 27, 45),
        ("epochs", 72, 90),
    ]
    assert lane(data, "restarts") == [("attempt 2: worker-1", 60, 65)]
    assert lane(data, "teardown") == [("delete", 96, 100)]  # the last final status to delete


class Page(HTMLParser):
    """The page's figures (id -> the tags inside it), tags and attributes."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.figures: dict[str, list[str]] = {}
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str]] = []
        self.meta: list[dict[str, str]] = []
        self._in: str | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += [(k, v or "") for k, v in attrs]
        found = dict((k, v or "") for k, v in attrs)
        if tag == "meta":
            self.meta.append(found)
        if tag == "figure":
            self._in = found.get("id", "")
            assert self._in not in self.figures, f"two figures {self._in}"
            self.figures[self._in] = []
        elif self._in is not None:
            self.figures[self._in].append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self._in = None


def assert_self_contained(text: str) -> Page:
    """No script, no event handler, nothing fetched: every src/href is data: or in-page."""
    page = Page(text)
    assert "script" not in page.tags
    assert [k for k, _ in page.attrs if k.lower().startswith("on")] == []
    fetched = [v for k, v in page.attrs if k in ("src", "href", "xlink:href")]
    assert [v for v in fetched if not v.startswith(("data:", "#"))] == []
    assert not re.search(r"url\((?!#)", text), "a CSS url() outside the page"
    (csp,) = [m for m in page.meta if m.get("http-equiv") == "Content-Security-Policy"]
    assert "default-src 'none'" in csp["content"] and "script" not in csp["content"]
    return page


def test_the_page_is_one_file_with_every_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = collect_run(tmp_path, write_run(tmp_path, monkeypatch))
    # a long run's dense series (here 9000 windows of worker-0) is rasterized into the SVG
    data.records["worker-0"] += [_window(72 + i * 0.002, 100.0 + i % 7) for i in range(9000)]
    data.records["worker-0"].sort(key=lambda r: r["time"])
    text = render(data)
    page = assert_self_contained(text)
    assert tuple(page.figures) == PLOT_IDS
    for fid, tags in page.figures.items():
        assert "svg" in tags and "figcaption" in tags, (fid, tags)
    assert "no data" not in text and "no GPU samples" not in text
    # a run without spans: its timeline derived from the ledger and the bucket, no breakdown
    assert texts(figure(text, "plot-timeline"), "ytick") == [
        *("provision", "boot worker-0", "boot worker-1", "rendezvous", "training", "restarts"),
        "teardown",
    ]
    assert not data.trace and 'class="breakdown"' not in text
    assert HOSTILE not in text and "succeeded: &lt;script&gt;alert(1)&lt;/script&gt;" in text
    for value in ("digits-multiworker-abc123", "succeeded", "1m41s", "$0.0985"):
        assert f"<td>{value}" in text, value
    throughput = text[text.index('id="plot-throughput"') : text.index('id="plot-gpu"')]
    assert "<image" in throughput and "data:image/png;base64," in throughput
    assert len(text) < 1_000_000, len(text)


def test_a_run_without_metrics_says_no_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = collect_run(tmp_path, write_run(tmp_path, monkeypatch, metrics=False))
    assert not data.has_metrics
    # the job's bar: from the last registration to the nodes' final statuses, per attempt
    assert lane(data, "training") == [("job", 22, 96), ("job", 65, 96)]
    text = render(data)
    page = assert_self_contained(text)
    empty = {fid for fid, tags in page.figures.items() if "svg" not in tags}
    assert empty == {"plot-loss", "plot-throughput", "plot-gpu"}
    for fid, says in (("plot-loss", "no data"), ("plot-gpu", "no GPU samples")):
        block = text[text.index(f'id="{fid}"') :]
        assert f'<div class="empty">{says}</div>' in block[: block.index("</figure>")]
    # no bucket at all: the ledger's part only, and the header says why
    rec = Ledger(tmp_path / "ledger.db").get_run(RUN_ID)
    assert rec is not None
    alone = collect(Ledger(tmp_path / "ledger.db"), rec, None, now=T0 + 500)
    assert alone.store_error and alone.nodes == ["worker-0", "worker-1"]
    assert {s.lane for s in alone.spans} == {"provision", "restarts", "teardown"}
    assert "not readable" in render(alone)


def write_trace(home: Path, ledger: Ledger) -> None:
    """write_run's run traced as production records it: the controller's phases back to back
    from the CLI's start at -0.5 (before the ledger's record) to +101, with the create and delete
    calls under them, into the ledger; each node's spans from its boot (+5, +6: the startup
    script's trace file, one phase too short to see, one named as an attack) to its finish,
    over both attempts, into its trace document."""
    store = LocalStore((home / "bucket").as_uri())
    ctl = tr.Tracer(on_span=lambda s: ledger.event(RUN_ID, SPAN_EVENT, json.dumps(s.to_dict())))
    phases = tr.PhaseClock(ctl, tr.ROOT, T0 - 0.5)
    steps = [(tr.STARTUP, 0, -0.5), (tr.BUNDLE, 0, 0.2), (tr.BUCKET, 0, 0.4)]
    steps += [(tr.PROVISION, 0, 0.6), (tr.CREATE, 0, 1), (tr.WATCH, 1, 3), (tr.WATCH, 2, 60)]
    for name, attempt, at in [*steps, (tr.END, 0, 96.5), (tr.TEARDOWN, 0, 97)]:
        phases.next(name, attempt, at=T0 + at)
    for i in (0, 1):
        ctl.add(f"create worker-{i}", T0 + 1 + i / 10, T0 + 2.9 + i / 10, parent=tr.CREATE)
        name = node_name(RUN_ID, "worker", i)
        ctl.add(f"delete {name}", T0 + 97 + i / 5, T0 + 99 + i, parent=tr.TEARDOWN)
    ctl.add(tr.ROOT, T0 - 0.5, phases.close(at=T0 + 101))
    for i, node in enumerate(("worker-0", "worker-1")):
        t = T0 + i  # worker-1 a second behind
        boot = home / f"trace-{node}.tsv"
        boot.write_text(
            f"driver\t{t + 5}\t{t + 7}\npython\t{t + 7}\t{t + 17}\n"
            f"bundle\t{t + 17}\t{t + 18}\nmount\t{t + 17.9}\t{t + 18}\n"
            f"{HOSTILE}\t{t + 5}\t{t + 6}\n"  # beside driver: a row of its own
        )
        agent = tr.Tracer(node)
        agent.extend(tr.read_boot_trace(boot, node))
        for name, start, end, attempt in (
            (tr.BOOT, t + 5, t + 18, 0),
            (tr.AGENT_START, t + 18, t + 18.5, 0),
            (tr.REGISTER, t + 18.5, t + 20, 1),
            (tr.RENDEZVOUS, t + 20, T0 + 22, 1),
            (tr.PEERS, T0 + 22, T0 + 22.2 + i / 10, 1),
            (tr.SETUP, T0 + 22.2 + i / 10, t + 23, 1),
            (tr.TRAINING, t + 23, T0 + 60, 1),
            (tr.FIRST_STEP, t + 23, t + 27, 1),
            (tr.REGISTER, T0 + 63, T0 + 64 + i / 2, 2),
            (tr.RENDEZVOUS, T0 + 64 + i / 2, T0 + 65, 2),
            (tr.TRAINING, T0 + 65, t + 95, 2),
            (tr.FINISH, t + 95, t + 96, 0),
        ):
            agent.add(name, start, end, parent=tr.NODE, attempt=attempt)
        agent.add(tr.NODE, t + 5, t + 96)
        store.put(trace_key(RUN_ID, node), tr.TraceDoc(tuple(agent.spans())).to_json().encode())


def texts(svg: str, group: str = "") -> list[str]:
    """The SVG's texts in document order (within `<g id="<group>_N">` groups when given)."""
    if group:
        svg = "".join(re.findall(rf'<g id="{group}_\d+">.*?</text>', svg, re.S))
    return [html.unescape(t) for t in re.findall(r"<text[^>]*>(.*?)</text>", svg, re.S)]


def figure(text: str, fid: str) -> str:
    block = text[text.index(f'id="{fid}"') :]
    return block[: block.index("</figure>")]


def test_a_traced_run_draws_its_spans_and_their_breakdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = write_run(tmp_path, monkeypatch)
    write_trace(tmp_path, ledger)
    data = collect_run(tmp_path, ledger)
    # the ledger's span events are the trace, not events
    assert sum(e.kind == SPAN_EVENT for e in ledger.events(RUN_ID)) == 14
    assert [kind for _, kind, _ in data.events] == ["node", "node", "restart", "end"]
    assert sorted({s.node for s in data.trace}) == ["", "worker-0", "worker-1"]
    # a lane per recorder: its top level in row 0, overlapping spans and children below
    assert [
        (lane.name, [[b.label for b in lane.bars if b.row == r] for r in range(lane.rows)])
        for lane in lanes(data.trace, data.nodes, 103.5)
    ] == [
        (
            "controller",
            [
                [
                    *("startup", "bundle", "bucket", "provision", "create", "watch", "watch #2"),
                    "end",
                    "teardown",
                ],
                ["create worker-0", f"delete {node_name(RUN_ID, 'worker', 0)}"],
                ["create worker-1", f"delete {node_name(RUN_ID, 'worker', 1)}"],
            ],
        ),
        *(
            (
                node,
                [
                    [
                        *("boot", "agent start", "register", "rendezvous", "peers", "setup"),
                        *("training", "register #2", "rendezvous #2", "training #2", "finish"),
                    ],
                    ["driver", "python", "bundle", "first step"],  # mount: 0.1 s, not drawn
                    [HOSTILE],
                ],
            )
            for node in ("worker-0", "worker-1")
        ),
    ]
    text = render(data)
    assert_self_contained(text)
    assert "<td>span</td>" not in text and "<td>restart</td>" in text
    # the breakdown, after the summary and before the plots: the phases tile the 101.5 s
    table = text[text.index('<table class="summary">') : text.index("<figure")]
    rows = re.findall(r"<tr><t[dh]>([^<]*)</t[dh]><t[dh]>([^<]*)</t[dh]>", table)
    assert rows[-11:] == [
        ("phase", "seconds"),
        ("start", "1.50"),  # the CLI's start to the first create call
        ("create", "2.00"),
        ("boot", "16.50"),  # to worker-1's agent up
        ("agent", "1.50"),
        ("rendezvous", "1.30"),  # to worker-1's peers answering
        ("setup", "1.70"),
        ("training", "72.00"),  # to the last node's exit in attempt 2
        ("end detection", "1.00"),  # to every final report seen
        ("teardown", "4.00"),
        ("run", "101.50"),
    ]
    timeline = figure(text, "plot-timeline")
    assert texts(timeline, "ytick") == ["controller", "worker-0", "worker-1"]
    shown = texts(timeline)
    for label in ("watch #2", "training #2", "python", "boot: python", "create", "teardown"):
        assert label in shown, label  # on its bar, or the legend's (boot: the script's phases)
    assert "mount" not in shown and "boot: mount" not in shown
    assert f"boot: {HOSTILE}" in shown and HOSTILE not in text  # escaped


def run_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    """`cloudtrain ARGS` through the console script's entry point, in this process: (exit code,
    stdout, stderr)."""
    from cloudtrain.cli.main import main

    monkeypatch.setattr(sys, "argv", ["cloudtrain", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    out = capsys.readouterr()
    return int(exited.value.code or 0), out.out, out.err


def test_the_command_writes_the_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path, monkeypatch)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path))
    monkeypatch.chdir(out)
    code, stdout, stderr = run_cli(monkeypatch, capsys, "report", "digits-multi")  # a prefix
    assert code == 0, stderr
    assert stdout == f"wrote {RUN_ID}-report.html\n"
    page = assert_self_contained((out / f"{RUN_ID}-report.html").read_text())
    assert tuple(page.figures) == PLOT_IDS
    code, stdout, stderr = run_cli(monkeypatch, capsys, "report", RUN_ID, "--html", "mine.html")
    assert code == 0 and (out / "mine.html").is_file(), stderr
    # a run id from the command line is checked before anything is built from it
    code, _, stderr = run_cli(monkeypatch, capsys, "report", "../../etc/passwd")
    assert code == 2 and stderr.startswith("error: '../../etc/passwd' is not a run id"), stderr
    assert sorted(p.name for p in out.iterdir()) == [f"{RUN_ID}-report.html", "mine.html"]
    # without the extra: one line naming it, before anything is read or written
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    code, _, stderr = run_cli(monkeypatch, capsys, "report", RUN_ID, "--html", "none.html")
    assert (code, stderr) == (
        2,
        "error: cloudtrain report draws its plots with matplotlib, which is not installed "
        f"({INSTALL_HINT})\n",
    )
    assert not (out / "none.html").exists()
