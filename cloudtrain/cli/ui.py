"""Everything the user sees of a run: the live node view, log lines and the summary (the plan
table is `cloudtrain.cli.plan_view`'s).

On a terminal the run is a rich Live view (nodes, states, epoch, what a node's agent is busy with
and its last line, elapsed, cost) with log lines scrolling above it. Elsewhere (CI, pipes) the same
information is printed as plain lines, only when something changes. If the terminal goes away
(SIGHUP, a closed SSH session or pipe), the output moves to the run's `controller.log`. What a
node wrote (its lines, states, activity, reasons, names and figures) is shown as text through
`cloudtrain.core.node_text`: never as rich markup, no control character, every figure finite and
short. Imports rich only; never TensorFlow or a cloud SDK.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from cloudtrain.cli.plan_view import plan_table as plan_table  # `run` prints it too
from cloudtrain.core.node_text import figure, finite, fmt_duration, shown, shown_lines, whole
from cloudtrain.core.paths import runs_dir
from cloudtrain.insight.throughput import fmt_rate, sparkline
from cloudtrain.insight.trace_view import time_line

if TYPE_CHECKING:
    from cloudtrain.insight.throughput import NodeRate, Throughput
    from cloudtrain.plan.planner import Plan
    from cloudtrain.run.view import RunResult, RunView

_NATIVE_LOG = re.compile(r"^(?:[IWE]\d{4} |WARNING: All log messages before absl)")
# TensorFlow's probe for CUDA on a machine with no GPU ("cudart_stub.cc:31] Could not find cuda
# drivers", "cuda_platform.cc:52] failed call to cuInit", the cuDNN/cuFFT/cuBLAS factories,
# TensorRT): native log lines, and the continuation line of "Cannot dlopen some GPU libraries"
_CUDA_PROBE = re.compile(r"cuda|cuInit|cudnn|cufft|cublas|tensorrt|TF-TRT|GPU librar", re.I)
_GPU_SKIPPED = "Skipping registering GPU devices"
CUDA_PROBE_NOTE = (
    "TensorFlow looked for a GPU and found none, as planned (this node has none): its CUDA "
    "probe's lines are not shown here; `cloudtrain logs {run}` has them"
)
PLAIN_ACTIVITY_S = 30.0  # a plain stream repeats a node's ongoing activity at most this often
NAME_LIMIT = 80  # characters shown of a node's name, state or activity
LOG_LINE_LIMIT = 2000  # characters shown of one line a node printed (`logs` shows it whole)
EVENT_LINE_LIMIT = 2000  # ... of one line of an event (which may quote a node's reason)
EVENT_LINES = 100  # lines shown of one event
_FIGURES = re.compile(r"[\d.]+/[\d.]+ ?[KMGT]?B\b|\d+(?:\.\d+)?")
_STATE_STYLE = {
    "succeeded": "green",
    "running": "cyan",
    "failed": "red",
    "stopped": "yellow",
    "rendezvous": "magenta",
}


def node_table(view: RunView) -> Group:
    """The live view of a run: per node its states, epoch, examples/s, GPU use, loss with a
    sparkline of its last epochs, a straggler or idle flag, what its agent is busy with
    ("restoring 3.1/5.0 GB") and its last line; below, the cluster's examples/s and the cost
    so far."""
    head = Text(
        f"{view.run_id}  {view.phase}  attempt {whole(view.attempt)}  "
        f"{fmt_duration(view.elapsed_s)}  {_usd(view.cost_usd)} ({_usd(view.hourly_usd)}/h)",
        style="bold",
    )
    table = Table(expand=True)
    for col in ("node", "cloud", "agent", "epoch", "examples/s", "gpu", "loss", "", "last line"):
        table.add_column(
            col, overflow="ellipsis", no_wrap=True, ratio=4 if col == "last line" else 1
        )
    rates = view.throughput.nodes if view.throughput else {}
    for nv in view.nodes:
        name = f"{nv.role}-{nv.index}"
        rate = rates.get(name)
        table.add_row(
            Text(shown(name, NAME_LIMIT)),
            Text(shown(nv.cloud_state, NAME_LIMIT)),
            Text(shown(nv.agent_state, NAME_LIMIT), _STATE_STYLE.get(str(nv.agent_state), "")),
            Text(_epoch(nv.epoch, nv.epochs)),
            Text(fmt_rate(rate.examples_per_s if rate else None)),
            Text(_percent(rate.gpu_util_percent if rate else None)),
            _loss(rate),
            _flag(rate),
            _doing(nv.activity, nv.last_line),
        )
    return Group(head, table, *_cluster_line(view))


def _epoch(epoch: object, epochs: object) -> str:
    """'3/10', '3/?' or '-' (no epoch yet). Pure."""
    return f"{whole(epoch)}/{whole(epochs)}" if epoch else "-"


def _usd(value: float) -> str:
    return f"${figure(value, '.4f', 14)}"


def _doing(activity: str, last_line: str) -> Text:
    """The last column: the agent's activity (highlighted) before the node's last line."""
    activity, last_line = shown(activity, NAME_LIMIT), shown(last_line)
    if not activity:
        return Text(last_line)
    return Text(activity, style="bold yellow") + Text(f"  {last_line}" if last_line else "")


def activity_kind(activity: str) -> str:
    """An activity without its figures ("restoring 3.1/5.0 GB" -> "restoring"): what a plain
    stream reports once per change. Pure."""
    return " ".join(_FIGURES.sub("", activity).split())


def _percent(value: float | None) -> str:
    text = figure(value, ".0f", 6)
    return text if text == "-" else f"{text}%"


def _loss(rate: NodeRate | None) -> Text:
    if rate is None or finite(rate.loss) is None:
        return Text("-")
    return Text(f"{figure(rate.loss, '.4f')} ") + Text(sparkline(rate.losses, 12), style="cyan")


def _flag(rate: NodeRate | None) -> Text:
    if rate is None:
        return Text("")
    if rate.straggler:
        return Text("straggler", style="bold red")
    return Text("idle", style="yellow") if rate.idle else Text("")


def _cluster_line(view: RunView) -> list[Text]:
    """'cluster 2,345/s  $0.0012/epoch  $0.05/M examples  cost so far $0.0123' (measured)."""
    tp = view.throughput
    if tp is None or not tp.measured:
        return []
    return [
        Text(
            f"cluster {fmt_rate(tp.cluster_examples_per_s)}{_unit_costs(tp)}  "
            f"cost so far {_usd(view.cost_usd)}"
        )
    ]


def _unit_costs(tp: Throughput) -> str:
    per_epoch, per_million = tp.usd_per_epoch, tp.usd_per_million_examples
    out = f"  {_usd(per_epoch)}/epoch" if finite(per_epoch) is not None else ""
    return out + (f"  {_usd(per_million)}/M examples" if finite(per_million) is not None else "")


class ConsoleObserver:
    """The orchestrator's observer: rich Live on a terminal, plain lines otherwise.

    Output survives a vanished terminal (SIGHUP, a closed SSH session, a closed pipe): the first
    write that fails with OSError (EIO, EPIPE...) moves every later line, plain, to
    `$CLOUDTRAIN_HOME/runs/<run id>/controller.log` (/dev/null before the run id is known);
    stdout and stderr are pointed there too when the dead stream was one of them, so the final
    summary and Python's own exit-time flush cannot fail either. Thread-safe."""

    def __init__(
        self,
        console: Console | None = None,
        show_logs: bool = True,
        gpu_less: Collection[str] = (),
    ) -> None:
        self.console = console or Console(stderr=False)
        self.show_logs = show_logs
        # the roles planned without a GPU: their nodes' CUDA probe lines fold into one note
        self.gpu_less = frozenset(gpu_less)
        self._probed: set[str] = set()  # nodes whose note is printed
        self.live: Live | None = None
        self._last_plain: dict[str, str] = {}
        self._last_epoch: dict[str, int] = {}
        self._last_activity: dict[str, tuple[str, float]] = {}  # node -> (kind, printed at)
        self._last_phase = ""
        self.run_id: str | None = None  # learnt from the first update
        self.diverted_to: str | None = None  # where output went once the terminal vanished
        self._lock = threading.RLock()
        # rich's default for EPIPE is SystemExit(1), which would end a teardown half-way
        self.console.on_broken_pipe = self._broken_pipe  # type: ignore[method-assign]

    def __enter__(self) -> ConsoleObserver:
        if self.console.is_terminal:
            self.live = Live(console=self.console, refresh_per_second=4, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            if self.live is not None:
                self._emit(lambda: self._stop_live())

    def _stop_live(self) -> None:
        live, self.live = self.live, None
        if live is not None:
            live.__exit__(None, None, None)

    def _print(self, renderable: Any) -> None:
        self._emit(lambda: self.console.print(renderable, highlight=False, soft_wrap=True))

    def _emit(self, write: Callable[[], None]) -> None:
        """Run one write to the console; if the terminal is gone, divert and write it there."""
        with self._lock:
            diverted, lost = self.diverted_to, None
            try:
                write()
            except OSError as exc:
                self._divert()
                lost = _interrupt_behind(exc)
            if self.diverted_to != diverted:  # this write failed (an OSError, or EPIPE)
                with contextlib.suppress(Exception):
                    write()
            if lost is not None:
                raise lost

    def _broken_pipe(self) -> None:
        """rich's hook for EPIPE: divert instead of exiting."""
        self._divert()

    def _divert(self) -> None:
        """Send all later output to the run's log (or /dev/null). Idempotent."""
        with self._lock:
            if self.diverted_to is not None:
                return
            target = _log_path(self.run_id)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            except OSError:
                target = Path(os.devnull)
                fd = os.open(os.devnull, os.O_WRONLY)
            self.diverted_to = str(target)
            dead = self.console.file
            _redirect_std_streams(dead, fd)
            sink = os.fdopen(fd, "w", buffering=1, errors="replace")
            if _fileno(dead) not in (1, 2):
                self.console.file = sink  # the caller's later prints (the summary) go there
            with contextlib.suppress(Exception):  # drop the failed text rich still holds
                self.console.begin_capture()
                self.console.end_capture()
            live, self.live = self.live, None
            self.console = Console(file=sink, color_system=None, width=200, soft_wrap=True)
            if live is not None:  # its stop writes nothing more: the stream is no terminal
                with contextlib.suppress(Exception):
                    live.__exit__(None, None, None)
            self.console.print(
                f"{time.strftime('%H:%M:%S')} cloudtrain the terminal is gone "
                f"(stdout/stderr closed); the output continues here",
                highlight=False,
            )

    def event(self, message: str) -> None:
        """A lifecycle event (created, restart, teardown...), shown as text: it may quote what
        a node wrote (a failure's reason and last lines)."""
        stamp = time.strftime("%H:%M:%S")
        text = shown_lines(message, EVENT_LINE_LIMIT, EVENT_LINES)
        self._print(Text(stamp, "dim") + " " + Text("cloudtrain", "bold") + " " + Text(text))

    def log_line(self, node: str, line: str) -> None:
        """One line of a node's output, shown as text (at most LOG_LINE_LIMIT characters;
        `cloudtrain logs` has the whole line). On a node of a role planned without a GPU
        (`gpu_less`), TensorFlow's CUDA probe lines (`is_cuda_probe`) are one dim note, once;
        every other line, its errors included, is shown as it is."""
        if not self.show_logs:
            return
        folded = node.rpartition("-")[0] in self.gpu_less and is_cuda_probe(line)
        if folded:
            with self._lock:
                if node in self._probed:
                    return
                self._probed.add(node)
            line = CUDA_PROBE_NOTE.format(run=self.run_id or "RUN")
        line = shown(line, LOG_LINE_LIMIT)
        style = "dim" if folded or _NATIVE_LOG.match(line) else ""
        self._print(Text(f"[{shown(node, NAME_LIMIT)}] ", style="blue") + Text(line, style))

    def update(self, view: RunView) -> None:
        """Redraw the live view; on a plain stream print only what changed."""
        self.run_id = view.run_id
        with self._lock:
            if self.live is not None:
                self.live.update(node_table(view))
                return
        if view.phase != self._last_phase:
            self._last_phase = view.phase
            self.event(f"phase: {view.phase}")
        for nv in view.nodes:
            key = shown(f"{nv.role}-{nv.index}", NAME_LIMIT)
            state = (
                f"{shown(nv.cloud_state, NAME_LIMIT)}/{shown(nv.agent_state, NAME_LIMIT)} "
                f"attempt {whole(nv.attempt)}"
            )
            if self._last_plain.get(key) != state:
                self._last_plain[key] = state
                self.event(f"{key}: {state}")
            self._plain_activity(key, nv.activity)
            self._plain_epoch(key, nv.epoch, nv.epochs, view.throughput)

    def _plain_activity(self, key: str, activity: str) -> None:
        """On a plain stream, a node's activity ("worker-1: restoring 3.1/5.0 GB") when a new
        one begins, and while it goes on at most every PLAIN_ACTIVITY_S; nothing when it ends."""
        activity = shown(activity, NAME_LIMIT)
        kind = activity_kind(activity)
        last_kind, printed = self._last_activity.get(key, ("", 0.0))
        now = time.monotonic()
        if not kind:
            self._last_activity[key] = ("", 0.0)
            return
        if kind == last_kind and now - printed < PLAIN_ACTIVITY_S:
            return
        self._last_activity[key] = (kind, now)
        self.event(f"{key}: {activity}")

    def _plain_epoch(
        self, key: str, epoch: int | None, epochs: int | None, tp: Throughput | None
    ) -> None:
        """On a plain stream, one line per node and epoch: its examples/s, loss and flag."""
        rate = tp.nodes.get(key) if tp else None
        if epoch is None or rate is None or rate.rate is None:
            return
        if self._last_epoch.get(key) == epoch:
            return
        self._last_epoch[key] = epoch
        loss = "" if finite(rate.loss) is None else f", loss {figure(rate.loss, '.4f')}"
        flag = f" [{_flag(rate).plain}]" if _flag(rate).plain else ""
        self.event(f"{key}: epoch {_epoch(epoch, epochs)}, {fmt_rate(rate.rate)}{loss}{flag}")


def is_cuda_probe(line: str) -> bool:
    """Whether a node's line is TensorFlow's probe for CUDA (a native log line about CUDA, its
    libraries or TensorRT): noise on a node planned without a GPU. Pure."""
    if line.startswith(_GPU_SKIPPED):
        return True
    return _NATIVE_LOG.match(line) is not None and _CUDA_PROBE.search(line) is not None


def gpu_less_roles(plan: Plan) -> frozenset[str]:
    """The plan's roles whose nodes have no GPU (a parameter server, a CPU worker, every local
    node). Pure."""
    return frozenset(n.role for n in plan.nodes if not (n.accelerator and n.accelerator_count))


def _interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or stop signal (stop_signals.StopSignal) that `exc` replaced, if any. A
    signal that lands mid-print raises in rich's rendering; rich's `Console.__exit__` then
    flushes to the hung-up terminal, and that OSError replaces the signal's exception (which
    stays only as its __context__): without this, the SIGHUP of a closing terminal is lost. Pure.
    """
    seen: set[int] = set()
    cause = exc.__context__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        seen.add(id(cause))
        cause = cause.__context__
    return None


def _log_path(run_id: str | None) -> Path:
    """Where a run's controller output goes once its terminal is gone. Pure."""
    if run_id is None:
        return Path(os.devnull)
    return runs_dir() / run_id / "controller.log"


