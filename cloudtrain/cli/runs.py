"""`cloudtrain status` and `cloudtrain logs`: what a run is doing, from the ledger, its bucket and
the cloud (`cloudtrain.api.status` / `api.logs`, rendered here). Both end for a run in any
state: `logs --follow` ends when the run is done, when its nodes report final states, or when
its controller is gone and no node of it is alive (nobody will write again); while it waits,
it says on stderr what it waits for.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, TextIO

import typer

from cloudtrain.cli import common
from cloudtrain.cli.options import JsonOpt, ProjectOpt, ProviderOpt, RegionOpt, RunArg

if TYPE_CHECKING:
    from cloudtrain.api.log_stream import LogStream
    from cloudtrain.api.results import RunStatus
    from cloudtrain.providers.base import Provider
    from cloudtrain.state.ledger import Ledger, RunRecord
    from cloudtrain.state.runstate import RunReader


def register(app: typer.Typer) -> None:
    """Add `status` and `logs` to the `cloudtrain` app."""
    app.command()(status)
    app.command()(logs)


def status(
    run_id: RunArg,
    as_json: JsonOpt = False,
    provider: ProviderOpt = None,
    region: RegionOpt = None,
    project: ProjectOpt = None,
) -> None:
    """The run's state from the ledger, its bucket and the cloud's node list.

    The ledger first takes in what the run's journal in its bucket holds and it does not (a
    run controlled from elsewhere); with no record of RUN, --provider says where to look."""
    from cloudtrain import api
    from cloudtrain.run.journal_sync import sync_run

    ref = common.run_ref(run_id)  # the edge: parsed once, trusted below
    rec = sync_run(ref, provider=provider, region=region, account=project, warn=common.warn)
    now = api.status(rec.run_id)
    if as_json:
        common.emit_json(now.to_dict())
        return
    _print_status(now)


def _print_status(now: RunStatus) -> None:
    """`status` for a person. What the run's bucket, journal or cloud said (node names and
    states, activities, reasons, the lease's owner) is shown as text (`cloudtrain.core.node_text`):
    never markup, no control character, every figure short and finite."""
    from rich.text import Text

    from cloudtrain.core.node_text import figure, shown, shown_lines, whole

    rec = now.record
    console = common.console()
    console.print(
        Text(rec.run_id, "bold")
        + f" {shown(rec.status, 40)} {shown(rec.outcome or '', 40)} on {shown(rec.provider, 40)}, "
        f"cost ${figure(now.cost_usd, '.4f', 14)}"
    )
    for node, st in sorted(now.statuses.items()):
        beat = now.heartbeats.get(node) or {}
        epoch = beat.get("epoch")
        epoch = f"epoch {whole(epoch)}/{whole(beat.get('epochs'))}" if epoch else ""
        doing = f"  {shown(beat.get('activity'), 80)}" if beat.get("activity") else ""
        console.print(
            f"  {shown(node, 80)}: {shown(st.get('state'), 40)} "
            f"(attempt {whole(st.get('attempt'))}) {epoch}{doing}",
            markup=False,
        )
    from cloudtrain.cli.ui import throughput_lines

    for line in throughput_lines(now.throughput):
        console.print(line)
    from cloudtrain.insight.trace_view import time_line

    took = shown(time_line(now.trace), 2000)
    if took:
        console.print(f"  time: {took}", markup=False)
    console.print(
        f"  live resources: {len(now.live_resources)}  cloud nodes: {len(now.cloud_nodes)}",
        markup=False,
    )
    if rec.status != "done":
        console.print(f"  {shown(_controlled_by(now), 2000)}", markup=False)
    if now.store_error:
        console.print(f"  bucket not readable: {shown(now.store_error, 2000)}", markup=False)
    if now.orphaned:
        console.print(
            f"  its controller is gone: nothing replaces a lost node or ends this run; "
            f"`cloudtrain attach {rec.run_id}` takes it over, `cloudtrain down {rec.run_id}` "
            "cleans up",
            markup=False,
        )
    from cloudtrain.state.failures import describe

    if rec.detail and rec.outcome not in (None, "succeeded"):
        console.print(_indented(shown_lines(rec.detail, 2000)), markup=False)
    elif now.failures:  # a live run: what its nodes report so far
        failures = describe(list(now.failures.values()))
        console.print(_indented(shown_lines(failures, 2000)), markup=False)


def _controlled_by(now: RunStatus) -> str:
    """Who controls the run: the lease's holder (cloudtrain/state/lease.py), or for a run without a
    lease its recorded controller process. Pure."""
    if now.lease is None:
        return now.controller.describe()
    from cloudtrain.jobs.protocol import LeaseDoc
    from cloudtrain.state.lease import describe

    return "controlled by " + describe(LeaseDoc.from_dict(now.lease), now.read_at)


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
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="Write the lines as the nodes printed them, control characters and escape "
            "sequences included, even to a terminal.",
        ),
    ] = False,
    provider: ProviderOpt = None,
    region: RegionOpt = None,
    project: ProjectOpt = None,
) -> None:
    """Print the run's logs from its bucket, in order per node.

    With --follow, keep printing until the run ends (or nobody is left to end it). On a
    terminal every control character a node printed is shown escaped (ESC as \\x1b), so no
    escape sequence of the job reaches the terminal; into a pipe or a file, and with --raw,
    the lines go as the nodes printed them. With no record of RUN in the ledger, --provider
    says where its journal is."""
    from cloudtrain import api
    from cloudtrain.run.journal_sync import sync_run

    ref = common.run_ref(run_id)  # the edge: parsed once, trusted below
    run_id = sync_run(
        ref, provider=provider, region=region, account=project, warn=common.warn
    ).run_id
    out = sys.stdout
    escape = not raw and _is_terminal(out)
    if bootstrap:
        from cloudtrain.state.bootlog import durations_text, parse

        for name, text in api.bootstrap_logs(run_id, node=node).items():
            info = parse(text)
            took = durations_text(info.durations, info.steps)
            head = f"== {name} ==" + (f" ({took})" if took else "")
            out.write(_as_shown(head, escape) + "\n" + _as_shown(text, escape))
        return
    stream = api.logs(run_id, follow=follow, node=node, on_wait=_waiting_to(sys.stderr))
    code = render(stream, out, sys.stderr, escape=escape)
    if code:
        raise typer.Exit(code)


def _waiting_to(err: TextIO) -> Callable[[str], None]:
    def waiting(text: str) -> None:
        err.write(f"cloudtrain logs: {text}\n")
        err.flush()

    return waiting


WRITE_LINES = 10_000  # `logs` writes a poll's lines this many at a time


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no such method, or a closed stream
        return False


def _as_shown(text: str, escape: bool) -> str:
    """`text` (lines) with every control character escaped when `escape`, else as it is."""
    if not escape:
        return text
    from cloudtrain.core.node_text import shown_lines

    return shown_lines(text, None, None)


def render(stream: LogStream, out: TextIO, err: TextIO, escape: bool = False) -> int:
    """Print a log stream's lines to `out` as `[node] line`, then why it ended: the outcome and
    detail of a run that did not succeed (to `out`), or why nobody will finish it (to `err`).
    With `escape` (`logs` on a terminal) every control character of a line, the node's name
    and the detail is shown escaped (`cloudtrain.core.node_text`), the whole line kept. Returns
    `logs`' exit code: 0, or api_logs.GONE_EXIT. Blocks while the stream does. Output is
    written and flushed a poll's lines at a time, not per line (a day-3 run's `logs` prints
    millions)."""
    from cloudtrain.core.node_text import shown

    show = (lambda text: shown(text, None)) if escape else str
    for batch in stream.batches():
        for start in range(0, len(batch), WRITE_LINES):
            lines = batch[start : start + WRITE_LINES]
            out.write("".join([f"[{show(x.node)}] {show(x.line)}\n" for x in lines]))
        out.flush()
    end = stream.end
    assert end is not None  # a stream that stopped says why
    if end.message:
        err.write(_as_shown(end.message, escape) + "\n")
    elif end.outcome not in (None, "succeeded"):
        detail = _as_shown(end.detail or "", escape)
        out.write(f"== run {stream.rec.run_id} {show(end.outcome)}:\n{detail}\n")
    return end.code


@dataclass
class Follower:
    """The `logs` loop over parts already built (a reader of the run's bucket): print its
    lines; with `follow`, until the run is over. Blocks."""

    rec: RunRecord
    prov: Provider
    reader: RunReader
    ledger: Ledger
    node: str | None
    out: TextIO
    err: TextIO
    poll_s: float = 1.0
    clock: Callable[[], float] = time.monotonic

    def run(self, follow: bool) -> int:
        """Returns the exit code: 0 once the run is over (or at once without `follow`),
        api_logs.GONE_EXIT when its controller is gone and none of its nodes is alive."""
        from cloudtrain.api.log_stream import LogStream

        stream = LogStream(
            self.rec,
            self.prov,
            self.reader,
            self.ledger,
            node=self.node,
            follow=follow,
            poll_s=self.poll_s,
            clock=self.clock,
            on_wait=_waiting_to(self.err),
        )
        return render(stream, self.out, self.err)
