"""Failover across regions and clouds: when a place (a cloud's region) cannot hold the run's
nodes, for want of capacity in every zone (NoCapacityError) or of quota (QuotaError), the run
moves to the next-cheapest feasible place (`make_plan(..., avoid=tried)`), of the same cloud or,
with `provider: cheapest`, of the next cloud. `Failover` is a part the Orchestrator
(cloudtrain/run/orchestrator.py) holds, its inputs stated in its constructor; `Route` is its
bookkeeping, pure.

The rules:
- everything made in a place that failed (nodes, network, identities) is deleted (`teardown`)
  before the next is tried, and only then does the run's record name the next place
  (`Ledger.move_run`): the run's live resources are always in the place its record names, so
  `status`, `down` and a crash's teardown find them there; each try is a `failover` event;
- a place that failed for capacity is tried again only once every other feasible place failed
  (one more round over them, cheapest first); one that failed for quota never is;
- a spot run with no spot place left goes on-demand only when the spec sets
  `cluster.spot_fallback` (a fresh round over the places, at the on-demand price);
- a pinned `region:` or `zone:` is never left, nor is `local`;
- the run's deadline and budget count from its start: the time spent failing over (and the
  nodes billed in the places left) count, and each move checks both first;
- the run's store: within one cloud it stays where it was made (the nodes in another region
  reach it across regions: `bucket_note` prices that traffic); to another cloud it moves while
  it holds nothing but the run's own control documents (bundle, cluster.json, launch.json,
  lease, key, journal): they are deleted from the old store and made anew in the new cloud's
  default store (a fresh lease of term 1, the run's key, the journal backfilled from the
  ledger), each step a `store` event. A run whose store is the spec's `checkpoint:` or that
  resumes another run's checkpoints keeps its store's cloud.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cloudtrain.core.errors import NoCapacityError, PlanError, QuotaError
from cloudtrain.jobs.protocol import node_id, run_prefix
from cloudtrain.providers.base import node_name
from cloudtrain.providers.registry import declared
from cloudtrain.run.recovery import Stop
from cloudtrain.run.teardown import teardown
from cloudtrain.run.view import NodeView, Outcome
from cloudtrain.state import run_key

if TYPE_CHECKING:
    from cloudtrain.catalog.offers import Catalog
    from cloudtrain.jobspec.job import JobSpec
    from cloudtrain.plan.planner import Plan
    from cloudtrain.providers.base import Provider
    from cloudtrain.run.lease_holder import LeaseHolder
    from cloudtrain.run.provisioning import Provisioner
    from cloudtrain.run.resume import ResumeSource
    from cloudtrain.run.run_state import RunState
    from cloudtrain.run.view import Observer
    from cloudtrain.state.ledger import Ledger

Place = tuple[str, str]  # (provider, region)
MAX_REASON = 200  # characters of a place's failure in the route and the plan's notes
# Assumed $/GB of traffic between a node and its store in another region of the same cloud (no
# price of it in the catalog): AWS "Data Transfer OUT From Amazon EC2 To" another region, $0.02
# for most pairs (AWS re:Post, "Cost effective methods for accessing S3 buckets cross-region");
# GCS "data transfer between regions" on one continent, $0.02 (cloud.google.com/storage/pricing);
# Azure "inter-region" within a continent, $0.02 (azure.microsoft.com/pricing/details/bandwidth).
# Between continents each is dearer: the note says it is assumed.
INTER_REGION_USD_PER_GB = 0.02


@dataclass(frozen=True)
class Places:
    """How a run finds and reaches another place: what `cloudtrain.api.launch` gives the
    Orchestrator. `replan(avoid, on_demand)` is `make_plan(spec, catalog, avoid=avoid)` (the
    spec's on-demand copy when `on_demand`; the places the account rules out added to
    `avoid`): pure, PlanError when no place is left. `provider_for(plan)` builds the provider
    of the plan's cloud, region and zone (`api_build.run_provider`); it creates nothing."""

    replan: Callable[[Mapping[Place, str], bool], Plan]
    provider_for: Callable[[Plan], Provider]