def _fileno(stream: Any) -> int | None:
    try:
        return int(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return None


def _redirect_std_streams(dead: Any, fd: int) -> None:
    """Point fd 1 and 2 at `fd` when `dead` is one of them, and each other std fd that is the
    same file (a terminal is both): later writes, including Python's exit-time flush, land in
    `fd` instead of failing. Best effort."""
    dead_fd = _fileno(dead)
    if dead_fd not in (1, 2):
        return
    try:
        gone = os.fstat(dead_fd)
    except OSError:
        return
    for std in (1, 2):
        with contextlib.suppress(OSError):
            st = os.fstat(std)
            if std == dead_fd or (st.st_dev, st.st_ino) == (gone.st_dev, gone.st_ino):
                os.dup2(fd, std)


def summary(result: RunResult) -> Group:
    """The end-of-run summary: outcome, where the outputs are, wall time, cost by node."""
    style = "green" if result.ok else "red"
    lines: list[Any] = [Text(f"run {result.run_id}: {result.outcome}", style=f"bold {style}")]
    if result.detail:  # the reason, and for a failed node the last lines of its log: as text
        detail = shown_lines(result.detail, LOG_LINE_LIMIT)
        lines.append(Text("\n".join(f"  {line}" for line in detail.splitlines())))
    if result.model_uri:
        lines.append(Text(f"  model:       {result.model_uri}"))
    if result.checkpoints_uri:
        lines.append(Text(f"  checkpoints: {result.checkpoints_uri}"))
    lines.append(
        Text(
            f"  wall time {fmt_duration(result.wall_s)}, attempts {whole(result.attempts)}, "
            f"teardown {figure(result.teardown_s, '.1f')}s, cost {_usd(result.cost_usd)}"
        )
    )
    if result.route:  # failover's path: the places tried, and where the run landed
        lines.append(Text(f"  place: {shown(result.route, LOG_LINE_LIMIT)}"))
    took = shown(time_line(result.trace), LOG_LINE_LIMIT)
    if took:  # where the wall time went (the run's trace)
        lines.append(Text(f"  time: {took}"))
    lines.extend(throughput_lines(result.throughput))
    if result.cost_by_node:
        table = Table(show_header=True, box=None, padding=(0, 2))
        table.add_column("node")
        table.add_column("cost", justify="right")
        table.add_column("billed idle", justify="right")
        for name, cost in sorted(result.cost_by_node.items()):
            idle = figure(result.billed_idle_s.get(name), ".1f")
            table.add_row(
                Text(shown(name, NAME_LIMIT)),
                Text(_usd(cost)),
                Text(idle if idle == "-" else f"{idle}s"),
            )
        lines.append(table)
        if result.billed_idle_s:
            lines.append(
                Text(
                    f"  billed idle (job end -> node deleted): "
                    f"{figure(sum(result.billed_idle_s.values()), '.1f')} node-seconds"
                )
            )
    return Group(*lines)


def throughput_lines(tp: Throughput | None) -> list[Any]:
    """The summary's and `status`'s throughput: the cluster's examples/s, $ per epoch and per
    million examples, and per node its examples/s, step times, efficiency against the fastest
    node and flags. Nothing when no node measured anything."""
    if tp is None or not tp.measured:
        return []
    lines: list[Any] = [
        Text(f"  throughput: cluster {fmt_rate(tp.cluster_examples_per_s)}{_unit_costs(tp)}")
    ]
    table = Table(show_header=True, box=None, padding=(0, 2))
    for col in ("node", "examples/s", "step p50", "step p95", "efficiency", "gpu", ""):
        table.add_column(col, justify="left" if col in ("node", "") else "right")
    for name, rate in sorted(tp.nodes.items()):
        eff = "-" if rate.efficiency is None else figure(rate.efficiency, ".0%", 6)
        table.add_row(
            Text(shown(name, NAME_LIMIT)),
            Text(fmt_rate(rate.examples_per_s)),
            Text(_millis(rate.step_p50_s)),
            Text(_millis(rate.step_p95_s)),
            Text(eff),
            Text(_percent(rate.gpu_util_percent)),
            _flag(rate),
        )
    lines.append(table)
    return lines


def _millis(seconds: float | None) -> str:
    number = finite(seconds)
    text = "-" if number is None else figure(number * 1000, ".0f", 9)
    return text if text == "-" else f"{text}ms"
