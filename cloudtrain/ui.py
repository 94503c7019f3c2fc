"""Everything the user sees: the plan table, the live node view, log lines and the summary.

On a terminal the run is a rich Live view (nodes, states, epoch, last line, elapsed, cost) with log
lines scrolling above it. Elsewhere (CI, pipes) the same information is printed as plain lines,
only when something changes. Imports rich only; never TensorFlow or a cloud SDK.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from cloudtrain.plan import Plan
    from cloudtrain.runtypes import RunResult, RunView

_NATIVE_LOG = re.compile(r"^(?:[IWE]\d{4} |WARNING: All log messages before absl)")
_STATE_STYLE = {
    "succeeded": "green",
    "running": "cyan",
    "failed": "red",
    "stopped": "yellow",
    "rendezvous": "magenta",
}


def fmt_duration(seconds: float) -> str:
    """'1h02m', '3m05s' or '12.3s'."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def plan_table(plan: Plan) -> Group:
    """The plan as a table plus totals, alternatives and notes."""
    table = Table(title=f"plan for {plan.run_name} on {plan.provider}", title_justify="left")
    for col in ("role", "nodes", "instance", "accelerator", "spot", "zone", "$/h each"):
        table.add_column(col, justify="right" if col in ("nodes", "$/h each") else "left")
    for role, count in plan.roles().items():
        node = next(n for n in plan.nodes if n.role == role)
        accel = f"{node.accelerator}x{node.accelerator_count}" if node.accelerator else "-"
        table.add_row(
            role,
            str(count),
            node.instance_type,
            accel,
            "yes" if node.spot else "no",
            node.zone or plan.region,
            f"{node.price_hourly:.4f}",
        )
    lines: list[Any] = [table]
    budget = f" (budget ${plan.max_cost_usd:.2f})" if plan.max_cost_usd is not None else ""
    lines.append(
        Text(
            f"strategy {plan.strategy}, {plan.node_count} node(s) in {plan.region}: "
            f"${plan.hourly_usd:.4f}/h, at most ${plan.estimate_usd:.2f} "
            f"for max_hours {plan.max_hours:g}{budget}"
        )
    )
    for alt in plan.alternatives:
        lines.append(Text(f"  alternative: {alt.description}: ${alt.hourly_usd:.4f}/h", "dim"))
    for note in plan.notes:
        lines.append(Text(f"  note: {note}", "yellow"))
    return Group(*lines)


def node_table(view: RunView) -> Group:
    """The live view of a run."""
    head = Text(
        f"{view.run_id}  {view.phase}  attempt {view.attempt}  "
        f"{fmt_duration(view.elapsed_s)}  ${view.cost_usd:.4f} (${view.hourly_usd:.4f}/h)",
        style="bold",
    )
    table = Table(expand=True)
    for col in ("node", "cloud", "agent", "epoch", "last line"):
        table.add_column(
            col, overflow="ellipsis", no_wrap=True, ratio=4 if col == "last line" else 1
        )
    for nv in view.nodes:
        epoch = f"{nv.epoch}/{nv.epochs}" if nv.epoch else "-"
        table.add_row(
            f"{nv.role}-{nv.index}",
            nv.cloud_state,
            Text(nv.agent_state, _STATE_STYLE.get(nv.agent_state, "")),
            epoch,
            nv.last_line,
        )
    return Group(head, table)


class ConsoleObserver:
    """The orchestrator's observer: rich Live on a terminal, plain lines otherwise."""

    def __init__(self, console: Console | None = None, show_logs: bool = True) -> None:
        self.console = console or Console(stderr=False)
        self.show_logs = show_logs
        self.live: Live | None = None
        self._last_plain: dict[str, str] = {}
        self._last_phase = ""

    def __enter__(self) -> ConsoleObserver:
        if self.console.is_terminal:
            self.live = Live(console=self.console, refresh_per_second=4, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)
            self.live = None

    def event(self, message: str) -> None:
        """A lifecycle event (created, restart, teardown...)."""
        stamp = time.strftime("%H:%M:%S")
        self.console.print(
            f"[dim]{stamp}[/dim] [bold]cloudtrain[/bold] {message}", highlight=False, soft_wrap=True
        )

    def log_line(self, node: str, line: str) -> None:
        """One line of a node's output."""
        if self.show_logs:
            style = "dim" if _NATIVE_LOG.match(line) else ""
            text = Text(f"[{node}] ", style="blue") + Text(line, style=style)
            self.console.print(text, highlight=False, soft_wrap=True)

    def update(self, view: RunView) -> None:
        """Redraw the live view; on a plain stream print only what changed."""
        if self.live is not None:
            self.live.update(node_table(view))
            return
        if view.phase != self._last_phase:
            self._last_phase = view.phase
            self.event(f"phase: {view.phase}")
        for nv in view.nodes:
            key = f"{nv.role}-{nv.index}"
            state = f"{nv.cloud_state}/{nv.agent_state} attempt {nv.attempt}"
            if self._last_plain.get(key) != state:
                self._last_plain[key] = state
                self.event(f"{key}: {state}")


def summary(result: RunResult) -> Group:
    """The end-of-run summary: outcome, where the outputs are, wall time, cost by node."""
    style = "green" if result.ok else "red"
    lines: list[Any] = [Text(f"run {result.run_id}: {result.outcome}", style=f"bold {style}")]
    if result.detail:  # the reason, and for a failed node the last lines of its log
        lines.append(Text("\n".join(f"  {line}" for line in result.detail.splitlines())))
    if result.model_uri:
        lines.append(Text(f"  model:       {result.model_uri}"))
    if result.checkpoints_uri:
        lines.append(Text(f"  checkpoints: {result.checkpoints_uri}"))
    lines.append(
        Text(
            f"  wall time {fmt_duration(result.wall_s)}, attempts {result.attempts}, "
            f"teardown {result.teardown_s:.1f}s, cost ${result.cost_usd:.4f}"
        )
    )
    if result.cost_by_node:
        table = Table(show_header=True, box=None, padding=(0, 2))
        table.add_column("node")
        table.add_column("cost", justify="right")
        table.add_column("billed idle", justify="right")
        for name, cost in sorted(result.cost_by_node.items()):
            idle = result.billed_idle_s.get(name)
            table.add_row(name, f"${cost:.4f}", "-" if idle is None else f"{idle:.1f}s")
        lines.append(table)
        if result.billed_idle_s:
            lines.append(
                Text(
                    f"  billed idle (job end -> node deleted): "
                    f"{sum(result.billed_idle_s.values()):.1f} node-seconds"
                )
            )
    return Group(*lines)
