"""A node's text and figures reach the user's terminal as text: no markup is interpreted, no
escape sequence or control character gets through, and no figure (NaN, inf, 1e308, a 4000-digit
int) crashes or garbles the live view, the plain lines or the summary.

Everything is rendered by the real rich console, as a terminal gets it, into UTF-8 bytes with
strict encoding (what a real stdout does)."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from cloudtrain.cli.ui import ConsoleObserver, node_table, summary, throughput_lines
from cloudtrain.insight.throughput import throughput
from cloudtrain.run.view import NodeView, RunResult, RunView

# what a job can print, or write into its heartbeat, status or failure report
HOSTILE = {
    "markup": "[bold]x[/",
    "closing tag": "[/bold] and [/]",
    "link markup": "[link=https://evil.example]click[/link]",
    "title": "\x1b]0;PWNED-TITLE\x07",
    "clipboard": "\x1b]52;c;cm0gLXJmIH4=\x07",
    "osc 8 link": "\x1b]8;;https://evil.example\x1b\\link\x1b]8;;\x1b\\",
    "clear": "\x1b[2J\x1b[H",
    "device query": "\x1b[6n\x1b[c",
    "colour": "\x1b[31mred\x1b[0m",
    "c1 csi": "\x9b31mred",
    "cr bs del": "progress\r99%\b\b\x7f done",
    "lone surrogate": "bad \ud800 bytes",
    "bidi": "abc\u202edcba",
}
# a control character a terminal acts on (the newline aside), DEL, C1, a surrogate, bidi
INERT_VIOLATION = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\ud800-\udfff\u202a-\u202e]")


def terminal() -> tuple[Console, io.BytesIO]:
    """A rich console that believes it is a terminal, writing UTF-8 like a real stdout."""
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", write_through=True)
    return Console(file=stream, force_terminal=True, color_system=None, width=300), raw


def assert_inert(raw: io.BytesIO) -> str:
    text = raw.getvalue().decode("utf-8")
    bad = INERT_VIOLATION.search(text)
    if bad is not None:
        around = text[max(bad.start() - 60, 0) : bad.end() + 60]
        raise AssertionError(f"{bad.group()!r} reached the terminal: ...{around!r}...")
    return text


def visible(payload: str) -> str:
    """The printable part of a payload that must show up as it is (markup as text)."""
    return payload if payload.startswith("[") else ""


def _view(text: str) -> RunView:
    node = NodeView(
        name=f"ct-r-worker-0{text}",
        role="worker",
        index=0,
        cloud_state=text,
        agent_state=text,
        attempt=1,
        epoch=1,
        epochs=3,
        last_line=text,
        activity=f"restoring {text}",
    )
    return RunView("r-abcdef", "training", 1, [node], 0.0, 1.0)


@pytest.mark.parametrize("payload", HOSTILE.values(), ids=HOSTILE.keys())
def test_log_lines_and_events_are_text(payload: str) -> None:
    console, raw = terminal()
    observer = ConsoleObserver(console)
    observer.log_line("worker-0", payload)
    observer.event(f"worker-0 failed: {payload}")
    text = assert_inert(raw)
    assert text.count(visible(payload)) >= 2
    assert "[worker-0] " in text and "worker-0 failed: " in text


@pytest.mark.parametrize("payload", HOSTILE.values(), ids=HOSTILE.keys())
def test_the_live_table_and_the_plain_lines_are_text(payload: str) -> None:
    console, raw = terminal()
    console.print(node_table(_view(payload)))  # what the Live view draws
    ConsoleObserver(console).update(_view(payload))  # the plain lines of a non-terminal
    text = assert_inert(raw)
    assert visible(payload)[:20] in text


def test_the_live_view_on_a_terminal_passes_no_sequence_of_the_node() -> None:
    """Through rich's Live itself (which writes its own cursor moves): none of the node's."""
    console, raw = terminal()
    payload = "".join(HOSTILE.values())
    with ConsoleObserver(console) as observer:
        assert observer.live is not None
        observer.update(_view(payload))
        observer.log_line("worker-0", payload)
    text = raw.getvalue().decode("utf-8")
    # (Live moves the cursor with \r and CSI sequences of its own: those are not the node's)
    for sequence in ("\x1b]", "\x1b[2J", "\x1b[6n", "\x1b[31m", "\x9b", "\x07", "\x7f"):
        assert sequence not in text, f"{sequence!r} reached the terminal"


@pytest.mark.parametrize("payload", HOSTILE.values(), ids=HOSTILE.keys())
def test_the_summary_is_text(payload: str) -> None:
    beat = {"attempt": 1, "metrics": {"examples_per_s": 10.0, "loss": 0.5}}
    result = RunResult(
        run_id="r-abcdef",
        outcome="failed",
        detail=f"worker-0 failed: {payload}\n  last lines:\n  {payload}",
        cost_by_node={f"worker-0{payload}": 0.5},
        throughput=throughput({f"worker-0{payload}": beat}, 1.0),
        trace={"breakdown": [{"phase": f"boot{payload}", "seconds": 1.5}]},
    )
    console, raw = terminal()
    console.print(summary(result))
    text = assert_inert(raw)
    assert text.count(visible(payload)) >= 2


EXTREME = [float("nan"), float("inf"), -float("inf"), 1e308, -1e308, 5e-324, 10**4000, "1e9"]
METRICS = (
    "examples_per_s",
    "steps_per_s",
    "step_p50_s",
    "step_p95_s",
    "epoch_seconds",
    "steps_per_epoch",
    "loss",
    "cpu_percent",
    "gpu_util_percent",
)
LONG_NUMBER = re.compile(r"\d{16,}")
NOT_FINITE = re.compile(r"\b(nan|inf|infinity)\b", re.IGNORECASE)


def _extreme_beats() -> dict[str, dict[str, object]]:
    beats: dict[str, dict[str, object]] = {}
    for i, value in enumerate(EXTREME):
        metrics = {key: value for key in METRICS}
        metrics["losses"] = [1e308, -1e308, value, 0.5, float("nan")]
        beats[f"worker-{i}"] = {"attempt": 1, "metrics": metrics}
    beats["worker-9"] = {"attempt": 1, "metrics": {"examples_per_s": 1e-300, "loss": 1.0}}
    return beats


def assert_figures_bounded(text: str) -> None:
    assert LONG_NUMBER.search(text) is None, LONG_NUMBER.search(text)
    assert NOT_FINITE.search(text) is None, NOT_FINITE.search(text)


def test_extreme_figures_in_the_live_view_and_plain_lines() -> None:
    tp = throughput(_extreme_beats(), 1e308)
    nodes = [
        NodeView(f"n{i}", "worker", i, epoch=epoch, epochs=10**4000, attempt=1)
        for i, epoch in enumerate([1, 10**4000, 2**70])
    ]
    view = RunView("r-abcdef", "training", 1, nodes, 0.0, 1.0, 0.5, tp)
    console, raw = terminal()
    console.print(node_table(view))
    ConsoleObserver(console).update(view)
    assert_figures_bounded(assert_inert(raw))


def test_extreme_figures_in_the_summary() -> None:
    result = RunResult(
        run_id="r-abcdef",
        outcome="succeeded",
        throughput=throughput(_extreme_beats(), 2.0),
        trace={
            "breakdown": [
                {"phase": "boot", "seconds": float("nan")},
                {"phase": "train", "seconds": 1e308},
                {"phase": "sync", "seconds": float("inf")},
                {"phase": "odd", "seconds": "12"},
            ]
        },
    )
    console, raw = terminal()
    console.print(summary(result))
    for line in throughput_lines(result.throughput):
        console.print(line)
    text = assert_figures_bounded_and_inert(raw)
    assert "train" in text  # the finite phase is still shown


def assert_figures_bounded_and_inert(raw: io.BytesIO) -> str:
    text = assert_inert(raw)
    assert_figures_bounded(text)
    return text
