"""The report's timeline of a traced run (issue 20): the run's spans (jobs/trace.py) as lanes on
the report's time axis, one for the controller and one per node, drawn on a matplotlib Axes.

`lanes` lays them out (pure); `draw` draws them (matplotlib is the caller's, report_html's, which
imports it). In a lane, row 0 holds the recorder's top level (the controller's phases under
"run", a node's spans under "node") in time order; a top-level span that overlaps one already
there (a node's "first step" inside its "training") goes to the next free row, and so do the
children long enough to see (the controller's "create <node>" and "delete <resource>", the
startup script's phases under "boot"), from row 1. Each row is filled by start time, the longer
span first. The root span ("run", "node") is the lane's pale
background. Every bar has a label: written on it where it fits, else in the legend (one entry
per colour).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cloudtrain.jobs import trace as tr

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

CONTROLLER = "controller"  # the controller's lane
MAX_ROWS = 4  # rows per lane; more overlapping spans share the last
MAX_LEGEND = 24  # legend entries drawn; the rest are one "+N more" entry
VISIBLE = 0.008  # a child shorter than this share of the axis is not drawn
OVERLAP = 0.001  # spans that overlap by less than this share of the axis are side by side
FONT_PT = 7.0
COLOURS = {
    tr.STARTUP: "#c7c7c7",
    tr.BUNDLE: "#bcbd22",
    tr.BUCKET: "#17becf",
    tr.PROVISION: "#7f9cc0",
    tr.CREATE: "#1f77b4",
    tr.WATCH: "#c6dbef",  # waiting on the nodes: pale
    tr.END: "#8c564b",
    tr.STOP: "#d62728",
    tr.TEARDOWN: "#ff7f0e",
    tr.BOOT: "#e377c2",
    tr.AGENT_START: "#9edae5",
    tr.RESTORE: "#c49c94",
    tr.REGISTER: "#aec7e8",
    tr.RENDEZVOUS: "#9467bd",
    tr.PEERS: "#c5b0d5",
    tr.SETUP: "#dbdb8d",
    tr.TRAINING: "#2ca02c",
    tr.FIRST_STEP: "#98df8a",
    tr.FINISH: "#ff9896",
}
OTHER_COLOURS = ("#f7b6d2", "#ffbb78", "#8c6d31", "#637939", "#7b4173", "#5254a3", "#843c39")
BACKGROUND = "#eeeeee"


@dataclass(frozen=True)
class Bar:
    """One span as drawn: `label` (its name, "#n" added for attempt n > 1), `key` (its colour
    and legend entry: a top-level span's name, a controller child's parent's, a node child's
    "parent: name"), its times (unix seconds) and its row in the lane."""

    label: str
    key: str
    start: float
    end: float
    row: int


@dataclass(frozen=True)
class Lane:
    """One recorder's lane: its name ("controller", a node id), its bars (by start time), how
    many rows they use and its root span's (start, end), if recorded."""

    name: str
    bars: tuple[Bar, ...]
    rows: int
    root: tuple[float, float] | None


def lanes(spans: Sequence[tr.Span], nodes: Sequence[str], axis_s: float) -> list[Lane]:
    """The lanes of `spans`: the controller's (if it recorded any), then each node's with
    spans, in `nodes`' order and then any other in name order. `axis_s` is the drawn time
    axis' length in seconds (what "long enough to see" is relative to). Pure."""
    axis_s = max(axis_s, 1e-9)
    named = [n for n in nodes if n]
    by_node: dict[str, list[tr.Span]] = {}
    for span in spans:
        by_node.setdefault(span.node, []).append(span)
    recorders = ["", *named, *sorted(set(by_node) - {""} - set(named))]
    return [_lane(who, by_node[who], axis_s) for who in recorders if by_node.get(who)]


def _lane(who: str, spans: list[tr.Span], axis_s: float) -> Lane:
    root_name = tr.NODE if who else tr.ROOT
    roots = [s for s in spans if s.name == root_name and s.parent in ("", root_name)]
    rest = [s for s in spans if s not in roots]
    tops = sorted(
        (s for s in rest if s.parent == root_name), key=lambda s: (s.start, -s.seconds, s.name)
    )
    children = sorted(
        (s for s in rest if s.parent != root_name and s.seconds >= VISIBLE * axis_s),
        key=lambda s: (s.start, -s.seconds, s.name),
    )
    rows: list[list[tuple[float, float]]] = []
    bars = []
    for span, lowest in [*((s, 0) for s in tops), *((s, 1) for s in children)]:
        row = _free_row(rows, span, lowest, OVERLAP * axis_s)
        if span.parent == root_name:
            key = span.name
        else:
            key = span.parent if not who else f"{span.parent}: {span.name}"
        label = span.name + (f" #{span.attempt}" if span.attempt > 1 else "")
        bars.append(Bar(label, key, span.start, span.end, row))
    root = (min(s.start for s in roots), max(s.end for s in roots)) if roots else None
    bars.sort(key=lambda b: (b.start, b.row))
    return Lane(who or CONTROLLER, tuple(bars), max(1, len(rows)), root)


