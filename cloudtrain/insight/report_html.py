"""`cloudtrain report`'s page: one self-contained HTML file of a run
(cloudtrain/insight/report_data.py).

A header table (run id, provider, outcome, wall time, cost, nodes) and, for a traced run, the
breakdown of its wall time into phases (trace_view.breakdown), then one `<figure id="plot-...">`
per plot with its caption: the loss and metrics per epoch, examples/s per node over time, GPU
utilisation per node, the timeline of the run's phases (its trace's spans, a lane per recorder:
cloudtrain/insight/report_timeline.py; for a run without spans a Gantt chart derived from the
ledger and
the bucket) and the cost over time, then the ledger's events (not its "span" events: those are
the trace). The plots are inline SVG drawn by matplotlib (the `report` extra, imported inside
functions; dense series are rasterized into the SVG as PNG). The page has no JavaScript and
loads nothing: its Content-Security-Policy allows only its own inline styles and data: images. A
plot without data says so ("no data", "no GPU samples") instead of drawing empty axes.
Everything from the ledger or the bucket is escaped.
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain.core.errors import UsageError
from cloudtrain.core.node_text import fmt_duration
from cloudtrain.insight import report_timeline
from cloudtrain.insight.report_data import (
    BOOT,
    BOOT_PHASES,
    PROVISION,
    RENDEZVOUS,
    RESTARTS,
    TEARDOWN,
    TRAINING,
    ReportData,
    number,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INSTALL_HINT = "pip install 'cloudtrain[report]'"
PLOT_IDS = ("plot-loss", "plot-throughput", "plot-gpu", "plot-timeline", "plot-cost")
DENSE_POINTS = 2000  # a series longer than this is rasterized (the SVG stays small)
SPARSE_POINTS = 60  # a series shorter than this has markers
MAX_PANELS = 4  # metric panels in the loss plot (loss first)
MAX_EVENTS = 200
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
WIDTH_IN, HEIGHT_IN = 9.0, 3.4
COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
)
STARTING = "starting"
PHASE_COLOURS = {
    PROVISION: "#7f9cc0",
    "driver": "#8c564b",
    "python": "#e377c2",
    "bundle": "#bcbd22",
    RENDEZVOUS: "#9467bd",
    TRAINING: "#2ca02c",
    STARTING: "#b5dfb5",  # the job before its first record: imports, setup, restore
    RESTARTS: "#d62728",
    TEARDOWN: "#ff7f0e",
}
_SVG_START_RE = re.compile(r"<svg\b")
_METADATA_RE = re.compile(r"<metadata>.*?</metadata>\s*", re.S)  # RDF namespaces: no use here
_RC = {
    "svg.fonttype": "none",  # text as <text>: small, and the browser's fonts draw it
    "svg.hashsalt": "cloudtrain-report",  # stable ids: the same run gives the same page
    "text.parse_math": False,  # a '$' in a metric or node name is text, not mathtext
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def require_matplotlib() -> None:
    """UsageError naming the extra to install unless matplotlib can be imported. Imports it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise UsageError(
            "cloudtrain report draws its plots with matplotlib, which is not installed",
            hint=INSTALL_HINT,
        ) from exc


@dataclass(frozen=True)
class Plot:
    """One figure of the page: its id, title, caption and SVG (None: nothing to draw, and
    `empty` says what is missing)."""

    id: str
    title: str
    caption: str
    svg: str | None
    empty: str = ""


def render(data: ReportData) -> str:
    """The whole page for `data`. Pure apart from matplotlib (UsageError when it is missing);
    CPU-bound: about a second for a short run."""
    require_matplotlib()
    import matplotlib

    with matplotlib.rc_context(_RC):
        plots = [plotter(data) for plotter in PLOTTERS]
    return _page(data, plots)


def write(data: ReportData, path: Path) -> Path:
    """Render the page and write it to `path` (replacing a file there; the folder must exist).
    Returns `path`. Blocks for the rendering."""
    text = render(data)
    path.write_text(text, encoding="utf-8")
    return path


# --- the page ------------------------------------------------------------------------------------
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem auto; max-width: 70rem; color: #222;
  background: #fff; }