@dataclass(frozen=True)
class Try:
    """One place tried: `kind` is quota or capacity; `on_demand`: the fallback's round."""

    place: Place
    kind: str
    reason: str
    on_demand: bool
    round: int


@dataclass
class Route:
    """The places a run tried, and which to avoid next (the rules of the module). Pure."""

    fallback: bool  # a spot run whose spec allows on-demand
    spot: bool = False  # the run asked for spot
    tries: list[Try] = field(default_factory=list)
    on_demand: bool = False
    round: int = 1
    landed: Place | None = None

    def failed(self, place: Place, kind: str, reason: str) -> None:
        """Record that `place` failed for `kind` (quota or capacity), said in `reason`."""
        line = " ".join(reason.split())[:MAX_REASON]
        self.tries.append(Try(place, kind, f"{kind}: {line}", self.on_demand, self.round))

    def avoid(self) -> dict[Place, str]:
        """The places the next plan must avoid: in the first round every place tried (in this
        spot or on-demand pass); in the second, the quota failures and the places tried again."""
        mine = [t for t in self.tries if t.on_demand == self.on_demand]
        kept = [t for t in mine if self.round == 1 or t.kind == "quota" or t.round == 2]
        return {t.place: t.reason for t in kept}

    def next_round(self) -> bool:
        """No place is left in this round: start the next (the capacity failures once more,
        then the on-demand fallback where allowed). False when none is left."""
        mine = [t for t in self.tries if t.on_demand == self.on_demand]
        if self.round == 1 and any(t.kind == "capacity" for t in mine):
            self.round = 2
            return True
        if self.fallback and not self.on_demand:
            self.on_demand, self.round = True, 1
            return True
        return False

    def text(self) -> str:
        """`tried aws us-east-1: quota: ...; aws us-west-2: capacity: ...; landed in aws
        eu-west-1`: the path taken, for the summary and the ledger. Empty when the run landed
        where it was planned."""
        if not self.tries:
            return ""
        parts, on_demand = [], False
        for t in self.tries:
            if t.on_demand and not on_demand:
                parts.append("no spot place left: on-demand from here")
                on_demand = True
            again = " (again)" if t.round == 2 else ""
            parts.append(f"{t.place[0]} {t.place[1]}{again}: {t.reason}")
        if self.on_demand and not on_demand:
            parts.append("no spot place left: on-demand from here")
        text = "tried " + "; ".join(parts)
        if self.landed is not None:
            mode = " on-demand" if self.on_demand else ""
            text += f"; landed{mode} in {self.landed[0]} {self.landed[1]}"
        return text

    def exhausted(self, why: PlanError) -> NoCapacityError | QuotaError:
        """The error ending a run no place could hold: QuotaError when every try failed for
        quota, else NoCapacityError; the message gives the path, the hint what to do."""
        hint = "ask the cloud for GPU quota (`cloudtrain check JOB` shows it), try later"
        hint += ", or another accelerator"
        if self.spot and not self.fallback:
            hint += "; spot_fallback: true lets a spot run go on-demand"
        message = f"no place could hold the run: {self.text()}; {why.message}"
        if all(t.kind == "quota" for t in self.tries):
            return QuotaError(message, hint=hint)
        return NoCapacityError(message, hint=hint)


def bucket_note(store_uri: str, made_in: Place, plan: Plan) -> str | None:
    """The plan note for a run whose store stays in `made_in` while its nodes are in another
    region of the same cloud: the traffic between them is billed. None when they share a
    region. Pure."""
    if (plan.provider, plan.region) == made_in or plan.provider != made_in[0]:
        return None
    return (
        f"the run's store {store_uri} stays in {made_in[1]}: the nodes in {plan.region} reach "
        f"it across regions (about ${INTER_REGION_USD_PER_GB:.2f}/GB each way, assumed; "
        "checkpoints, logs and the bundle)"
    )