def _free_row(
    rows: list[list[tuple[float, float]]], span: tr.Span, lowest: int, slack: float
) -> int:
    """The first row from `lowest` where `span` overlaps nothing (by more than `slack`); the
    last row when every one is taken. Records it there."""
    row = MAX_ROWS - 1
    for r in range(lowest, MAX_ROWS):
        while len(rows) <= r:
            rows.append([])
        if all(min(span.end, b) - max(span.start, a) <= slack for a, b in rows[r]):
            row = r
            break
    while len(rows) <= row:
        rows.append([])
    rows[row].append((span.start, span.end))
    return row


def colours(laid: Sequence[Lane]) -> dict[str, str]:
    """Each key's colour: the span names' own, else the next of OTHER_COLOURS. Pure."""
    out: dict[str, str] = {}
    others = 0
    for lane in laid:
        for bar in lane.bars:
            if bar.key in out:
                continue
            if bar.key in COLOURS:
                out[bar.key] = COLOURS[bar.key]
            else:
                out[bar.key] = OTHER_COLOURS[others % len(OTHER_COLOURS)]
                others += 1
    return out


def height_in(laid: Sequence[Lane]) -> float:
    """The figure's height in inches for these lanes. Pure."""
    return max(1.8, 1.3 + 0.3 * sum(lane.rows for lane in laid))


def draw(
    fig: Figure,
    ax: Axes,
    laid: Sequence[Lane],
    origin: float,
    scale: float,
    xlim: tuple[float, float],
    width_in: float,
) -> None:
    """Draw `laid` on `ax` of `fig`: x is (time - origin) / scale within `xlim`, lanes top to
    bottom with their names as y tick labels, labels on the bars wide enough (`width_in`: the
    axes' width in inches, about), a legend of the colours under the plot."""
    palette = colours(laid)
    per_inch = max(1e-12, (xlim[1] - xlim[0]) / max(width_in, 0.1))
    least = (xlim[1] - xlim[0]) * 0.003  # an instant still shows as a sliver
    ticks, names, handles = [], [], {}
    y = 0.0
    for index, lane in enumerate(laid):
        if index:
            ax.axhline(y - 0.5, color="#bbbbbb", linewidth=0.6)
        if lane.root is not None:
            a, b = ((t - origin) / scale for t in lane.root)
            ax.broken_barh(
                [(a, max(least, b - a))], (y - 0.5, lane.rows), facecolors=BACKGROUND, zorder=0
            )
        for bar in lane.bars:
            start = (bar.start - origin) / scale
            width = max(least, (bar.end - bar.start) / scale)
            tall = 0.8 if bar.row == 0 else 0.6
            drawn = ax.broken_barh(
                [(start, width)],
                (y + bar.row - tall / 2, tall),
                facecolors=palette[bar.key],
                edgecolor="white",
                linewidth=0.4,
                zorder=2,
            )
            handles.setdefault(bar.key, drawn)
            if width / per_inch >= len(bar.label) * FONT_PT * 0.55 / 72 + 0.06:
                ax.text(
                    start + width / 2,
                    y + bar.row,
                    bar.label,
                    ha="center",
                    va="center",
                    fontsize=FONT_PT,
                    clip_on=True,
                    zorder=3,
                )
        ticks.append(y)
        names.append(lane.name)
        y += lane.rows
    ax.set_yticks(ticks, names)
    ax.set_ylim(y - 0.5, -0.5)  # top to bottom
    ax.set_xlim(*xlim)
    ax.grid(axis="y", visible=False)
    if handles:
        shown, labels = capped(list(handles.values()), list(handles))
        fig.legend(
            shown, labels, fontsize=FONT_PT, loc="outside lower center", ncols=min(6, len(shown))
        )


def capped(handles: list[Any], labels: list[str]) -> tuple[list[Any], list[str]]:
    """A legend's entries, at most MAX_LEGEND of them and then one "+N more" (a trace or a run
    with thousands of names would draw a legend taller than the page). Pure but for making
    the blank handle."""
    if len(handles) <= MAX_LEGEND:
        return handles, labels
    from matplotlib.patches import Patch

    blank = Patch(facecolor="none", edgecolor="none")
    more = f"+{len(handles) - MAX_LEGEND} more"
    return [*handles[:MAX_LEGEND], blank], [*labels[:MAX_LEGEND], more]


def legend(ax: Axes, fontsize: float) -> None:
    """Draw `ax`'s legend of its labelled artists, capped (see `capped`)."""
    handles, labels = ax.get_legend_handles_labels()
    shown, names = capped(handles, labels)
    ax.legend(shown, names, fontsize=fontsize)
