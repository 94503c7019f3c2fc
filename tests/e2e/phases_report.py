"""Where a traced run's time went, per place it ran (local, each cloud box), for
`benchmarks/box_phases.py` and the README's per-phase table (issue 20).

`record(where, trace, fakes)` merges one row into `$CLOUDTRAIN_PHASES_OUT` (a JSON file, section
"phases", keyed by `where`) when that variable is set, and does nothing otherwise: the pattern
and the atomic merge of `reliability_report`, so a rerun replaces its row and pytest processes
may write at once. A row holds the run's breakdown (phase -> seconds, `trace_view.PHASES` in
order), its traced wall time, the CLI's as the test saw it, the coverage, the load average when
it ended, its spans (compact, timed from the run's start, to explain a phase), and `fakes`: the
latency settings of the fakes that shaped it, as the `*_fakes` helpers read them off the live
box (so the row states what the run really had, not what a default says).

None of the fakes adds a sleep of its own: an answer comes as soon as the request is handled.
What stretches a box run instead is how many polls a long-running operation takes, what each
adapter waits between them, the boot harness's poll for new VMs, and cloudtrain's own cloud
knobs (the controller's watch polls every `RunOptions.poll_s`, 2 s on a cloud, 0.2 s on local).
"""

from __future__ import annotations

import os
from typing import Any

from tests.e2e.reliability_report import merge

PHASES_ENV = "CLOUDTRAIN_PHASES_OUT"
SECTION = "phases"


def record(
    where: str, trace: dict[str, Any], fakes: dict[str, Any], spawned: float, exited: float
) -> None:
    """Merge the breakdown of `trace` (as `status --json` shows it), the `fakes` settings and
    the CLI's wall time as the test saw it (`spawned` to `exited`, unix seconds), with the part
    of it before the trace's start (`head_s`: up to the process start) and after its end
    (`tail_s`: the summary, the interpreter's exit), under `where` ("local", "aws box", ...)
    into the phases file, if one is configured. Idempotent per `where`; blocks on the file's
    lock only."""
    target = os.environ.get(PHASES_ENV)
    if not target:
        return
    roots = [s for s in trace["spans"] if s["name"] == "run" and not s["node"]]
    merge(
        target,
        SECTION,
        where,
        breakdown={p["phase"]: p["seconds"] for p in trace["breakdown"]},
        wall_s=trace["wall_s"],
        cli_s=round(exited - spawned, 3),
        head_s=round(roots[0]["start"] - spawned, 3) if roots else None,
        tail_s=round(exited - roots[0]["end"], 3) if roots else None,
        covered=trace["covered"],
        load=round(os.getloadavg()[0], 2),
        fakes=fakes,
        spans=compact(trace["spans"]),
    )


def compact(spans: list[dict[str, Any]]) -> list[list[Any]]:
    """Every span as [node, parent, name, attempt, start, seconds], its start in seconds after
    the run's (the controller's root span's) start: what a reader needs to explain a phase."""
    roots = [s["start"] for s in spans if s["name"] == "run" and not s["node"]]
    t0 = min(roots) if roots else min((s["start"] for s in spans), default=0.0)
    return [
        [
            s["node"],
            s["parent"],
            s["name"],
            s["attempt"],
            round(s["start"] - t0, 3),
            round(s["end"] - s["start"], 3),
        ]
        for s in spans
    ]


def _cloud_knobs(provider: str) -> dict[str, Any]:
    from cloudtrain.jobspec.run_options import RunOptions

    return {"controller_poll_s": RunOptions.for_provider(provider).poll_s}


def aws_fakes(harness: Any) -> dict[str, Any]:
    """The AWS box's: moto in the test process, the boot harness's poll for new instances."""
    import moto

    from cloudtrain.providers.aws.compute import TERMINATE_POLL_S

    return {
        "moto": f"moto {moto.__version__} server, in-process: no added latency, an instance is "
        "running in run_instances' answer",
        "harness_poll_s": harness.poll_s,
        "adapter_terminate_poll_s": TERMINATE_POLL_S,
        **_cloud_knobs("aws"),
    }


def gcp_fakes(cloud: Any, harness: Any) -> dict[str, Any]:
    """The GCP box's: the GCE fake's operation polls and IAM lag, the GCS emulator, the
    harness's poll, the adapter's quick re-poll of an operation wait."""
    from cloudtrain.providers.gcp.clients import QUICK_POLL_S

    return {
        "gce_operation_polls_to_done": cloud.gce.operation_polls_to_done,
        "gce_iam_account_lag": cloud.gce._state.account_lag,
        "gce": "GCE + IAM fake, in-process: no added latency; an operation wait answers at once",
        "adapter_operation_repoll_s": QUICK_POLL_S,
        "gcs": "gcp-storage-emulator, in-process, one request at a time",
        "harness_poll_s": harness.poll_s,
        **_cloud_knobs("gcp"),
    }


def azure_fakes(cloud: Any, harness: Any) -> dict[str, Any]:
    """The Azure box's: the ARM fake's LRO polls (Retry-After 0, polled with interval 0), Azurite,
    the harness's poll."""
    from tests.fakes.azurite import AZURITE_VERSION

    return {
        "arm_lro_polls": cloud.arm.lro_polls,
        "arm": "ARM fake over HTTPS, in-process: no added latency, LROs answer Retry-After: 0 "
        "and the adapter polls them with polling_interval 0",
        "blob": f"Azurite {AZURITE_VERSION} (node, a separate process)",
        "harness_poll_s": harness.poll_s,
        **_cloud_knobs("azure"),
    }
