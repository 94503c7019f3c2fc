"""The `local` provider's INFO (providers/info.py), in a module of its own: the registry reads it
to list providers, for `cloudtrain --help` and `plan`, and must not pay for the adapter
(providers/local.py: subprocesses, sockets, the pool) to do so. A cloud keeps its INFO in its
package's light `__init__.py`; local is one module, so its light half is this one.
"""

from __future__ import annotations

from cloudtrain.providers.info import ProviderInfo

INFO = ProviderInfo(
    name="local",
    scheme="file",
    adapter="cloudtrain.providers.local:LocalProvider",
    options="cloudtrain.providers.local_options:LocalOptions",
    storage_usd_per_gb_month=0.0,  # a folder on this machine
    preemption=None,  # a local node is never preempted
    pricing=None,  # free
    inventory_scope="account",  # one machine: its inventory has no region
    searched_by_cheapest=False,  # `provider: cheapest` means the clouds
    on_this_machine=True,
    ignored_fields=(
        (("cluster", "ssh"), "local nodes are processes on this machine"),
        (("cluster", "image"), "local nodes run this machine's Python"),
        (("cluster", "disk_gb"), "local nodes use this machine's disk"),
        (("region",), "local nodes run on this machine"),  # job.yaml or --region
        (("zone",), "local nodes run on this machine"),
    ),
    # its nodes boot in seconds, so it is watched more closely
    run_defaults=(
        ("poll_s", 0.2),
        ("list_nodes_s", 2.0),
        ("heartbeat_timeout_s", 60.0),
        ("boot_timeout_s", 120.0),
        ("rendezvous_timeout_s", 120.0),
        ("stop_grace_s", 20.0),
        ("failure_grace_s", 3.0),
        ("settle_s", 3.0),
        ("teardown_margin_s", 10.0),
    ),
    may_fail_over=False,  # one machine: there is no other place to go
)
