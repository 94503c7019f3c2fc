"""`cloudtrain scale`: run a job briefly at several worker counts and tabulate how it scales.

For each size the job's spec gets that many workers and a step limit ($CLOUDTRAIN_MAX_STEPS, at
which `runtime.callbacks()` stops fit); every size is planned first (a size that cannot be
planned, or is over the budget, is an error naming it and nothing is created), then each runs
to its end through `cloudtrain.api.launch`, one after the other (the sizes share the machine and
the quota), and is torn down as any run is. A run's figures are its `RunResult.throughput`
(cloudtrain/insight/throughput.py, from the nodes' last heartbeats); `table` turns them into the
rows the books draw by hand: examples/s, speed-up and efficiency against the smallest size, $/h
(the plan's) and $ per epoch, with the cheapest size per epoch and the fastest size within the
budget marked. The arithmetic (`table`) is pure; `measure_sizes` runs the sizes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from cloudtrain.core.errors import CloudtrainError, UsageError
from cloudtrain.jobs.strategies import STRATEGIES

if TYPE_CHECKING:
    from cloudtrain.api.results import Launch
    from cloudtrain.insight.throughput import Throughput
    from cloudtrain.jobspec.job import JobSpec
    from cloudtrain.run.view import Observer, RunResult

# the strategies whose worker count is the data-parallel width (their declaration's `scale`,
# jobs/strategies.py); the single-node ones run on one node by definition
SCALABLE = tuple(info.name for info in STRATEGIES.values() if info.scale)
CHEAPEST = "cheapest/epoch"
FASTEST = "fastest within budget"


# --- the sizes and their specs -----------------------------------------------------------------
def parse_sizes(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]: worker counts, ascending, without repeats. UsageError for anything
    but positive integers separated by commas. Pure."""
    sizes: set[int] = set()
    for part in text.split(","):
        word = part.strip()
        if not word.isdigit() or int(word) < 1:
            raise UsageError(
                f"--workers {text[:60]!r}: {word[:20]!r} is not a worker count",
                hint="give counts of 1 or more separated by commas, e.g. --workers 1,2,4",
            )
        sizes.add(int(word))
    return sorted(sizes)


def sized_spec(spec: JobSpec, workers: int, steps: int) -> JobSpec:
    """A copy of `spec` with `workers` worker nodes (its other roles as they are) whose training
    stops after `steps` steps: $CLOUDTRAIN_MAX_STEPS is exported at the start of the entrypoint
    (the spec's env may not name a CLOUDTRAIN_* variable; jobs/node_rules.py). Pure. UsageError
    for a strategy whose worker count is fixed, or a count the cluster rules refuse."""
    from pydantic import ValidationError

    from cloudtrain.core.env import MAX_STEPS
    from cloudtrain.jobs.node_rules import spec_exec_problem, text_problem
    from cloudtrain.jobspec.job import ClusterSpec

    strategy, varied = spec.cluster.strategy, spec.cluster.strategy_info.scale
    if varied is None:
        raise UsageError(
            f"strategy {strategy!r} runs on one node: its worker count cannot change",
            hint=f"scale a job whose strategy is one of {', '.join(SCALABLE)}",
        )
    if steps < 1:
        raise UsageError(f"--steps {steps}: a run needs at least 1 step")
    try:
        cluster = ClusterSpec.model_validate({**spec.cluster.model_dump(), varied: workers})
    except ValidationError as exc:
        msg = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        raise UsageError(f"{workers} worker(s): cluster: {msg}") from exc
    entrypoint = f"export {MAX_STEPS.name}={steps}; {spec.entrypoint}"
    problem = text_problem("entrypoint", entrypoint) or spec_exec_problem(
        spec.setup, entrypoint, spec.env_values()
    )
    if problem:
        raise UsageError(f"{workers} worker(s): entrypoint: {problem}")
    return spec.model_copy(update={"cluster": cluster, "entrypoint": entrypoint})


@dataclass(frozen=True)
class Size:
    """One size, ready to run: its worker count and its `Launch` (spec and plan)."""

    workers: int
    ready: Launch


def prepare_sizes(spec: JobSpec, sizes: Sequence[int], steps: int) -> list[Size]:
    """Every size's spec planned, before anything runs. Creates nothing, loads no cloud SDK.
    Raises UsageError naming the first size that cannot be (a refused count, no offer, over
    max_cost_usd)."""
    from cloudtrain import api
    from cloudtrain.api.results import Launch

    if not sizes:
        raise UsageError("--workers names no size")
    out: list[Size] = []
    for workers in sizes:
        one = sized_spec(spec, workers, steps)
        try:
            the_plan = api.plan(one)
        except CloudtrainError as exc:
            raise UsageError(f"{workers} worker(s): {exc}") from exc
        out.append(Size(workers, Launch(one, the_plan)))
    return out