class Failover:
    """`land()`: make the run's network and nodes in its plan's place, else in the next one.

    Inputs: the run's shared `state`, its `spec`, `ledger`, `observer`, `run_id`, `places` (how
    to plan and reach another place; None: the run stays), the `provisioner` (which makes the
    network and nodes, and opens a new store), the `lease_holder` (which fences a new place's
    provider and lets a left store's lease go), `resume_from` and `budget_spent` (why the run
    must stop for its budget, None while it may go on: cloudtrain/run/budget.py). It changes
    `state.plan`, `provider`, `store`, `store_uri`, `zone`, `info` and `view` (cost, $/h,
    nodes) when the run moves, and keeps the path taken in `route`."""

    def __init__(
        self,
        state: RunState,
        spec: JobSpec,
        ledger: Ledger,
        observer: Observer,
        run_id: str,
        places: Places | None,
        provisioner: Provisioner,
        lease_holder: LeaseHolder,
        resume_from: ResumeSource | None,
        budget_spent: Callable[[], str | None],
    ) -> None:
        self.state, self.spec, self.ledger, self.observer = state, spec, ledger, observer
        self.run_id, self.places, self.resume_from = run_id, places, resume_from
        self.provisioner, self.lease_holder = provisioner, lease_holder
        self.budget_spent = budget_spent
        self.route: Route | None = None  # the places tried, once `land` began

    def land(self) -> None:
        """Make the network and every node in the plan's place; where the place has no
        capacity in any zone or no quota, delete what was made there and move to the next
        place (see the module). Raises NoCapacityError/QuotaError naming the path when no
        place can hold the run, and Stop when the deadline or budget ran out meanwhile.
        Blocks."""
        st = self.state
        spot = bool(self.spec.cluster.spot)
        allowed = spot and bool(self.spec.cluster.spot_fallback)
        route = self.route = Route(fallback=allowed, spot=spot)
        made_in: Place = (st.plan.provider, st.plan.region)  # where the store was made
        while True:
            try:
                self.provisioner.place_nodes()
            except (NoCapacityError, QuotaError) as exc:
                kind = "quota" if isinstance(exc, QuotaError) else "capacity"
                place = (st.plan.provider, st.plan.region)
                route.failed(place, kind, exc.message)
                self._say(f"{place[0]} {place[1]}: {route.tries[-1].reason}")
                if not self._may_leave():
                    raise
                self._say(f"deleting what was made in {place[0]} {place[1]}")
                teardown(st.provider, self.ledger, self.run_id, self.observer.event)
                nxt = self._next_plan(route)
                self._check_limits()
                made_in = self._move_to(nxt, made_in)
                continue
            if route.tries:
                route.landed = (st.plan.provider, st.plan.region)
                self._say(route.text())
            return

    def _say(self, line: str) -> None:
        """One failover line: to the observer and as a `failover` event in the ledger."""
        self.observer.event(line)
        self.ledger.event(self.run_id, "failover", line)

    def _may_leave(self) -> bool:
        """Whether the run may leave its place: not with a pinned region or zone, not on
        local, and only where the caller said how to build another place's provider."""
        pinned = bool(self.spec.region or self.spec.zone)
        leavable = declared(self.state.plan.provider).may_fail_over
        return self.places is not None and not pinned and leavable

    def _next_plan(self, route: Route) -> Plan:
        """The plan of the next place (the route's rounds; another cloud only where the store
        may move). Raises the route's exhausted error when none is left. Pure but for
        `replan`."""
        assert self.places is not None
        kept_cloud = self._store_cloud()
        stays: dict[Place, str] = {}
        while True:
            avoid = {**route.avoid(), **stays}
            try:
                plan = self.places.replan(avoid, route.on_demand)
            except PlanError as exc:
                if route.next_round():
                    continue
                raise route.exhausted(exc) from None
            if kept_cloud and plan.provider != kept_cloud:
                stays[plan.place] = f"the run's store stays on {kept_cloud}"
                continue
            if plan.place in avoid:  # a planner that ignores avoid (local): never loop
                raise route.exhausted(PlanError(f"{plan.provider} has no other place"))
            return plan

    def _store_cloud(self) -> str | None:
        """The cloud the run's store ties it to (`checkpoint:`, or `--resume` of another run's
        checkpoints), else None: the store may move with the run."""
        if self.spec.checkpoint or self.resume_from is not None:
            return str(self.state.plan.provider)
        return None

    def _check_limits(self) -> None:
        """Raise Stop when the deadline passed or the budget is spent (both count from the
        run's start, the places left included). Blocks (a ledger read)."""
        if time.time() > self.state.deadline:
            raise Stop(Outcome.DEADLINE, f"max_hours ({self.spec.max_hours} h) reached")
        self.state.view.cost_usd = self.ledger.billed_cost(self.run_id)
        spent = self.budget_spent()
        if spent is not None:
            raise Stop(Outcome.BUDGET_EXCEEDED, f"{spent} while failing over")

    def _move_to(self, plan: Plan, made_in: Place) -> Place:
        """Make `plan` the run's: its provider, place and nodes, the run's record first (nothing
        exists in the new place yet), and to another cloud the store (see the module). Returns
        where the run's store now is. Blocks."""
        st = self.state
        assert self.places is not None
        provider = self.places.provider_for(plan)
        cross = plan.provider != st.plan.provider
        if cross:
            self._leave_store()
            st.store_uri = provider.default_store_uri(self.run_id)
            st.store = provider.store(st.store_uri)
            st.store.ensure_bucket()  # before anything reads it (a stop now lists it)
            st.provider = provider  # fenced again by the new store's lease (open_store)
            made_in = (plan.provider, plan.region)
        else:
            st.provider = self.lease_holder.fence(provider)
            note = None if self.spec.checkpoint else bucket_note(st.store_uri, made_in, plan)
            if note:
                plan = dataclasses.replace(plan, notes=(*plan.notes, note))
                self._say(note)
        st.plan, st.zone = plan, plan.zone
        self.provisioner.new_place()
        st.info = dataclasses.replace(
            st.info,
            region=plan.region,
            zone=plan.zone,
            store_uri=st.store_uri,
            nodes=tuple(node_id(n.role, n.index) for n in plan.nodes),
        )
        st.view.hourly_usd = plan.hourly_usd
        st.view.nodes = [
            NodeView(node_name(self.run_id, n.role, n.index), n.role, n.index) for n in plan.nodes
        ]
        self.ledger.move_run(
            self.run_id,
            plan.provider,
            plan.region,
            plan.zone,
            st.store_uri,
            json.dumps(plan.to_dict()),
            account=provider.account(),
        )
        self._say(f"moving to {plan.provider} {plan.region} at ${plan.hourly_usd:.2f}/h")
        if cross:  # the new store: the run's key first (other machines read it there), then
            key = self.ledger.run_key(self.run_id)  # the lease, journal, bundle and documents
            assert key is not None  # kept by the first store's lease
            run_key.publish(st.store, self.run_id, key)
            self.provisioner.open_store()
        return made_in

    def _leave_store(self) -> None:
        """Leave the run's store for another cloud's: the lease holder writes out and stops
        the journal and stops renewing the lease, then the run's prefix is deleted (only its
        control documents are there). Blocks."""
        old = self.state.store_uri
        self.lease_holder.let_go()
        gone = self.state.store.delete_prefix(run_prefix(self.run_id))
        self._say(f"store: the run's {gone} control objects deleted from {old}; a new store")


def places_for(
    spec: JobSpec, catalog: Catalog, ruled_out: Mapping[Place, str] | None = None
) -> Places:
    """The `Places` of a run of `spec`: plans from `catalog` avoiding the places tried and
    those of `ruled_out` (e.g. the regions whose quota the account check found too small),
    providers built as `api_build.run_provider` builds them. Creates nothing."""
    from cloudtrain.plan.planner import make_plan, on_demand_spec
    from cloudtrain.run import build as api_build

    def replan(avoid: Mapping[Place, str], on_demand: bool) -> Plan:
        asked = on_demand_spec(spec) if on_demand else spec
        return make_plan(asked, catalog, avoid={**(ruled_out or {}), **avoid})

    def provider_for(plan: Plan) -> Provider:
        return api_build.run_provider(spec, plan)

    return Places(replan, provider_for)
