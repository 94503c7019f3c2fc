"""The `cloudtrain tensorboard RUN` command: mirror the run's event files from its bucket into a
local cache (cloudtrain/insight/tb_sync.py) and serve them with TensorBoard on 127.0.0.1.

While the run is live (the ledger's status is not done) it syncs again every few seconds; once
the run has ended it syncs one last time and serves until Ctrl-C or SIGTERM. TensorBoard runs as
a child process that always ends with the command. `--once` syncs and exits (no server). The run
is found as `status` and `logs` find it: this machine's ledger, else its journal in the bucket
of --provider. Imports nothing heavy at module level (`--help` stays light).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, TextIO

import typer

from cloudtrain.cli import common
from cloudtrain.cli.runs import ProjectOpt, ProviderOpt, RegionOpt, RunArg

if TYPE_CHECKING:
    from cloudtrain.insight.tb_sync import Board, SyncCounts, TbMirror
    from cloudtrain.providers.base import ObjectStore
    from cloudtrain.state.ledger import Ledger, RunRecord

DEFAULT_PORT = 6006  # TensorBoard's own
SYNC_S = 5.0
NAME = "cloudtrain tensorboard"


def register(app: typer.Typer) -> None:
    """Add `tensorboard` to `app`. Imports nothing heavy."""
    app.command("tensorboard")(tensorboard)


def tensorboard(
    run_id: RunArg,
    port: Annotated[
        int,
        typer.Option("--port", min=0, max=65535, help="Port on 127.0.0.1; 0 picks a free one."),
    ] = DEFAULT_PORT,
    once: Annotated[
        bool, typer.Option("--once", help="Sync the event files once and exit (no server).")
    ] = False,
    every: Annotated[
        float,
        typer.Option("--every", min=0.2, help="Seconds between two syncs while the run is live."),
    ] = SYNC_S,
    provider: ProviderOpt = None,
    region: RegionOpt = None,
    project: ProjectOpt = None,
) -> None:
    """Serve the run's TensorBoard event files from a local copy, live or after it ended.

    The files of the run's tensorboard/ folder in its bucket are copied incrementally into
    $CLOUDTRAIN_HOME/runs/RUN/tensorboard (TensorBoard never reads the bucket); while the run is
    live they are synced again every --every seconds. Ctrl-C stops TensorBoard. Needs
    cloudtrain's tensorboard extra (TensorFlow 2.21 no longer brings TensorBoard)."""
    from cloudtrain.core.errors import UsageError
    from cloudtrain.insight.tb_sync import TbMirror, require_tensorboard
    from cloudtrain.run import build as api_build
    from cloudtrain.run.journal_sync import sync_run

    if not once:
        require_tensorboard()  # before anything is read: a missing extra is the first thing
    ref = common.run_ref(run_id)  # the edge: parsed once, trusted below
    rec = sync_run(ref, provider=provider, region=region, account=project, warn=common.warn)
    if not rec.store_uri:
        raise UsageError(f"run {rec.run_id} records no bucket: it has no event files to show")
    store = api_build.record_provider(rec).store(rec.store_uri)
    mirror = TbMirror(store, rec.run_id)
    if once:
        counts = mirror.sync()
        sys.stdout.write(f"{rec.run_id}: {counts.describe()} in {mirror.cache}\n")
        if not counts.event_files:
            sys.stderr.write(f"{NAME}: no event files under {mirror.where}\n")
        return
    Serving(rec, store, mirror, port, every, api_build.ledger()).run()


@dataclass
class Serving:
    """The serving loop of one run (see the module docstring). `run` blocks until Ctrl-C,
    SIGTERM or SIGHUP (then returns) or until TensorBoard dies (CloudtrainError)."""

    rec: RunRecord
    store: ObjectStore
    mirror: TbMirror
    port: int
    every_s: float
    ledger: Ledger
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    _said_empty: bool = False

    def run(self) -> None:
        """Serve until stopped; TensorBoard has ended when this returns or raises."""
        from cloudtrain.core.paths import runs_dir
        from cloudtrain.insight.tb_sync import Board
        from cloudtrain.run.stop_signals import StopSignal, StopSignals, signal_name

        log = runs_dir() / self.rec.run_id / "tensorboard.log"
        reload_s = min(self.every_s, SYNC_S)
        try:
            with (
                StopSignals(self._notice),
                Board(self.mirror.cache, self.port, log, reload_s) as board,
            ):
                self._serve(board)
        except StopSignal as stop:
            self._say(f"stopped by {signal_name(stop.signum)}; TensorBoard has ended")
        except KeyboardInterrupt:  # no handler could be installed (not the main thread)
            self._say("interrupted; TensorBoard has ended")

    def _serve(self, board: Board) -> None:
        from cloudtrain.core.errors import CloudtrainError

        run_id = self.rec.run_id
        live = self._live()
        counts = self._round(live)
        if not live and counts is not None and not counts.event_files:
            raise CloudtrainError(
                f"run {run_id} has ended and {self.mirror.where} holds no event files",
                hint="a job writes them with cloudtrain.jobs.runtime.callbacks()",
            )
        board.start()
        url = board.wait_ready()
        self.out.write(f"TensorBoard of run {run_id}: {url} (Ctrl-C stops it)\n")
        self.out.flush()
        while live:
            if board.wait(self.every_s) is not None:
                board.check()  # it exited: say why
            live = self._live()
            self._round(live)  # after the status: the round after "done" is the last one
        self._say(f"run {run_id} is done; its files are synced; serving until Ctrl-C")
        board.wait()
        board.check()

    def _live(self) -> bool:
        """Whether the run is still live: the ledger's status after taking in the run's new
        journal entries (a run controlled from elsewhere). Blocks for one journal listing."""
        from cloudtrain.state.journal import try_import

        try_import(self.ledger, self.store, self.rec.run_id, warn=common.warn)
        current = self.ledger.get_run(self.rec.run_id)
        return current is not None and current.status != "done"

    def _round(self, live: bool) -> SyncCounts | None:
        """One sync; a store error is a warning (the next round tries again), None."""
        from cloudtrain.core.errors import CloudtrainError

        try:
            counts = self.mirror.sync()
        except CloudtrainError as exc:
            again = f"; again in {self.every_s:g} s" if live else ""
            self._say(f"sync from {self.mirror.where} failed: {exc}{again}")
            return None
        if counts.downloaded or counts.deleted or counts.refused or counts.failed:
            self._say(f"synced: {counts.describe()}")
        if not counts.event_files and live and not self._said_empty:
            self._said_empty = True
            self._say(
                f"no event files yet under {self.mirror.where}; waiting while run "
                f"{self.rec.run_id} is live"
            )
        return counts

    def _notice(self, _signum: int) -> None:
        self._say("still stopping TensorBoard")

    def _say(self, text: str) -> None:
        self.err.write(f"{NAME}: {text}\n")
        self.err.flush()
