"""Provider registry: each provider declares itself in one `INFO` object (`providers/info.py`),
read by `cloudtrain.providers.registry` (re-exported here: names, info, info_for_uri, load, ...).

`get_provider("aws", config)` imports `cloudtrain.providers.aws` (its light `__init__`, holding
INFO) and then the adapter INFO names, only then, and wraps what it builds once (faults inside,
the one retry policy outside). A missing SDK becomes a UsageError that says which
`pip install` fixes it. `open_store(uri)` picks the store by URI scheme, which is how the node
agent reaches the bucket with nothing but the URI it was given.

Adding a provider: providers/README.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cloudtrain.providers.info import ProviderInfo
from cloudtrain.providers.registry import (
    _EXTRA,  # noqa: F401  (tests register a provider through it)
    REGISTERED,
    adapter_class,
    info,
    info_for_uri,
    infos,
    load,
    names,
    plain_store,
    provider_for_uri,
    register,
)

if TYPE_CHECKING:
    from cloudtrain.providers.base import ObjectStore, Provider, ProviderConfig

__all__ = [
    "REGISTERED",
    "ProviderInfo",
    "get_provider",
    "info",
    "info_for_uri",
    "infos",
    "load",
    "names",
    "open_store",
    "plain_store",
    "provider_for_uri",
    "register",
]


def get_provider(name: str, config: ProviderConfig | None = None) -> Provider:
    """Build the named provider, wrapped once: the test-only faults of $CLOUDTRAIN_FAULTS inside
    (providers/faults.py), the one retry policy outside (`retrying.wrap_provider`), so every
    compute and store call of the result is retried, and nothing above may retry again. Both
    wraps are idempotent. Creates nothing in the cloud. Raises UsageError for an unknown name, a
    missing extra or a bad $CLOUDTRAIN_FAULTS."""
    from cloudtrain.providers import faults, retrying
    from cloudtrain.providers.base import ProviderConfig

    cls = adapter_class(name)
    provider: Provider = cls(config or ProviderConfig(name=name))
    plan = faults.FaultPlan.from_env()
    if plan:
        provider = faults.wrap(provider, plan)
    return retrying.wrap_provider(provider)


def open_store(uri: str) -> ObjectStore:
    """The ObjectStore for `uri`, built with the provider's default config, every call retried
    by the one policy (a RetryingStore: `get_provider` wraps the provider). Creates nothing."""
    return get_provider(provider_for_uri(uri)).store(uri)

