"""The node agent: started by the bootstrap script, it is the node's side of the run.

It talks to the controller only through the run's bucket (the layout and the documents:
`jobs/protocol.py`):
registers its address for the current attempt, waits for the whole cluster, checks that every
peer answers at TCP level (a cloud firewall that drops the run's ports fails the node naming the
peer: `jobs/reachability.py`), builds TF_CONFIG,
restores checkpoints, runs setup and the entrypoint (under strategy horovod: one process per GPU
with Horovod's Gloo environment, see `jobs/horovod.py`), streams logs in ordered chunks, syncs the
chief's checkpoints as they change, obeys `control/stop` and the deadline, ends parameter
servers and evaluators when the chief is done, and follows new attempts.

Two threads do the agent's own work: a background one flushes the logs and metrics and beats
the heartbeat, saying what the agent is busy with (`jobs/beats.py`), so a long restore or
upload never silences the node; the main one does everything else, `tick()` included
(checkpoint sync, control, the lease, the preemption notice).

Only the standard library and the provider's ObjectStore (chosen by the URI's scheme) are used.
The training process runs in its own process group, which is killed with SIGKILL when it must go:
a MultiWorkerMirrored worker waiting for peers ignores SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, TypeVar

from cloudtrain.core import env as envvars
from cloudtrain.core.errors import CloudtrainError
from cloudtrain.core.redact import Redactor
from cloudtrain.jobs import horovod
from cloudtrain.jobs import protocol as proto
from cloudtrain.jobs import trace as tr
from cloudtrain.jobs.beats import Beats
from cloudtrain.jobs.bucket_reads import Skips, get_bounded
from cloudtrain.jobs.checkpoints import Checkpoints
from cloudtrain.jobs.logpump import TAIL_LINES, LogPump
from cloudtrain.jobs.metrics import MetricsPump
from cloudtrain.jobs.node_rules import RefusedInput, launch_problem
from cloudtrain.jobs.node_trace import NodeTrace
from cloudtrain.jobs.pipe_pump import PipePump
from cloudtrain.jobs.preemption import Notice, PreemptionWatcher, cloud_of_store
from cloudtrain.jobs.protocol import FINAL_STATES, ClusterDoc, NodeState
from cloudtrain.jobs.rendezvous import Rendezvous
from cloudtrain.jobs.strategies import UNDECLARED, StrategyInfo
from cloudtrain.jobs.strategies import strategy as lookup_strategy
from cloudtrain.jobs.tf_config import chief_task, task_tf_config
from cloudtrain.providers.base import node_name
from cloudtrain.providers.change_wait import ChangeWaiter

__all__ = ["Agent", "LogPump", "NewAttempt", "StopRequested", "main"]
D = TypeVar("D", bound=proto.Document)


class StopRequested(Exception):
    """control/stop was written or the deadline passed."""


class NewAttempt(Exception):
    """cluster.json moved to another attempt: drop everything and rendezvous again."""


LEASE_CHECK_S = 30.0  # how often the chief looks at the run's lease (one GET)


class Agent(Beats, Checkpoints, NodeTrace, Rendezvous):
    """One node's agent. `run()` blocks until the run stops or the deadline passes."""

    def __init__(self, run_id: str, role: str, index: int, store: Any, work: Path) -> None:
        self.run_id, self.role, self.index, self.store = run_id, role, index, store
        self.me = proto.node_id(role, index)
        self.work = work
        self.ckpt_dir = work / "checkpoints"
        self.model_dir = work / "model"
        self.workdir = work / "bundle" / "workdir"
        self.tb_dir = work / "tensorboard"  # the chief's is mirrored to tensorboard/
        # the job's TMPDIR, emptied at each attempt: a killed worker runs no atexit cleanup, and
        # its tempfile folders (jobs/runtime.py) would stay in the machine's /tmp for good
        self.scratch = work / "tmp"
        self.cluster = ClusterDoc()  # read by run(); every field has its default until then
        self.attempt = 0
        self.child: subprocess.Popen[bytes] | horovod.ProcessGroup | None = None
        self.state: str = NodeState.BOOTSTRAPPED
        self.logs = LogPump.resume(store, run_id, self.me)
        self.skips = Skips(warn=self.say)  # what it could not read: one line per key, in its logs
        metrics_file = work / "metrics" / "train.jsonl"
        self.metrics = MetricsPump(store, run_id, self.me, metrics_file, say=self.say)
        self._synced: dict[str, tuple[int, int]] = {}
        self._pumps: list[PipePump] = []
        self.start_horovod_server: horovod.ServerStarter = horovod.start_rendezvous_server
        cloud = cloud_of_store(store.uri)
        self.watcher = PreemptionWatcher(cloud, node_name(run_id, role, index))  # the VM's name
        self.notice: Notice | None = None
        self._last = dict.fromkeys(("sync", "control", "lease"), 0.0)
        self._init_beats()
        self._init_trace()
        self._orphaned_term = -1  # the expired lease term this node reported (control/orphaned)

    # --- bucket helpers -------------------------------------------------------------------
    def say(self, message: str) -> None:
        """A line from the agent itself into the node's log stream."""
        self.logs.add(f"cloudtrain-agent[{self.me}]: {message}")

    def _read(self, kind: type[D], key: str) -> D | None:
        """The document at `key`, or None while it is not there or cannot be read: over its
        cap (at most kind.MAX_BYTES + 1 is read), half-written, too deep or ill-typed (one
        line per key in the logs: `skips`). A document without a required field is an error
        of its writer's: KeyError naming the field. Blocks for one GET."""
        body = get_bounded(self.store, key, kind.MAX_BYTES, self.skips)
        try:
            return None if body is None else kind.from_json(body)
        except proto.MissingField as exc:
            raise KeyError(exc.field) from None
        except proto.ProtocolError as exc:
            self.skips.skip(key, str(exc))
            return None

    # --- periodic work --------------------------------------------------------------------
    def tick(self, now: float | None = None) -> None:
        """Checkpoint (and TensorBoard) sync, control and lease checks, each at its own pace,
        and the preemption notice; also the heartbeat's work (`beat`) while its background
        thread is not running (an agent used outside `run()`). Raises StopRequested or
        NewAttempt."""
        now, cluster = now or time.time(), self.cluster
        if not self.beating:
            self.beat(now)
        if self.is_chief and now - self._last["sync"] >= cluster.sync_s:
            self._last["sync"] = now
            self.sync_checkpoints()
            self.sync_tensorboard()
        if now - self._last["control"] >= cluster.control_s:
            self._last["control"] = now
            self.check_control()
        if self.is_chief and now - self._last["lease"] >= LEASE_CHECK_S:
            self._last["lease"] = now
            self.check_lease(now)
        if self.notice is None:
            notice = self.watcher.poll()  # rate-limited by the watcher itself
            if notice is not None:
                self.on_notice(notice)

    def on_notice(self, notice: Notice) -> None:
        """The cloud is taking this VM back: flush the chief's checkpoints now, inside the
        notice window, and write `notice/<me>.json` so the controller replaces this node at
        once (instead of when the cloud reports it gone). Keeps training until the end."""
        self.notice = notice
        left = max(0.0, notice.deadline - time.time())
        self.say(f"preemption notice ({notice.detail}); about {left:.0f}s left")
        if self.is_chief:
            n = self.sync_checkpoints()
            self.say(f"checkpoints flushed on the notice ({n} new files)")
        self.logs.flush()
        doc = proto.NoticeDoc(
            attempt=self.attempt,
            time=time.time(),
            cloud=notice.cloud,
            action=notice.action,
            deadline=notice.deadline,
        )
        self.store.put(proto.notice_key(self.run_id, self.me), doc.to_json())

    def check_lease(self, now: float) -> None:
        """The chief writes control/orphaned, once per expired term, when the run's lease
        (cloudtrain/state/lease.py) expired: nobody replaces lost nodes or enforces the budget (a
        controller node died); `cloudtrain status` shows it and `cloudtrain attach` takes over.
        Training goes on either way. Best effort: a bucket hiccup waits for the next check."""
        try:
            doc = self._read(proto.LeaseDoc, proto.lease_key(self.run_id))
            if doc is None or doc.expires >= now or doc.term == self._orphaned_term:
                return
            self._orphaned_term = doc.term
            orphan = proto.OrphanedDoc(time=now, by=self.me, term=doc.term)
            self.store.put(proto.orphaned_key(self.run_id), orphan.to_json())
            self.say(f"the run's controller ({doc.owner}) is gone: training goes on")
        except (KeyError, CloudtrainError, OSError):
            return

    def check_control(self) -> None:
        """Raise StopRequested on control/stop or the deadline; NewAttempt on a new attempt."""
        stop_key = proto.stop_key(self.run_id)
        if any(o.key == stop_key for o in self.store.list(stop_key)):
            raise StopRequested(proto.STOPPED_BY_CONTROL)
        if time.time() > self.cluster.deadline:
            raise StopRequested("deadline")
        cluster = self._read(ClusterDoc, proto.cluster_key(self.run_id))
        if cluster and cluster.attempt != self.attempt:
            self.cluster = cluster
            raise NewAttempt(str(cluster.attempt))

    @property
    def declared(self) -> StrategyInfo:
        """The declaration of the run's strategy (jobs/strategies.py); UNDECLARED for a name
        without one (a cluster.json of another version). Pure."""
        return lookup_strategy(self.cluster.strategy) or UNDECLARED

    @property
    def is_chief(self) -> bool:
        roles = self.cluster.roles
        return (self.role, self.index) == chief_task({r: ["x"] * n for r, n in roles.items()})

    # --- the training process -------------------------------------------------------------
    def child_env(self, cluster: dict[str, list[str]]) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TF's C++ INFO lines drown the job's output
        env.update(self.cluster.env)
        # under horovod none: its processes get HOROVOD_* (jobs/horovod.py)
        tf_config = task_tf_config(self.declared, cluster, self.role, self.index)
        if tf_config is not None:
            env["TF_CONFIG"] = json.dumps(tf_config)
        else:
            env.pop("TF_CONFIG", None)
        env.update(
            {
                "TF_USE_LEGACY_KERAS": "1",
                "PYTHONUNBUFFERED": "1",
                envvars.RUN_ID.name: self.run_id,
                envvars.STRATEGY.name: self.cluster.strategy,
                envvars.ROLE.name: self.role,
                envvars.INDEX.name: str(self.index),
                envvars.IS_CHIEF.name: "1" if self.is_chief else "0",
                envvars.ATTEMPT.name: str(self.attempt),
                envvars.CHECKPOINT_DIR.name: str(self.ckpt_dir),
                "TMPDIR": str(self.scratch),
                envvars.MODEL_DIR.name: str(self.model_dir),
                envvars.METRICS_FILE.name: str(self.metrics.path),
                envvars.TENSORBOARD_DIR.name: str(self.tb_dir),
                "PATH": os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
            }
        )
        return env

    def check_launch(self, kind: str, command: str, env: dict[str, str]) -> None:
        """Raise RefusedInput (a RuntimeError: a failed status with this reason) when `bash -c
        command` with `env` cannot run as the spec says (jobs/node_rules.py). Pure."""
        spec_env, strategy = self.cluster.env, self.cluster.strategy or None
        problem = launch_problem(kind, command, env, spec_env, strategy)
        if problem:
            raise RefusedInput(f"refused on the node: {problem}")

    def start(
        self, command: str, env: dict[str, str], *, prefix: str = "", process_group: int = 0
    ) -> subprocess.Popen[bytes]:
        """Run `command` with bash in the workdir, output pumped into the logs with `prefix`
        before each line; in a new process group (0), or in the existing group `process_group`."""
        proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=self.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            # what Popen(process_group=) does, which is 3.11+: the nodes' Pythons start at 3.10
            preexec_fn=functools.partial(os.setpgid, 0, process_group),
        )
        assert proc.stdout is not None
        # Keras' progress goes to the metrics too, for a job without the runtime. The pump never
        # stops draining the pipe; a sink's error ends the node (check_pumps)
        sinks = [self.logs.add, self.metrics.log_line]
        pump = PipePump(proc.stdout, sinks, prefix=prefix)  # type: ignore[arg-type]
        pump.start()
        self._pumps.append(pump)
        return proc

    def check_pumps(self) -> None:
        """Raise RuntimeError("log pump: ...": a failed status with that reason, the training
        killed) when an output pump of this attempt failed: its lines no longer reach the logs.
        Pure otherwise."""
        for pump in self._pumps:
            if pump.failure is not None:
                raise RuntimeError(pump.failure)

    def launch(
        self, cluster: dict[str, list[str]]
    ) -> subprocess.Popen[bytes] | horovod.ProcessGroup:
        """Start the entrypoint as the strategy's declaration says: one process, or (launch
        "horovod_ranks") one per GPU on this node (`jobs/horovod.py`; worker 0 also starts the
        rendezvous server). Raises HorovodError."""
        self._pumps = []
        command, env = self.cluster.entrypoint, self.child_env(cluster)
        self.check_launch("entrypoint", command, env)
        if self.declared.launch != "horovod_ranks":
            return self.start(command, env)
        workers = cluster.get(horovod.ROLE, [])
        registrations = [
            self._read(
                proto.Registration,
                proto.registration_key(self.run_id, self.attempt, proto.node_id(horovod.ROLE, i)),
            )
            for i in range(len(workers))
        ]
        return horovod.launch_node(
            command,
            env,
            workers,
            registrations,
            self.index,
            start=self.start,
            start_server=self.start_horovod_server,
            say=self.say,
        )

    def kill_child(self, grace_s: float = 0.0) -> None:
        """End the training process group: SIGTERM and `grace_s` to finish, then SIGKILL."""
        proc, self.child = self.child, None
        if proc is None:
            return
        if grace_s > 0 and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def run_setup(self) -> None:
        """The job's `setup` commands, once per node. Raises RuntimeError when they fail."""
        setup = self.cluster.setup.strip()
        marker = self.work / ".setup-done"
        if not setup or marker.exists():
            return
        with self.traced(tr.SETUP):
            self._run_setup(setup, marker)

    def _run_setup(self, setup: str, marker: Path) -> None:
        self.say("running setup")
        env = self.child_env({})
        self.check_launch("setup", setup, env)
        proc = self.start(setup, env)
        self.child = proc
        while proc.poll() is None:
            self.tick()
            self.check_pumps()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.2)  # up at its exit, not at the next look
        self.child = None
        self.check_pumps()
        if proc.returncode != 0:
            raise RuntimeError(f"setup failed with exit code {proc.returncode}")
        marker.touch()

    def chief_final(self) -> bool:
        """Whether the chief has reached a final state in this attempt."""
        chief = proto.node_id(*chief_task({r: ["x"] * n for r, n in self.cluster.roles.items()}))
        status = self._read(proto.NodeStatus, proto.status_key(self.run_id, chief))
        return bool(status and status.attempt == self.attempt and status.state in FINAL_STATES)

    def train_once(self) -> None:
        """One attempt: restore, rendezvous, run the entrypoint to its end, report."""
        self.logs.add(f"=== cloudtrain attempt {self.attempt} ({self.me}) ===")
        self.metrics.new_attempt()
        shutil.rmtree(self.scratch, ignore_errors=True)  # a killed attempt's leftovers
        self.scratch.mkdir(parents=True)
        with self.traced(tr.RESTORE):  # the barrier (the chief's flush) and the restore
            self.checkpoint_barrier()
            restored = self.restore_checkpoints()
        if restored:
            self.say(f"restored {restored} checkpoint files from the bucket")
        self.write_status(NodeState.RENDEZVOUS)
        cluster = self.rendezvous()
        with self.traced(tr.PEERS):
            self.check_peers(cluster)
        self.run_setup()
        launched = time.time()
        self.child = self.launch(cluster)
        self.write_status(NodeState.RUNNING, pid=self.child.pid)
        self.publish_trace()  # so far: `status` of a live run shows the boot and the rendezvous
        serving = self.role in ("ps", "evaluator") or (
            self.role in self.declared.serving_roles and not self.is_chief
        )
        last_chief_check = 0.0
        # a server looks at the chief's status each second, and at once when a status changes
        statuses = ChangeWaiter(self.store.uri, [proto.status_prefix(self.run_id)])
        changed = False
        while self.child.poll() is None:
            self.tick()
            self.check_pumps()
            if serving and (changed or time.time() - last_chief_check > 1.0):
                last_chief_check = time.time()
                if self.chief_final():
                    self.say("the chief has finished; ending this server")
                    self.kill_child()
                    self._trace_training(launched, "chief finished")
                    self.finish(0, "chief finished")
                    return
            if serving:
                changed = statuses.wait(0.2)
            else:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.child.wait(timeout=0.2)  # up at its exit, not at the next look
        rc = self.child.returncode
        self._trace_training(launched, f"exit {rc}")
        self.kill_child()  # background processes the entrypoint left behind go too
        self._join_pumps()
        self.check_pumps()  # a pump that failed lost lines: not a success
        self.finish(rc)

    def _trace_training(self, launched: float, detail: str) -> None:
        self._trained = (launched, time.time())
        attempt = self.attempt
        self.trace.add(tr.TRAINING, *self._trained, parent=tr.NODE, attempt=attempt, detail=detail)

    def _join_pumps(self) -> None:
        """Wait (up to 5 s) for the output pumps to reach the end of their pipes: every line of
        output is in the logs before the status. Blocking."""
        deadline = time.monotonic() + 5
        for pump in self._pumps:
            pump.join(timeout=max(0.0, deadline - time.monotonic()))

    def finish(self, rc: int, reason: str = "") -> None:
        """Final sync, model upload on success, the final flushes, a heartbeat, then the final
        status (written last: it and the heartbeat announce every line of the logs)."""
        started = time.time()
        shutil.rmtree(self.scratch, ignore_errors=True)  # its processes are gone (kill_child)
        self._join_pumps()
        self.metrics.flush(final=True)
        self.trace_steps(*self._trained, self.metrics.first_step_at, self.metrics.last_step_at)
        if self.is_chief:
            self.sync_checkpoints()
            self.sync_tensorboard()
            if rc == 0:
                n = self.upload_model()
                self.say(f"uploaded the model ({n} files)")
        tail = self.logs.tail()  # the job's last words, before the agent's own line
        if rc != 0:
            self.say(f"the training process failed (exit {rc})")
        self.logs.flush(final=True)
        self.heartbeat()  # the training's last figures, read before the final status is
        self.trace.add(tr.FINISH, started, time.time(), parent=tr.NODE, attempt=self.attempt)
        self.publish_trace()  # before the final status: who reads that finds the whole trace
        if rc == 0:
            self.write_status(NodeState.SUCCEEDED, exit_code=0, reason=reason)
        else:
            sig = -rc if rc < 0 else None
            self.write_status(NodeState.FAILED, exit_code=rc, signal=sig, reason=reason, tail=tail)

    def report_error(self, exc: BaseException) -> None:
        """Report an error of the agent itself: its traceback goes into the node's log and,
        with the error on one line and the traceback's last lines, into a failed status for
        this attempt. Kills the training process if there is one. Blocking; not idempotent."""
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        lines = text.rstrip("\n").splitlines()
        self.say(f"agent error: {type(exc).__name__}: {exc}")
        for line in lines:
            self.logs.add(line)
        self.kill_child()
        self.logs.flush(final=True)
        self.publish_trace()
        reason = f"agent error: {type(exc).__name__}: {exc}"
        self.write_status(NodeState.FAILED, reason=reason[:500], tail=lines[-TAIL_LINES:])

    def stop(self, why: str) -> None:
        """Flush a checkpoint and stop: the training gets a grace period, then SIGKILL.
        A node that already reported a final state keeps it (teardown must not rewrite it)."""
        if self.child is None and self.state in FINAL_STATES:
            self.say(f"stopping ({why}) after a final state of {self.state}")
            self.logs.flush(final=True)
            return
        self.say(f"stop requested ({why}): flushing checkpoints")
        if self.is_chief and self.superseded() is None:
            self.sync_checkpoints()
        self.kill_child(grace_s=self.cluster.stop_grace_s)
        if self.is_chief:
            newer = self.superseded()
            if newer is None:
                n = self.sync_checkpoints()
                self.say(f"final checkpoint flushed ({n} new files)")
            else:
                self.say(f"attempt {newer} has begun: this node's last checkpoint stays here")
            self.sync_tensorboard()
        self.metrics.flush(final=True)
        self.logs.flush(final=True)
        self.publish_trace()
        self.write_status(NodeState.STOPPED, reason=why)

    def run(self) -> int:
        """Follow attempts until stopped. Returns the process exit code."""
        cluster = self._read(ClusterDoc, proto.cluster_key(self.run_id))
        if cluster is None:
            print(f"cloudtrain-agent: {proto.CLUSTER_NAME} is missing", file=sys.stderr)
            return 2
        self.cluster, self.attempt = cluster, cluster.attempt
        self.logs.redactor = Redactor.from_cluster(self.cluster)
        self.logs.segment_bytes = cluster.log_segment_bytes
        self.logs.segment_s = cluster.log_segment_s
        self.logs.snapshot_s = cluster.log_snapshot_s
        self.write_status(NodeState.BOOTSTRAPPED)
        self.agent_up()
        self.start_beating()
        try:
            while True:
                try:
                    self.train_once()
                    self.idle()
                except NewAttempt:
                    self.say(f"moving to attempt {self.cluster.attempt}")
                    if self.is_chief:
                        self.sync_checkpoints()
                    self.kill_child()
                except TimeoutError as exc:
                    self.say(str(exc))
                    self.kill_child()
                    self.publish_trace()
                    self.write_status(NodeState.FAILED, reason="rendezvous timeout")
                    self._idle_until_next_attempt()
                except RuntimeError as exc:
                    self.say(str(exc))
                    self.kill_child()
                    self.publish_trace()
                    self.write_status(NodeState.FAILED, reason=str(exc), exit_code=1)
                    self._idle_until_next_attempt()
                except StopRequested:
                    raise
                except Exception as exc:  # the agent's own error (or a bundle it cannot use)
                    self.report_error(exc)
                    self._idle_until_next_attempt()
                self.attempt = self.cluster.attempt
        except StopRequested as exc:
            self.stop(str(exc))
            return 0
        finally:
            self.stop_beating()
            self.kill_child()
            with contextlib.suppress(Exception):
                self.logs.flush(final=True)
                self.metrics.flush(final=True)
                self.heartbeat()

    def _idle_until_next_attempt(self) -> None:
        """Idle after a failure; a new attempt simply returns to the attempt loop."""
        with contextlib.suppress(NewAttempt):
            self.idle()

    def idle(self) -> None:
        """After a final status: keep beating until a new attempt, a stop or the deadline.
        Raises NewAttempt or StopRequested."""
        linger_until = time.time() + self.cluster.linger_s
        while time.time() < linger_until:
            self.tick()
            time.sleep(self.cluster.poll_s)
        raise StopRequested("linger time over")


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m cloudtrain.jobs.agent --run-id ... --role ... --index ...`."""
    parser = argparse.ArgumentParser(prog="cloudtrain-agent")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--role", required=True, choices=["chief", "worker", "ps", "evaluator"])
    parser.add_argument("--index", required=True, type=int)
    parser.add_argument("--store-uri", required=True)
    parser.add_argument("--work", required=True, type=Path)
    args = parser.parse_args(argv)
    from cloudtrain.providers import open_store

    store = open_store(args.store_uri)  # retrying (the registry wraps it once)
    agent = Agent(args.run_id, args.role, args.index, store, args.work)

    def on_sigterm(_signum: int, _frame: object) -> None:
        raise StopRequested("SIGTERM")

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        return agent.run()
    except StopRequested:  # asked to stop (SIGTERM) before the attempt loop: not an error
        return 0
    except Exception as exc:  # reported to the bucket, then the traceback on stderr: the
        with contextlib.suppress(Exception):  # bootstrap log, uploaded when the agent exits
            agent.report_error(exc)
        raise


if __name__ == "__main__":
    sys.exit(main())
