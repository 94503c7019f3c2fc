"""`cloudtrain status` and `cloudtrain logs`: what a run is doing, from the ledger, its bucket and
the cloud. Both end for a run in any state: `logs --follow` ends when the run is done, when its
nodes report final states, or when its controller is gone and no node of it is alive (nobody
will write again); while it waits, it says on stderr what it waits for.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import typer

from cloudtrain import cli_common as common

if TYPE_CHECKING:
    from cloudtrain.ledger import Ledger, RunRecord
    from cloudtrain.providers.base import Provider
    from cloudtrain.runstate import RunReader, Snapshot

RunArg = Annotated[str, typer.Argument(help="A run id (or a unique prefix of one).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
# a node's short name in the bucket: the role (providers.base.ROLES) and its index
NODE_RE = re.compile(r"(chief|worker|ps|evaluator)-[0-9]{1,4}")
CLOUD_CHECK_S = 10.0  # how often `logs --follow` lists the cloud once the controller is gone
GONE_EXIT = 1  # `logs --follow` of a run nobody will finish: its controller died mid-run


def register(app: typer.Typer) -> None:
    """Add `status` and `logs` to the `cloudtrain` app."""
    app.command()(status)
    app.command()(logs)


def _poll(reader: RunReader) -> tuple[Snapshot, str | None]:
    """One poll of the run's bucket, or the empty snapshot and why it cannot be read (a bucket
    that was never made, or is gone)."""
    from cloudtrain.errors import CloudtrainError

    try:
        return reader.poll(), None
    except CloudtrainError as exc:
        return reader.snapshot, str(exc)


def status(run_id: RunArg, as_json: JsonOpt = False) -> None:
    """The run's state from the ledger, its bucket and the cloud's node list."""
    rec = common.find_run(run_id)
    ledger = common.ledger()
    from cloudtrain.failures import read_reports
    from cloudtrain.procid import controller
    from cloudtrain.runstate import RunReader

    prov = common.provider(rec.provider, rec.region, rec.zone, rec.account)
    snap, unreadable = _poll(RunReader(common.store(prov, rec.store_uri), rec.run_id))
    attempt = max((int(s.get("attempt", 0)) for s in snap.statuses.values()), default=0)
    failures = read_reports(snap, attempt).failed  # the newest attempt's
    nodes = {n.name: n for n in prov.compute.list_nodes(rec.run_id)}
    live = [r for r in ledger.resources(rec.run_id, live_only=True) if r.kind != "bucket"]
    ctl = controller(rec)
    orphaned = rec.status != "done" and ctl.state != "alive" and ctl.pid is not None
    data = {
        "run_id": rec.run_id,
        "name": rec.name,
        "provider": rec.provider,
        "status": rec.status,
        "outcome": rec.outcome,
        "detail": rec.detail,
        "store": rec.store_uri,
        "store_error": unreadable,
        "created_at": rec.created_at,
        "ended_at": rec.ended_at,
        "cost_usd": ledger.billed_cost(rec.run_id),
        "controller": {"pid": ctl.pid, "host": ctl.host, "state": ctl.state},
        "nodes": {
            k: {"status": v, "heartbeat": snap.heartbeats.get(k)} for k, v in snap.statuses.items()
        },
        "bootstrap": {
            k: {
                "phase": snap.bootstrap_phases.get(k),
                "durations_s": snap.bootstrap_durations.get(k),
            }
            for k in sorted(set(snap.bootstrap_phases) | set(snap.bootstrap_durations))
        },
        "failures": {
            k: {"reason": f.reason, "tail": list(f.tail)} for k, f in sorted(failures.items())
        },
        "cloud_nodes": {name: n.state for name, n in nodes.items()},
        "live_resources": [f"{r.kind}/{r.resource_id}" for r in live],
    }
    if as_json:
        common.emit_json(data)
        return
    console = common.console()
    console.print(
        f"[bold]{rec.run_id}[/bold] {rec.status} {rec.outcome or ''} on {rec.provider}, "
        f"cost ${data['cost_usd']:.4f}"
    )
    for node, st in sorted(snap.statuses.items()):
        beat = snap.heartbeats.get(node) or {}
        epoch = f"epoch {beat.get('epoch')}/{beat.get('epochs')}" if beat.get("epoch") else ""
        console.print(f"  {node}: {st.get('state')} (attempt {st.get('attempt')}) {epoch}")
    console.print(f"  live resources: {len(live)}  cloud nodes: {len(nodes)}")
    if rec.status != "done":
        console.print(f"  {ctl.describe()}", markup=False)
    if unreadable:
        console.print(f"  bucket not readable: {unreadable}", markup=False)
    if orphaned:
        console.print(
            f"  its controller is gone: nothing will finish this run; "
            f"`cloudtrain down {rec.run_id}` cleans up",
            markup=False,
        )
    from cloudtrain.failures import describe

    if rec.detail and rec.outcome not in (None, "succeeded"):
        console.print(_indented(rec.detail), markup=False)
    elif failures:  # a live run: what its nodes report so far
        console.print(_indented(describe(list(failures.values()))), markup=False)


def _indented(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


def logs(
    run_id: RunArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing.")] = False,
    node: Annotated[
        str | None, typer.Option("--node", help="Only this node, e.g. worker-1")
    ] = None,
    bootstrap: Annotated[
        bool, typer.Option("--bootstrap", help="Show the nodes' bootstrap logs.")
    ] = False,
) -> None:
    """Print the run's logs from its bucket, in order per node.

    With --follow, keep printing until the run ends (or nobody is left to end it)."""
    rec = common.find_run(run_id)
    if node is not None and NODE_RE.fullmatch(node) is None:
        from cloudtrain.errors import UsageError

        raise UsageError(f"--node {node[:40]!r} is not a node name such as worker-1 or chief-0")
    from cloudtrain.runstate import RunReader

    prov = common.provider(rec.provider, rec.region, rec.zone, rec.account)
    reader = RunReader(common.store(prov, rec.store_uri), rec.run_id)
    out = sys.stdout
    if bootstrap:
        from cloudtrain.bootlog import durations_text, parse

        for name in reader.bootstrap_nodes():
            if node is None or name == node:
                text = reader.bootstrap_log(name)
                took = durations_text(parse(text).durations)
                out.write(f"== {name} ==" + (f" ({took})" if took else "") + f"\n{text}")
        return
    code = Follower(rec, prov, reader, common.ledger(), node, out, sys.stderr).run(follow)
    if code:
        raise typer.Exit(code)


@dataclass
class Follower:
    """The `logs` loop: print new lines; with `follow`, poll until the run is over. Blocks."""

    rec: RunRecord
    prov: Provider
    reader: RunReader
    ledger: Ledger
    node: str | None
    out: TextIO
    err: TextIO
    poll_s: float = 1.0
    clock: Callable[[], float] = time.monotonic
    _said: str = ""
    _listed_at: float | None = None
    _alive_nodes: int | None = None

    def run(self, follow: bool) -> int:
        """Returns the exit code: 0 once the run is over (or at once without `follow`),
        GONE_EXIT when its controller is gone and none of its nodes is alive."""
        run_id = self.rec.run_id
        while True:
            snap, unreadable = _poll(self.reader)
            for name, line in snap.new_lines:
                if self.node is None or name == self.node:
                    self.out.write(f"[{name}] {line}\n")
            self.out.flush()
            current = self.ledger.get_run(run_id)
            if current is None:  # the ledger file was replaced under us
                self.err.write(f"run {run_id} is no longer in the ledger; stopping\n")
                return GONE_EXIT
            if not follow or current.status == "done" or _job_over(snap.statuses):
                if current.outcome not in (None, "succeeded"):
                    self.out.write(f"== run {run_id} {current.outcome}:\n{current.detail or ''}\n")
                return 0
            waiting = self._waiting(current, snap, unreadable)
            if waiting is None:
                self.err.write(
                    f"run {run_id}'s controller is gone and none of its nodes is alive; "
                    f"`cloudtrain down {run_id}` cleans up\n"
                )
                return GONE_EXIT
            if waiting != self._said:
                self.err.write(f"cloudtrain logs: {waiting}\n")
                self.err.flush()
                self._said = waiting
            time.sleep(self.poll_s)

    def _waiting(self, current: RunRecord, snap: Snapshot, unreadable: str | None) -> str | None:
        """What the loop waits for, or None when nothing will ever change: the controller is
        gone (or was never recorded) and the cloud lists no live node of the run."""
        from cloudtrain.procid import controller

        ctl = controller(current)
        run_id = current.run_id
        bucket = f"; bucket not readable: {unreadable}" if unreadable else ""
        if ctl.state == "alive" or (ctl.state == "unknown" and ctl.pid is not None):
            return f"waiting for run {run_id} ({current.status}; {ctl.describe()}){bucket}"
        now = self.clock()
        if self._listed_at is None or now - self._listed_at >= CLOUD_CHECK_S:
            self._listed_at = now
            nodes = self.prov.compute.list_nodes(run_id)
            self._alive_nodes = sum(1 for n in nodes if n.alive)
        if not self._alive_nodes:
            return None
        reported = len(snap.statuses)
        return (
            f"waiting for {self._alive_nodes} live node(s) of run {run_id} to report a final "
            f"state ({reported} reported so far; {ctl.describe()}){bucket}"
        )


def _job_over(statuses: dict[str, dict[str, Any]]) -> bool:
    """Whether every node reported a final state in the newest attempt (a detached run's end)."""
    if not statuses:
        return False
    attempt = max(int(s.get("attempt", 0)) for s in statuses.values())
    latest = [s for s in statuses.values() if int(s.get("attempt", 0)) == attempt]
    from cloudtrain.jobs.agent import FINAL_STATES

    return all(s.get("state") in FINAL_STATES for s in latest)