# --- measurements and the table --------------------------------------------------------------
@dataclass(frozen=True)
class Measurement:
    """What one size's run gave: the cluster's examples/s, the slowest node's steps/s (the pace
    of the cluster), Keras' steps per epoch and the job's epochs (None: not reported), and the
    plan's $/h."""

    workers: int
    hourly_usd: float
    examples_per_s: float | None = None
    steps_per_s: float | None = None
    steps_per_epoch: int | None = None
    epochs: int | None = None
    epoch_seconds: float | None = None  # a whole epoch measured, when no projection can be
    run_id: str = ""


def measurement(
    workers: int,
    hourly_usd: float,
    tp: Throughput | None,
    *,
    epochs: int | None = None,
    run_id: str = "",
) -> Measurement:
    """One size's measurement from its run's throughput (None: nothing measured). Pure."""
    if tp is None:
        return Measurement(workers, hourly_usd, epochs=epochs, run_id=run_id)
    paces = [r.steps_per_s for r in tp.nodes.values() if r.steps_per_s]
    return Measurement(
        workers,
        hourly_usd,
        examples_per_s=tp.cluster_examples_per_s,
        steps_per_s=min(paces) if paces else None,
        steps_per_epoch=tp.steps_per_epoch,
        epochs=epochs,
        epoch_seconds=tp.epoch_seconds,
        run_id=run_id,
    )


@dataclass(frozen=True)
class Row:
    """One line of the table (None: not known, shown as '?')."""

    workers: int
    examples_per_s: float | None
    speedup: float | None
    efficiency: float | None
    hourly_usd: float
    epoch_seconds: float | None
    usd_per_epoch: float | None
    within_budget: bool | None
    marks: tuple[str, ...] = ()
    run_id: str = ""


@dataclass(frozen=True)
class ScaleTable:
    """The rows, and the notes under them: what the speed-up is measured against and by which
    rate, and the budget rule the 'fastest within budget' mark used."""

    rows: list[Row]
    baseline_workers: int | None
    rate: str  # "examples/s", or "steps/s" when some size reported no examples/s
    budget_rule: str
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """What `cloudtrain scale --json` prints. Pure."""
        return {
            "rows": [{**asdict(r), "marks": list(r.marks)} for r in self.rows],
            "baseline_workers": self.baseline_workers,
            "speedup_by": self.rate,
            "budget_rule": self.budget_rule,
            "notes": list(self.notes),
        }


def _epoch_seconds(m: Measurement) -> float | None:
    """An epoch's length: Keras' steps per epoch at the slowest node's pace (a short run ends
    inside its first epoch), else a whole epoch the run measured."""
    if m.steps_per_epoch and m.steps_per_s:
        return m.steps_per_epoch / m.steps_per_s
    return m.epoch_seconds


def _budget(
    costs: Mapping[int, float | None],
    hourly: Mapping[int, float],
    epochs: int | None,
    max_cost_usd: float | None,
    max_hours: float,
) -> tuple[dict[int, bool | None], str]:
    """Whether each size's whole job stays within max_cost_usd, and the rule used."""
    if max_cost_usd is None:
        return {w: True for w in costs}, "no max_cost_usd: every size is within budget"
    if epochs:
        within = {
            w: None if c is None else c * epochs <= max_cost_usd + 1e-9 for w, c in costs.items()
        }
        rule = f"within budget: $/epoch x {epochs} epochs <= max_cost_usd ${max_cost_usd:g}"
        return within, rule
    within = {w: hourly[w] * max_hours <= max_cost_usd + 1e-9 for w in costs}
    rule = (
        f"within budget: $/h x max_hours {max_hours:g} <= max_cost_usd ${max_cost_usd:g} "
        "(the job's epoch count is unknown)"
    )
    return within, rule


