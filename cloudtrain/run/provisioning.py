"""Provisioning a run (the orchestrator's part before the watch): the bucket, the lease, the
bundle's upload, cluster.json, the network, then every node at once, in one zone, each in the
ledger before its create call. `Provisioner` is a part the Orchestrator
(cloudtrain/run/orchestrator.py) holds; its inputs are stated in its constructor."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from cloudtrain import __version__
from cloudtrain.core.crashpoints import crash_point
from cloudtrain.core.errors import CloudtrainError, NoCapacityError
from cloudtrain.jobs import protocol
from cloudtrain.jobs import trace as tr
from cloudtrain.jobs.protocol import ClusterDoc, node_id
from cloudtrain.providers import registry
from cloudtrain.providers.base import Node, NodeRequest, NodeStack, Resource, node_name
from cloudtrain.run.resume import copy_checkpoints
from cloudtrain.run.startup import StartupParams, render_startup
from cloudtrain.run.wheelhouse import WheelhousePlanner, stack_pins
from cloudtrain.state import launch_doc
from cloudtrain.state.ledger import ALLOCATION

if TYPE_CHECKING:
    from cloudtrain.insight.run_trace import RunTrace
    from cloudtrain.jobspec.job import JobSpec
    from cloudtrain.jobspec.run_options import RunOptions
    from cloudtrain.plan.planner import NodePlan
    from cloudtrain.run.lease_holder import LeaseHolder
    from cloudtrain.run.resume import ResumeSource
    from cloudtrain.run.run_state import RunState
    from cloudtrain.run.view import Observer
    from cloudtrain.state.ledger import Ledger

PRESIGN_TTL_S = 3600
CONTROLLER_GRACE_S = 900  # the controller node's deadline is the run's plus its teardown
CONTROLLER_DISK_GB = 30  # the controller node's: Azure's smallest OS disk of the images is 30 GB


class Provisioner:
    """Provision a run (`open_store`, `place_nodes`), and the node creates a new attempt reuses
    (`create_nodes`, `node_request`, `write_cluster`).

    Inputs: the run's shared `state`, its `spec`, `ledger`, `observer`, `options`, `run_id`,
    `trace`, the `lease_holder` (a new run's lease is taken in `open_store`) and `resume_from`
    (whose checkpoints a new run copies). It changes `state.zone`, `state.info` (its node
    stack; the zone the nodes are made in) and `state.cluster`; its wheelhouse planner is its
    own (`new_place` forgets it)."""

    def __init__(
        self,
        state: RunState,
        spec: JobSpec,
        ledger: Ledger,
        observer: Observer,
        options: RunOptions,
        run_id: str,
        trace: RunTrace,
        lease_holder: LeaseHolder,
        resume_from: ResumeSource | None = None,
    ) -> None:
        self.state, self.spec, self.ledger, self.observer = state, spec, ledger, observer
        self.options, self.run_id, self.trace = options, run_id, trace
        self.lease_holder, self.resume_from = lease_holder, resume_from
        self._wheelhouse: WheelhousePlanner | None = None  # made at the first node's request
        self._billed_jobs: set[str] = set()  # a gang compute's jobs in the ledger (bill_...)

    def new_place(self) -> None:
        """The run moved to another place (a failover): the next node's request plans its
        wheelhouse anew. Pure."""
        self._wheelhouse = None

    def open_store(self) -> None:
        """The run's bucket, its lease and journal (a new run's), the bundle, cluster.json and
        the launch document. Idempotent; blocks."""
        st = self.state
        self.trace.phase(tr.BUCKET)
        self.observer.event(f"bucket {st.store.uri}")
        st.store.ensure_bucket()
        if self.lease_holder.lease is None:  # a new run: nobody else can hold it; term 1
            self.lease_holder.take_new_lease()
        assert st.bundle is not None
        self.trace.phase(tr.PROVISION)
        key = protocol.bundle_key(self.run_id, st.bundle.sha256)
        if not st.store.list(key):
            st.store.put_file(key, str(st.bundle.path))
        st.info = dataclasses.replace(st.info, node_stack=self._node_stack())
        left = st.bundle.left_out
        self.observer.event(
            f"bundle {st.bundle.sha256[:12]} ({st.bundle.files} files, "
            f"{st.bundle.size / 1024:.0f} KiB"
            + (f"; left out, cloudtrain's own: {', '.join(left)}" if left else "")
            + ")"
        )
        if self.resume_from is not None:
            src = self.resume_from
            same = src.store_uri == st.store_uri
            source = st.store if same else st.provider.store(src.store_uri)
            copied = copy_checkpoints(source, src.run_id, st.store, self.run_id)
            self.ledger.event(self.run_id, "resume", f"from {src.run_id}: {copied} files")
            self.observer.event(f"resuming {src.run_id}: copied {copied} checkpoint files")
        crash_point("bundle")
        st.cluster = self._cluster_doc()
        self.write_cluster()
        # what another controller needs to adopt the run: `cloudtrain attach` takes an attached
        # run over after a closed lid or a crash (issue 29); `run --detach` rewrites it with its
        # controller node's name
        launch_doc.write(
            st.store,
            launch_doc.LaunchDoc.of(
                self.spec,
                self.run_id,
                self.options,
                st.started,
                st.bundle.sha256,
                st.store.uri,
            ),
            key=self.ledger.run_key(self.run_id),
        )
        self.ledger.set_status(self.run_id, "provisioning")

    def _node_stack(self) -> NodeStack:
        """The pins a bare node installs (with the CUDA wheels where a node has GPUs; a
        strategy's own stack) and the bundle holding the wheel: what a compute that builds
        the stack once for all nodes needs (Slurm); with the extra of the bucket's provider
        when that is not the run's (a Slurm run's bucket in S3: the nodes need boto3). Pure."""
        st, declared = self.state, self.spec.cluster.strategy_info
        assert st.bundle is not None
        gpu = not declared.on_tpu and any(n.accelerator_count for n in st.plan.nodes)
        pins = stack_pins(gpu, declared.image_module or "")
        scheme = st.store.uri.split("://", 1)[0]
        foreign = scheme in registry.declared(st.provider.name).other_schemes
        extra = (registry.info_for_uri(st.store.uri).extra or "") if foreign else ""
        return NodeStack(tuple(pins), str(st.bundle.path), st.bundle.wheel_name, extra)

    def place_nodes(self) -> None:
        """The network, then every node at once in one zone of the plan's region, each in the
        ledger before its create call. Raises NoCapacityError (every zone full) or QuotaError
        with what was made left in place. Blocks."""
        compute = self.state.provider.compute
        for res in compute.planned_network(self.state.info):
            self.ledger.record_intent(res)
        crash_point("network-ledger")
        network = compute.ensure_network(self.state.info)
        crash_point("network")
        for res in network:
            self.ledger.mark_created(self.run_id, res.kind, res.id, res.cloud_id)
        self.trace.phase(tr.CREATE)
        self.create_in_some_zone()

    def create_in_some_zone(self) -> None:
        """Create every node, all in one zone: the planned one, then the region's other zones
        while a zone has no capacity (the nodes made in a full zone are deleted first); a zone
        the spec pins is never left. Raises NoCapacityError naming every zone tried."""
        st = self.state
        zones = [] if self.spec.zone else st.provider.compute.zones()
        candidates = [st.zone, *(z for z in zones if z != st.zone)]
        tried: list[str] = []
        for zone in candidates:
            st.zone = zone
            st.info = dataclasses.replace(st.info, zone=zone)
            where = f"zone {zone}" if zone else "no zone"
            try:
                self.create_nodes(list(st.plan.nodes))
                if tried:
                    landed = f"landed in {where} after trying {', '.join(tried)}"
                    self.ledger.event(self.run_id, "zone", landed)
                return
            except NoCapacityError as exc:
                tried.append(where)
                self.observer.event(f"{where}: {exc.message}")
                if len(tried) < len(candidates):
                    self.observer.event("deleting the nodes made there; trying the next zone")
                    self._delete_nodes()
        types = sorted({n.instance_type for n in st.plan.nodes})
        raise NoCapacityError(
            f"no capacity for {', '.join(types)} in {st.plan.region}: tried {', '.join(tried)}",
            hint="try another region, another accelerator, or spot: false",
        )

    def list_nodes(self) -> list[Node]:
        """The run's nodes from the cloud (the provider retries the call). Blocks."""
        return self.state.provider.compute.list_nodes(self.run_id)

    def agent_nodes(self) -> tuple[set[str], int]:
        """The nodes ("worker-0") whose agent may run: alive, not the controller, and not still
        pending in a gang compute's queue (Slurm: no agent runs before the allocation starts);
        and how many are so queued. Blocks (one listing)."""
        gang = self.state.provider.compute.gang
        live, queued = set(), 0
        for n in self.list_nodes():
            if gang and n.state == "pending":
                queued += 1
            elif n.alive and n.role != "controller":
                live.add(node_id(n.role, n.index))
        return live, queued

    def bill_allocations(self, nodes: list[Node]) -> None:
        """On a gang compute, the allocation of every job among `nodes` seen running (or past
        it) for the first time goes into the ledger (kind ALLOCATION, its id `job-<cloud id>`)
        at the plan's $/h: what the run's GPUs cost from now to its end (`end_allocations`,
        or the teardown). Queue time costs nothing. Idempotent (a job is recorded once); no
        call on a VM compute. Blocks (ledger writes)."""
        if not self.state.provider.compute.gang:
            return
        started = {n.cloud_id for n in nodes if n.cloud_id and n.state != "pending"}
        for job in sorted(started - self._billed_jobs):
            hourly = sum(n.price_hourly for n in self.state.plan.nodes)
            resource = Resource(
                self.state.provider.name, ALLOCATION, f"job-{job}", self.state.plan.region,
                self.run_id, cloud_id=job,
            )  # fmt: skip
            self.ledger.record_intent(resource, hourly)
            self.ledger.mark_created(self.run_id, ALLOCATION, resource.id, job)
            self._billed_jobs.add(job)

    def end_allocations(self) -> None:
        """The run's allocations in the ledger end now (their jobs were cancelled): their
        bills stop. Idempotent. Blocks (ledger writes)."""
        for rec in self.ledger.resources(self.run_id, live_only=True):
            if rec.kind == ALLOCATION:
                self.ledger.mark_deleted(self.run_id, ALLOCATION, rec.resource_id)

    def _delete_nodes(self) -> None:
        """Delete every node of the run (not its network) and mark them in the ledger."""
        compute = self.state.provider.compute
        listed = self.list_nodes()
        compute.delete_listed(listed)
        for rec in self.ledger.resources(self.run_id, live_only=True):
            if rec.kind == "node":
                self.ledger.mark_deleted(self.run_id, "node", rec.resource_id)

    def _cluster_doc(self) -> ClusterDoc:
        """The run's cluster document; the agents' paces are ClusterDoc's defaults. Pure."""
        spec, opts = self.spec, self.options
        return ClusterDoc(
            run_id=self.run_id,
            strategy=spec.cluster.strategy,
            roles=self.state.plan.roles(),
            port=spec.cluster.port,
            attempt=self.state.attempt,
            deadline=self.state.deadline,
            entrypoint=spec.entrypoint,
            setup=spec.setup or "",
            env=spec.env_values(),  # secrets included: the cluster document is their only channel
            secrets=list(spec.secret_names()),  # names only; agents redact their values
            poll_s=min(ClusterDoc.poll_s, opts.poll_s),  # agents' rendezvous/barrier polling
            rendezvous_timeout_s=opts.rendezvous_timeout_s,
            stop_grace_s=max(1.0, opts.stop_grace_s - 5),
            linger_s=opts.linger_s,
        )

    def write_cluster(self) -> None:
        """Write the cluster document for the current attempt (agents follow it). Blocks."""
        self.state.cluster = dataclasses.replace(self.state.cluster, attempt=self.state.attempt)
        self.state.store.put(protocol.cluster_key(self.run_id), self.state.cluster.to_json())

    def node_request(self, node: NodePlan) -> NodeRequest:
        """The create request of `node`: its startup script (presigned bundle and log URLs,
        the wheelhouse where the image is bare). Blocks (presigning; a wheelhouse listing)."""
        st = self.state
        assert st.bundle is not None
        name = node_name(self.run_id, node.role, node.index)
        controller = node.role == "controller"  # the controller node: CPU, the cloud's image
        skeleton = NodeRequest(
            run_id=self.run_id,
            role=node.role,
            index=node.index,
            instance_type=node.instance_type,
            startup_script="",
            zone=st.zone,
            spot=node.spot,
            image=None if controller else self.spec.cluster.image,
            disk_gb=CONTROLLER_DISK_GB if controller else self.spec.cluster.disk_gb,
            accelerator=node.accelerator,
            accelerator_count=node.accelerator_count,
        )
        params = StartupParams(
            run_id=self.run_id,
            role=node.role,
            index=node.index,
            node_name=name,
            store_uri=st.store.uri,
            bundle_url=st.store.presign_get(
                protocol.bundle_key(self.run_id, st.bundle.sha256), PRESIGN_TTL_S
            ),
            bundle_sha256=st.bundle.sha256,
            log_put_url=st.store.presign_put(
                protocol.bootstrap_log_key(self.run_id, node_id(node.role, node.index)),
                PRESIGN_TTL_S,
            ),
            version=__version__,
            # the controller node outlives the nodes by the teardown: its dead-man switch too
            deadline_epoch=int(st.deadline + (CONTROLLER_GRACE_S if controller else 0)),
            # a TPU slice's chips are its accelerators, not GPUs the bootstrap should look for
            gpu_count=0 if self.spec.cluster.strategy_info.on_tpu else node.accelerator_count,
            pip_extra=st.provider.name,
            **({} if controller else _image_module(self.spec)),
        )
        blocks = st.provider.compute.startup_blocks(st.info, skeleton)
        # a bare image's stack: from the bucket's wheelhouse if any (not the controller's)
        if blocks.install_stack and not controller:
            if self._wheelhouse is None:
                self._wheelhouse = WheelhousePlanner(st.store, st.provider.name, PRESIGN_TTL_S)
            # a strategy with a stack of its own (horovod) has a wheelhouse of its own
            offer = self._wheelhouse.offer_for(skeleton, params.require_module)
            params = dataclasses.replace(params, wheelhouse=offer)
        script = render_startup(params, blocks)
        return NodeRequest(**{**skeleton.__dict__, "startup_script": script})

    def create_nodes(self, nodes: list[NodePlan]) -> None:
        """Record every node in the ledger, then create them all in parallel. Raises
        NoCapacityError/QuotaError (with a hint) after every request was attempted."""
        requests = [self.node_request(n) for n in nodes]
        # a gang compute's nodes wait in its queue for free: their allocation bills once it
        # runs (`bill_allocations`)
        gang = self.state.provider.compute.gang
        prices = {node_name(self.run_id, n.role, n.index): n.price_hourly for n in nodes}
        if gang:
            prices = dict.fromkeys(prices, 0.0)
        for req in requests:
            self.ledger.record_intent(
                Resource(
                    self.state.provider.name, "node", req.name, self.state.plan.region, self.run_id
                ),
                prices[req.name],
            )
        self.observer.event(f"creating {len(requests)} node(s)")
        crash_point("nodes-ledger")
        try:
            created = self.state.provider.compute.create_nodes(
                self.state.info, requests, on_created=self._traced_create
            )
        except CloudtrainError as exc:
            # some nodes may exist: the cloud says which, so the ledger matches it
            live = self.list_nodes()
            self._mark_created([n for n in live if n.name in {r.name for r in requests}])
            if isinstance(exc, NoCapacityError) and exc.hint is None:
                exc.hint = "try another region or zone, another accelerator, or spot: false"
            raise
        crash_point("after-creates")
        self._mark_created(created)

    def _traced_create(self, name: str, start: float, end: float) -> None:
        self.trace.child(f"create {name}", start, end, tr.CREATE)

    def _mark_created(self, nodes: list[Node]) -> None:
        for node in nodes:
            self.ledger.mark_created(self.run_id, "node", node.name, node.cloud_id)
            self.ledger.event(self.run_id, "node", f"created {node.name}")


def _image_module(spec: JobSpec) -> dict[str, str]:
    """The startup parameters that make a node's bootstrap check the module its strategy needs
    on the image (jobs/strategies.py: `image_module`); none when it needs none. Pure."""
    declared = spec.cluster.strategy_info
    if declared.image_module is None:
        return {}
    return {
        "require_module": declared.image_module,
        "require_for": declared.name,
        "require_hint": declared.image_hint,
    }
