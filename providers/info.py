"""What a provider declares about itself: one `ProviderInfo` per provider, as `INFO` in its package.

The registry (`cloudtrain.providers`) reads these objects and nothing else: which URI scheme a
provider serves, which class builds it, which pip extra installs its SDK, where its options model,
node-side preemption probe and pricing client live, and its storage price. Everything a module
outside `providers/` needs to know about a provider (a cloud, or `local`: whether its nodes are
processes on this machine, how closely it is watched), it asks here, so no such module names one.

Standard library only, and it imports nothing else of the project: the node agent and
`cloudtrain --help` read it without any SDK.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ProviderInfo:
    """A provider's declared knowledge. Every "module:attr" is imported only when asked for
    (`cloudtrain.providers.load`), so holding an INFO costs no SDK import."""

    name: str  # the spec's `provider:` value, e.g. "local"
    scheme: str  # the URI scheme of its object store: "file", "s3", "gs" or "az"
    adapter: str  # "module:Class" of its Provider
    # the schemes of other providers' stores its runs may keep their bucket at (a cluster that
    # reaches an object store): its `store(uri)` opens them, its nodes by the URI as any node
    # does, with the credentials they find where they run
    other_schemes: tuple[str, ...] = ()
    extra: str | None = None  # the pip extra that installs its SDK (`cloudtrain[<extra>]`)
    sdk_module: str | None = None  # a module whose absence means the extra is missing
    # the spec/ledger field naming the account the run lives in, if the cloud has one
    account_field: Literal["project", "subscription"] | None = None
    options: str | None = None  # "module:Model", the pydantic model of `providers.<name>`
    storage_usd_per_gb_month: float = 0.0  # list price of its standard object storage
    preemption: str | None = None  # "module:function", the node-side probe (stdlib only)
    pricing: str | None = None  # "module:function", its live price-list client
    # "module:function" (NodeRequest) -> ImageInfo: the image a node boots (its OS and python3)
    node_image: str | None = None
    # where `gc` looks for leftovers: one region at a time, or the whole account (project)
    inventory_scope: Literal["region", "account"] = "region"
    searched_by_cheapest: bool = False  # does `plan --provider cheapest` consider it
    catalog_zones: bool = True  # False: its catalog rows have no zones (a spec's zone is ignored)
    # "module:function" of its catalog rules (stdlib only): see cloudtrain/catalog/offers.py
    catalog_rules: str | None = None
    display: str = ""  # how help text and reports name it ("AWS"); the name if empty
    # where its SDK's credential chain looks before any network (providers/credential_hints.py):
    # variables, and files under the home folder; none found -> `plan` does not ask the account
    credential_env: tuple[str, ...] = ()
    credential_files: tuple[str, ...] = ()
    # True: its nodes are processes on this machine. One offer (its catalog's first row, sized
    # as this machine, priced by $CLOUDTRAIN_LOCAL_PRICE_USD when set) prices every node, spot
    # and accelerators ignored; the controller node is a process here too ($0/h); `gc` looks
    # once, naming no region or account
    on_this_machine: bool = False
    # the spec fields it ignores, each (field path, why): `plan` notes them when a spec sets them
    ignored_fields: tuple[tuple[tuple[str, ...], str], ...] = ()
    # the run knobs (`RunOptions` fields) it watches by, other than the clouds' defaults
    run_defaults: tuple[tuple[str, float], ...] = ()
    may_fail_over: bool = True  # False: failover never moves a run elsewhere from it
    # "module" of the Cloud TPU types it sells (stdlib only; providers/gcp/tpu_types.py): the
    # spec's strategy tpu runs only on a provider that names one (`tpu_type(name)`,
    # `single_host_types()`, `multi_host_problem(t)`, `runtime_problem(t, runtime)`,
    # `resolved_runtime(t, given)`, `runtime_tensorflow(runtime)`, RUNTIME_OPTION); None: no TPUs
    tpu_types: str | None = None
    # "module:function" of offers read live from the provider (a cluster's partitions), added to
    # the catalog when a plan is made for it (cloudtrain/plan/live_offers.py):
    # fn(config, accelerator, nodes, gpus_per_node, hours) -> (rows as dicts of Offer's fields,
    # the plan's notes); None: the bundled catalog only
    live_offers: str | None = None

    @property
    def label(self) -> str:
        """The provider's display name."""
        return self.display or self.name