def table(
    measurements: Sequence[Measurement], *, max_cost_usd: float | None, max_hours: float
) -> ScaleTable:
    """The scaling table of the measured sizes (ascending workers). Speed-up is each size's rate
    over the baseline's: 1 worker when it was measured, else the smallest measured size;
    efficiency is the speed-up over the growth in workers. $/epoch is $/h x an epoch's seconds
    / 3600. Marks: the lowest $/epoch, and the highest rate among the sizes within budget
    (fewer workers win ties). Pure."""
    ms = sorted(measurements, key=lambda m: m.workers)
    by_examples = all(m.examples_per_s is not None for m in ms)
    rate_name = "examples/s" if by_examples or not ms else "steps/s"
    rates = {m.workers: m.examples_per_s if by_examples else m.steps_per_s for m in ms}
    measured = [m.workers for m in ms if rates[m.workers]]
    base = 1 if 1 in measured else (measured[0] if measured else None)
    seconds = {m.workers: _epoch_seconds(m) for m in ms}
    costs: dict[int, float | None] = {}
    for m in ms:
        length = seconds[m.workers]
        costs[m.workers] = None if length is None else m.hourly_usd * length / 3600.0
    epochs = max((m.epochs for m in ms if m.epochs), default=None)
    hourly = {m.workers: m.hourly_usd for m in ms}
    within, rule = _budget(costs, hourly, epochs, max_cost_usd, max_hours)
    priced = {w: c for w, c in costs.items() if c is not None}
    cheapest = min(priced, key=lambda w: (priced[w], w)) if priced else None
    affordable = [w for w in measured if within[w]]
    fastest = max(affordable, key=lambda w: (rates[w], -w)) if affordable else None
    rows = []
    for m in ms:
        w, rate = m.workers, rates[m.workers]
        speedup = rate / rates[base] if base is not None and rate and rates[base] else None
        efficiency = speedup / (w / base) if speedup is not None and base else None
        marks = tuple(
            name for name, hit in ((CHEAPEST, w == cheapest), (FASTEST, w == fastest)) if hit
        )
        rows.append(
            Row(
                workers=w,
                examples_per_s=m.examples_per_s,
                speedup=speedup,
                efficiency=efficiency,
                hourly_usd=m.hourly_usd,
                epoch_seconds=seconds[w],
                usd_per_epoch=costs[w],
                within_budget=within[w],
                marks=marks,
                run_id=m.run_id,
            )
        )
    notes = []
    if base is not None:
        notes.append(f"speed-up and efficiency by {rate_name}, against {base} worker(s)")
    if any(s is None for s in seconds.values()):
        notes.append("'?': the epoch's length is unknown (no steps per epoch reported)")
    if len(measured) < len(ms):
        notes.append("a size without figures: does the job use runtime.callbacks()?")
    return ScaleTable(rows, base, rate_name, rule, notes)


# --- running the sizes ---------------------------------------------------------------------------
@dataclass
class ScaleRun:
    """What `measure_sizes` ended with: the sizes measured, in order, and what ended the series
    early, if anything did: a run that did not succeed (`stopped_by`: failed, interrupted...),
    an error that let no run start or end (`error`: no credentials, a quota...), or Ctrl-C
    between runs (`interrupted`)."""

    measured: list[Measurement] = field(default_factory=list)
    stopped_by: RunResult | None = None
    error: CloudtrainError | None = None
    interrupted: bool = False


def _job_epochs(run_id: str) -> int | None:
    """The job's epoch count as its nodes' heartbeats reported it (None: unknown). Reads the
    run's bucket once."""
    from cloudtrain import api

    try:
        beats = api.status(run_id).heartbeats
    except CloudtrainError:
        return None
    counts = [b.get("epochs") for b in beats.values()]
    return max((int(c) for c in counts if isinstance(c, int) and c > 0), default=None)


def measure_sizes(
    sizes: Sequence[Size],
    observer_for: Callable[[Size], AbstractContextManager[Observer]],
    say: Callable[[str], None],
) -> ScaleRun:
    """Run each size to its end, one after the other (attached; each torn down before the
    next starts), and measure it; `observer_for` gives each run's observer (a context manager,
    entered for the run) and `say` hears a line as each size starts. Blocks. Stops at the
    first run that does not succeed (its result is `stopped_by`; on Ctrl-C that run's teardown
    has run, as in `cloudtrain run`), at a CloudtrainError (`error`) or at a KeyboardInterrupt
    between runs; the sizes measured so far are kept."""
    from cloudtrain import api

    out = ScaleRun()
    try:
        for n, size in enumerate(sizes, 1):
            the_plan = size.ready.plan
            say(
                f"size {n}/{len(sizes)}: {size.workers} worker(s), {the_plan.node_count} "
                f"node(s), ${the_plan.hourly_usd:.4f}/h"
            )
            with observer_for(size) as observer:
                result = api.launch(size.ready, observer=observer).result
            if not result.ok:
                out.stopped_by = result
                return out
            epochs = _job_epochs(result.run_id)
            out.measured.append(
                measurement(
                    size.workers,
                    the_plan.hourly_usd,
                    result.throughput,
                    epochs=epochs,
                    run_id=result.run_id,
                )
            )
    except CloudtrainError as exc:  # the launch's own teardown has run
        out.error = exc
    except KeyboardInterrupt:
        out.interrupted = True
    return out
