"""The node agent's rendezvous (a mixin of `jobs.agent.Agent`): register this node's address for
the attempt, wait until every node has, and check that every peer answers at TCP level before the
training starts (`jobs/reachability.py`). Standard library only (node-side: Python 3.10+)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cloudtrain.core import env
from cloudtrain.jobs import horovod, reachability
from cloudtrain.jobs import protocol as proto
from cloudtrain.jobs import trace as tr
from cloudtrain.providers.change_wait import ChangeWaiter


class Rendezvous:
    """Registration, the wait for the cluster and the peer check. The agent owns the state these
    read (store, run, attempt, cluster) and the helpers they call (tick, say, traced, _read)."""

    store: Any
    run_id: str
    me: str
    attempt: int
    cluster: proto.ClusterDoc
    declared: Any  # jobs.strategies.StrategyInfo (the agent's declaration of its strategy)
    trace: Any  # jobs.trace.Tracer
    tick: Callable[[], None]
    say: Callable[[str], None]
    traced: Callable[..., Any]  # a context manager timing a span (jobs/node_trace.py)
    _read: Callable[..., Any]  # a protocol document, or None
    skips: Any  # jobs.bucket_reads.Skips: why a document could not be read

    def address(self) -> str:
        """host:port this node registers: $CLOUDTRAIN_NODE_HOST or the address of the interface
        the default route leaves by, never a loopback while another exists (jobs/reachability.py);
        $CLOUDTRAIN_NODE_PORT or the job's port (on a cloud every node uses the job's port)."""
        host = reachability.discover_host()
        port = env.NODE_PORT.raw() or str(self.cluster.port)
        return f"{host}:{port}"

    def check_peers(self, cluster: dict[str, list[str]]) -> None:
        """Before the training starts, every peer in `cluster` must answer at TCP level (a
        refusal counts: the path is open). Blocking, ticking meanwhile; ~0 s when they answer at
        once. Raises reachability.Unreachable (a RuntimeError: this attempt's failed status then
        names the silent peer), StopRequested or NewAttempt."""
        peers = reachability.peers_of(cluster, self.me)
        timeout_s = reachability.probe_deadline_s(self.cluster.rendezvous_timeout_s)
        try:
            took = reachability.check_peers(peers, timeout_s, tick=self.tick)
        except reachability.Unreachable as exc:
            for node, why in exc.why.items():
                self.say(f"{node} never answered: {why}")
            raise
        if peers:
            self.say(f"attempt {self.attempt}: {len(peers)} peers reachable ({took:.2f} s)")

    def rendezvous(self) -> dict[str, list[str]]:
        """Register for this attempt and wait until every node has. Raises StopRequested,
        NewAttempt, TimeoutError after `rendezvous_timeout_s`, or RuntimeError naming a peer
        whose registration cannot be read (over its cap, too deep, ill-typed: each GET is
        bounded)."""
        run, attempt = self.run_id, self.attempt
        slots = None
        if self.declared.launch == "horovod_ranks":
            slots = horovod.local_slots()  # one process per GPU (jobs/strategies.py: launch)
        mine = proto.Registration(address=self.address(), time=time.time(), slots=slots)
        with self.traced(tr.REGISTER):
            self.store.put(proto.registration_key(run, attempt, self.me), mine.to_json())
        waiting = time.time()
        roles = self.cluster.roles
        expected = {proto.node_id(r, i) for r, n in roles.items() for i in range(n)}
        deadline = time.time() + self.cluster.rendezvous_timeout_s
        self.say(f"attempt {self.attempt}: waiting for {len(expected)} nodes")
        # on local, up as soon as a registration lands (providers/change_wait.py)
        waiter = ChangeWaiter(self.store.uri, [proto.registrations_prefix(run, attempt)])
        while True:
            present = {
                o.key.rsplit("/", 1)[-1].removesuffix(".json")
                for o in self.store.list(proto.registrations_prefix(run, attempt))
            }
            if expected <= present:
                break
            if time.time() > deadline:
                missing = ", ".join(sorted(expected - present))
                raise TimeoutError(f"rendezvous timed out waiting for {missing}")
            self.tick()
            waiter.wait(self.cluster.poll_s)
        cluster: dict[str, list[str]] = {}
        for role, count in roles.items():
            cluster[role] = []
            for i in range(count):
                node = proto.node_id(role, i)
                key = proto.registration_key(run, attempt, node)
                reg = self._read(proto.Registration, key)
                if reg is None:
                    why = self.skips.reasons.get(key, "gone since it was listed")
                    raise RuntimeError(f"rendezvous: {node}'s registration cannot be read: {why}")
                cluster[role].append(reg.address)
        self.trace.add(tr.RENDEZVOUS, waiting, time.time(), parent=tr.NODE, attempt=attempt)
        self.say(f"attempt {self.attempt}: cluster complete")
        return cluster