h1 { font-size: 1.4rem; }
table { border-collapse: collapse; margin-bottom: 1.5rem; }
th, td { text-align: left; padding: 0.2rem 0.8rem 0.2rem 0; vertical-align: top; }
th { color: #555; font-weight: 600; }
figure { margin: 0 0 2rem 0; }
figure svg { width: 100%; height: auto; display: block; }
figcaption { color: #444; font-size: 0.9rem; margin-top: 0.3rem; }
.empty { color: #888; font-size: 1.1rem; padding: 2rem 0; border: 1px dashed #ccc;
  text-align: center; }
.events td { font-size: 0.85rem; }
.breakdown td:nth-child(n+2), .breakdown th:nth-child(n+2) { text-align: right; }
"""


def _page(data: ReportData, plots: list[Plot]) -> str:
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        f"<title>cloudtrain report: {e(data.run_id)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>cloudtrain run {e(data.run_id)}</h1>",
        _summary(data),
        _breakdown(data),
    ]
    for plot in plots:
        parts.append(f'<figure id="{plot.id}" class="plot">')
        parts.append(f"<h2>{e(plot.title)}</h2>")
        if plot.svg is None:
            parts.append(f'<div class="empty">{e(plot.empty)}</div>')
        else:
            parts.append(plot.svg)
        parts.append(f"<figcaption>{e(plot.caption)}</figcaption></figure>")
    parts.append(_events(data))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _summary(data: ReportData) -> str:
    e = html.escape
    outcome = data.outcome or f"({data.status})"
    if data.detail and data.outcome not in (None, "succeeded"):
        outcome += f": {data.detail}"
    nodes = ", ".join(
        f"{n} ({data.instance_types[n]})" if data.instance_types.get(n) else n for n in data.nodes
    )
    rows = [
        ("run id", data.run_id),
        ("job", data.name),
        ("provider", data.provider + (f" ({data.region})" if data.region else "")),
        ("outcome", outcome),
        ("started", _utc(data.started)),
        ("wall time", fmt_duration(data.wall_s) + ("" if data.ended is not None else " so far")),
        ("cost", f"${data.cost_usd:.4f} (plan: ${data.hourly_usd:.4f}/h)"),
        ("nodes", f"{len(data.nodes)}: {nodes}" if data.nodes else "none recorded"),
        ("attempts", str(data.attempts) if data.attempts else "unknown"),
    ]
    if data.store_error:
        rows.append(("bucket", f"not readable: {data.store_error}"))
    if data.skipped:
        rows.append(("skipped", f"{data.skipped} unreadable metrics lines or documents"))
    body = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in rows)
    return f'<table class="summary">{body}</table>'


def _breakdown(data: ReportData) -> str:
    """The table of the run's phases (seconds, share of the run); "" for a run without them."""
    if not data.phases:
        return ""
    e = html.escape
    total = sum(p.seconds for p in data.phases)
    rows = "".join(
        f"<tr><td>{e(p.name)}</td><td>{p.seconds:.2f}</td>"
        f"<td>{100 * p.seconds / total if total > 0 else 0:.1f} %</td></tr>"
        for p in data.phases
    )
    return (
        '<h2 id="breakdown">Where the time went</h2><table class="breakdown">'
        "<tr><th>phase</th><th>seconds</th><th>share</th></tr>"
        f"{rows}<tr><th>run</th><th>{total:.2f}</th><th>100 %</th></tr></table>"
    )


def _events(data: ReportData) -> str:
    e = html.escape
    if not data.events:
        return ""
    shown = data.events[-MAX_EVENTS:]
    rows = "".join(
        f"<tr><td>+{fmt_duration(max(0.0, t - data.started))}</td><td>{e(kind)}</td>"
        f"<td>{e(message)}</td></tr>"
        for t, kind, message in shown
    )
    more = len(data.events) - len(shown)
    head = f"<h2>Events</h2><p>the last {len(shown)} of {len(data.events)}</p>" if more else ""
    return (head or "<h2>Events</h2>") + f'<table class="events">{rows}</table>'


def _utc(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


# --- drawing helpers -----------------------------------------------------------------------------
@contextmanager
def _figure(height: float = HEIGHT_IN, panels: int = 1) -> Iterator[tuple[Figure, list[Axes]]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_IN, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, panels, i + 1) for i in range(panels)]
    yield fig, axes


def _svg(fig: Figure) -> str:
    """The figure as an inline <svg> element (no XML prolog or doctype)."""
    out = io.StringIO()
    fig.savefig(out, format="svg", dpi=100, metadata={"Date": None})
    text = out.getvalue()
    m = _SVG_START_RE.search(text)
    return _METADATA_RE.sub("", text[m.start() :] if m else text)


def _time_axis(data: ReportData) -> tuple[float, str]:
    """(divisor, label) for times since the run's start: seconds, minutes or hours."""
    if data.wall_s > 3 * 3600:
        return 3600.0, "hours since the run started"
    if data.wall_s > 180:
        return 60.0, "minutes since the run started"
    return 1.0, "seconds since the run started"


def _colour(data: ReportData, node: str) -> str:
    index = data.nodes.index(node) if node in data.nodes else len(data.nodes)
    return COLOURS[index % len(COLOURS)]


def _line(ax: Axes, xs: list[float], ys: list[float], **style: Any) -> None:
    """A series; with markers when sparse (a single sample is a dot), rasterized when dense,
    so the SVG stays small."""
    if len(xs) < SPARSE_POINTS:
        style.setdefault("marker", "o")
        style.setdefault("markersize", 3)
    ax.plot(xs, ys, rasterized=len(xs) > DENSE_POINTS, **style)


def _extent(data: ReportData, scale: float) -> tuple[float, float]:
    """The x range of every plot over time, in `scale` from the run's start (the ledger's
    record): the whole run, and the controller's spans before it (the CLI's start-up) or after
    (the nodes' spans, from the bucket, are drawn within it)."""
    mine = [s for s in data.trace if not s.node]
    left = min([0.0, *(s.start - data.started for s in mine)])
    right = max([data.wall_s, 1e-9, *(s.end - data.started for s in mine)])
    return left / scale, (right + 0.02 * (right - left)) / scale


def _over_the_run(ax: Axes, data: ReportData, scale: float, xlabel: str) -> None:
    """The x axis of a plot over time: the whole run (so the plots line up), in `scale`."""
    ax.set_xlim(*_extent(data, scale))
    ax.set_xlabel(xlabel)


# --- the plots -----------------------------------------------------------------------------------
def _values(record: dict[str, Any]) -> dict[str, float]:
    """An epoch record's numbers: `loss` and every numeric `metrics` entry."""
    out: dict[str, float] = {}
    metrics = record.get("metrics")
    if isinstance(metrics, dict):
        for name, value in metrics.items():
            v = number(value)
            if isinstance(name, str) and v is not None:
                out[name[:60]] = v
    loss = number(record.get("loss"))
    if loss is not None:
        out["loss"] = loss
    return out


def _panels(names: set[str]) -> list[str]:
    """The metric panels: 'loss' first, then the others' base names (val_x is drawn with x)."""
    bases = {n.removeprefix("val_") for n in names}
    ordered = (["loss"] if "loss" in bases else []) + sorted(bases - {"loss"})
    return ordered[:MAX_PANELS]


def _loss_plot(data: ReportData) -> Plot:
    title = "Loss and metrics per epoch"
    series: dict[str, list[tuple[int, dict[str, float]]]] = {}
    for node in data.nodes:
        points = [(int(r["epoch"]), _values(r)) for r in data.epochs(node)]
        points = [(e, v) for e, v in points if v]
        if points:
            series[node] = points
    if not series:
        return Plot("plot-loss", title, "No epoch records: no data.", None, "no data")
    chief = data.chief if data.chief in series else next(iter(series))
    shown = [chief] + [n for n in series if n != chief and series[n] != series[chief]]
    names = {name for _, values in series[chief] for name in values}
    panels = _panels(names)
    with _figure(panels=len(panels)) as (fig, axes):
        for ax, base in zip(axes, panels, strict=True):
            for node in shown:
                for name, style in ((base, "-"), (f"val_{base}", "--")):
                    pts = [(e, v[name]) for e, v in series[node] if name in v]
                    if pts:
                        _line(
                            ax,
                            [p[0] for p in pts],
                            [p[1] for p in pts],
                            linestyle=style,
                            marker="o",
                            markersize=3,
                            color=_colour(data, node),
                            label=f"{node} {name}",
                        )
            ax.set_title(base)
            ax.set_xlabel("epoch")
            ax.xaxis.get_major_locator().set_params(integer=True)
            report_timeline.legend(ax, 7)
        svg = _svg(fig)
    same = len(shown) == 1 and len(series) > 1
    caption = f"Per epoch, from {chief}'s records" + (
        f" (the other {len(series) - 1} node(s) recorded the same values)."
        if same
        else "; other nodes where theirs differ."
    )
    return Plot("plot-loss", title, caption + " Dashed: validation.", svg)


def _throughput_plot(data: ReportData) -> Plot:
    title = "Examples per second per node"
    field, unit = "examples_per_s", "examples/s"
    if not any(
        number(r.get(field)) is not None
        for node in data.nodes
        for r in data.records.get(node, [])
        if r["kind"] in ("window", "epoch")
    ):
        field, unit = "steps_per_s", "steps/s"  # a job without the runtime: Keras' lines only
    scale, xlabel = _time_axis(data)
    lines: dict[str, tuple[list[float], list[float], str]] = {}
    for node in data.nodes:
        for kind in ("window", "epoch"):  # the windows' finer series, else the epochs'
            pts = [
                ((r["time"] - data.started) / scale, v)
                for r in data.of_kind(node, kind)
                if (v := number(r.get(field))) is not None
            ]
            if pts:
                lines[node] = ([p[0] for p in pts], [p[1] for p in pts], kind)
                break
    if not lines:
        return Plot(
            "plot-throughput", title, "No window or epoch records: no data.", None, "no data"
        )
    with _figure() as (fig, (ax,)):
        for node, (xs, ys, kind) in lines.items():
            _line(ax, xs, ys, color=_colour(data, node), label=f"{node} ({kind}s)")
        _over_the_run(ax, data, scale, xlabel)
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        report_timeline.legend(ax, 7)
        svg = _svg(fig)
    caption = (
        f"Each node's {unit} over time (its share of the global batch), from its window "
        "records during epochs, else its epoch records."
    )
    return Plot("plot-throughput", title, caption, svg)


def _gpu_plot(data: ReportData) -> Plot:
    title = "GPU utilisation per node"
    scale, xlabel = _time_axis(data)
    lines: dict[str, tuple[list[float], list[float]]] = {}
    for node in data.nodes:
        xs, ys = [], []
        for r in data.of_kind(node, "gpu"):
            gpus = r.get("gpus")
            utils = [
                u
                for g in (gpus if isinstance(gpus, list) else [])
                if isinstance(g, dict) and (u := number(g.get("util_percent"))) is not None
            ]
            if utils:
                xs.append((r["time"] - data.started) / scale)
                ys.append(sum(utils) / len(utils))
        if xs:
            lines[node] = (xs, ys)
    if not lines:
        return Plot(
            "plot-gpu",
            title,
            "No nvidia-smi samples (a CPU node, or an agent without metrics).",
            None,
            "no GPU samples",
        )
    with _figure() as (fig, (ax,)):
        for node, (xs, ys) in lines.items():
            _line(ax, xs, ys, color=_colour(data, node), label=node)
        _over_the_run(ax, data, scale, xlabel)
        ax.set_ylabel("GPU utilisation (%)")
        ax.set_ylim(0, 105)
        report_timeline.legend(ax, 7)
        svg = _svg(fig)
    caption = "Each node's mean utilisation over its GPUs, from the agent's nvidia-smi samples."
    return Plot("plot-gpu", title, caption, svg)


def _lanes(data: ReportData) -> list[str]:
    present = {s.lane for s in data.spans}
    boots = [f"{BOOT} {n}" for n in data.nodes if f"{BOOT} {n}" in present]
    order = [PROVISION, *boots, RENDEZVOUS, TRAINING, RESTARTS, TEARDOWN]
    return [lane for lane in order if lane in present]


def _trace_plot(data: ReportData) -> Plot:
    """The timeline of a traced run: its spans, a lane per recorder (report_timeline)."""
    scale, xlabel = _time_axis(data)
    xlim = _extent(data, scale)
    laid = report_timeline.lanes(data.trace, data.nodes, (xlim[1] - xlim[0]) * scale)
    with _figure(height=report_timeline.height_in(laid)) as (fig, (ax,)):
        report_timeline.draw(fig, ax, laid, data.started, scale, xlim, WIDTH_IN * 0.85)
        ax.set_xlabel(xlabel)
        svg = _svg(fig)
    caption = (
        "The run's trace. Controller: its phases from the CLI's start to the teardown's end "
        "(the ledger's spans; before 0 is its start-up, before the run's record), with the "
        "create and delete calls under them. Each node: its spans (the bucket's trace/<node>"
        ".json), from its startup script's phases under boot to the end of its training and "
        "final flushes. Pale: the recorder's whole span. #n: attempt n."
    )
    return Plot("plot-timeline", "Timeline of the run's phases", caption, svg)


def _timeline_plot(data: ReportData) -> Plot:
    """The timeline: the trace's lanes, else (a run without spans) the derived Gantt chart."""
    if data.trace:
        return _trace_plot(data)
    title = "Timeline of the run's phases"
    lanes = _lanes(data)
    if not lanes:
        return Plot(
            "plot-timeline", title, "Nothing timed in the ledger or bucket.", None, "no data"
        )
    scale, xlabel = _time_axis(data)
    ends = [s.end for s in data.spans] + [data.started + data.wall_s]
    total = max(1e-9, (max(ends) - data.started) / scale)
    least = total * 0.004  # an instant (a 0 s phase) still shows as a sliver
    height = max(1.6, 0.9 + 0.32 * len(lanes))
    with _figure(height=height) as (fig, (ax,)):
        seen: set[str] = set()
        for row, lane in enumerate(lanes):
            for s in (s for s in data.spans if s.lane == lane):
                key = s.label if lane.startswith(BOOT) or s.label == STARTING else lane
                colour = PHASE_COLOURS.get(key, "#7f7f7f")
                start = (s.start - data.started) / scale
                width = max(least, (s.end - s.start) / scale)
                ax.broken_barh(
                    [(start, width)],
                    (row - 0.38, 0.76),
                    facecolors=colour,
                    label=key if key not in seen else None,
                )
                seen.add(key)
        ax.set_yticks(range(len(lanes)), lanes)
        ax.invert_yaxis()
        ax.set_xlim(left=0, right=total * 1.02)
        ax.set_xlabel(xlabel)
        ax.grid(axis="y", visible=False)
        handles, labels = ax.get_legend_handles_labels()
        keyed = [
            (h, f"boot: {lb}" if lb in BOOT_PHASES else "training: starting")
            for h, lb in zip(handles, labels, strict=True)
            if lb in (*BOOT_PHASES, STARTING)
        ]
        if keyed:
            fig.legend(
                [h for h, _ in keyed],
                [lb for _, lb in keyed],
                fontsize=7,
                loc="outside lower right",
                ncols=len(keyed),
            )
        svg = _svg(fig)
    caption = (
        "Provision: the nodes' create calls (ledger). Boot: each node's startup phases "
        "(bootstrap logs, whole seconds). Rendezvous: per attempt, until every node registered. "
        "Training: starting (imports, setup) until the first record, then first to last epoch or "
        "window record (else the job: rendezvous to the nodes' final statuses). Restarts: the "
        "ledger's restart events. Teardown: the job's end to the last resource deleted."
    )
    return Plot("plot-timeline", title, caption, svg)


def _cost_plot(data: ReportData) -> Plot:
    title = "Cost over time"
    if len(data.cost_points) < 2:
        return Plot("plot-cost", title, "The ledger holds no billed node.", None, "no data")
    scale, xlabel = _time_axis(data)
    xs = [(t - data.started) / scale for t, _ in data.cost_points]
    ys = [usd for _, usd in data.cost_points]
    with _figure() as (fig, (ax,)):
        _line(ax, xs, ys, color="#d62728", linewidth=2, marker="")
        ax.fill_between(xs, ys, color="#d62728", alpha=0.15)
        _over_the_run(ax, data, scale, xlabel)
        ax.set_ylabel("cumulative USD")
        ax.set_ylim(bottom=0, top=max(ys[-1] * 1.1, 1e-4))
        ax.annotate(f"${ys[-1]:.4f}", (xs[-1], ys[-1]), ha="right", va="bottom")
        svg = _svg(fig)
    caption = (
        "What the nodes billed so far: each node's hourly price from its create intent to its "
        f"confirmed delete (the ledger's rule). Total ${data.cost_usd:.4f}."
    )
    return Plot("plot-cost", title, caption, svg)


PLOTTERS: tuple[Callable[[ReportData], Plot], ...] = (
    _loss_plot,
    _throughput_plot,
    _gpu_plot,
    _timeline_plot,
    _cost_plot,
)
