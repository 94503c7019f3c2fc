"""`run --detach`: create the run's controller node and hand it the lease (issue 17).

After the nodes exist, the laptop creates one small on-demand CPU VM (the cheapest catalog offer
with at least 2 GB: cloudtrain/managed/controller_offer.py) under an identity scoped to this run,
writes
control/launch.json, and hands the lease to it (live for the boot timeout, with the node named as
its successor, so nobody else takes the run while it boots). The node boots through the same
startup script with role `controller` and runs cloudtrain/managed/controller_node.py. Every
resource is in
the ledger (and so in the journal) before its create call; a failure or a signal before the
handover ends in the laptop's own teardown, as any failed run does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cloudtrain.core.crashpoints import crash_point
from cloudtrain.plan.planner import NodePlan
from cloudtrain.providers.base import Resource, node_name
from cloudtrain.state import launch_doc
from cloudtrain.state.launch_doc import LaunchDoc

if TYPE_CHECKING:
    from cloudtrain.run.orchestrator import Orchestrator

ROLE = "controller"


def controller_owner(name: str) -> str:
    """The lease owner id of the controller node `name`. Pure."""
    return f"controller:{name}"


def launch_controller(orch: Orchestrator) -> str:
    """Create the controller node of `orch`'s run (identity first) and hand it the lease.
    Returns the node's name. Raises what the provider raises (the caller tears down). Blocks
    until the create call returns, not until the node boots."""
    from cloudtrain.managed.controller_offer import check_hand_off, controller_offer

    check_hand_off(orch.spec.cluster.strategy_info)  # the callers asked already: the last guard
    run_id, ledger, compute = orch.run_id, orch.ledger, orch.provider.compute
    offer = controller_offer(orch.provider.name, orch.plan.region)
    name = node_name(run_id, ROLE, 0)
    planned = compute.planned_controller_identity(orch.info)
    for res in planned:
        ledger.record_intent(res)
    crash_point("controller-identity-ledger")
    if planned:
        orch.observer.event(f"controller identity: {', '.join(r.kind for r in planned)}")
    made = compute.ensure_controller_identity(orch.info)
    crash_point("controller-identity")
    for res in made:
        ledger.mark_created(run_id, res.kind, res.id, res.cloud_id)
    assert orch.bundle is not None
    doc = LaunchDoc.of(
        orch.spec,
        run_id,
        orch.options,
        orch.started,
        orch.bundle.sha256,
        orch.store.uri,
        controller=name,
        controller_hourly_usd=offer.hourly_usd,
    )
    launch_doc.write(orch.store, doc, ledger.run_key(run_id))  # signed: cloudtrain/state/run_key.py
    plan = NodePlan(
        role=ROLE,
        index=0,
        instance_type=offer.instance_type,
        accelerator=None,
        accelerator_count=0,
        spot=False,
        region=orch.plan.region,
        zone=orch.zone,
        price_hourly=offer.hourly_usd,
    )
    request = orch.node_request(plan)
    ledger.record_intent(
        Resource(orch.provider.name, "node", name, orch.plan.region, run_id), offer.hourly_usd
    )
    crash_point("controller-ledger")
    orch.observer.event(
        f"creating the controller node {name} ({offer.instance_type}, "
        f"${offer.hourly_usd:.4f}/h, on-demand)"
    )
    node = compute.create_node(orch.info, request)
    crash_point("controller-created")
    ledger.mark_created(run_id, "node", name, node.cloud_id)
    ledger.event(run_id, "controller", f"created {name} ({offer.instance_type})")
    orch.extra_hourly_usd = offer.hourly_usd
    orch.hand_over(controller_owner(name), orch.options.boot_timeout_s)
    crash_point("handover")
    ledger.event(run_id, "lease", f"handed to {controller_owner(name)}")
    orch.observer.event(
        f"detached: {name} watches the run now (recovery, budget, deadline, teardown); "
        f"`cloudtrain attach {run_id}` follows it, `cloudtrain down {run_id}` ends it"
    )
    return name
