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
)
