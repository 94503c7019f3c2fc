"""The provider registry's reading side: each provider declares itself in one `INFO` object
(`providers/info.py`), and these functions read those objects and nothing else.

`info("aws")` imports `cloudtrain.providers.aws`, its light `__init__` holding INFO (no SDK;
local's is `local_info`);
`load(ref)` imports what an INFO field names. Building a provider (`get_provider`, `open_store`)
is in the package itself, `cloudtrain.providers`, which re-exports all of this; modules that only
need to know about providers (the catalog, the planner, the pricing refresh, a cloud's price
client) import this one, which reaches neither the retry layer nor the fault injector.
Standard library only (the node agent reads it).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from cloudtrain.core.errors import UsageError
from cloudtrain.providers.info import ProviderInfo

if TYPE_CHECKING:
    from cloudtrain.providers.base import ObjectStore

# The registered providers and the light module holding each one's `INFO` (a ProviderInfo), in
# the order help text and error messages list them: a cloud's package `__init__`, or local's
# local_info.py. Spelled out in full so that tests/python_gate.py, which follows dotted names,
# reaches every provider.
REGISTERED: dict[str, str] = {
    "local": "cloudtrain.providers.local_info",
    "aws": "cloudtrain.providers.aws",
    "gcp": "cloudtrain.providers.gcp",
    "azure": "cloudtrain.providers.azure",
    "slurm": "cloudtrain.providers.slurm",
}
_BUILT_IN = tuple(REGISTERED)
# The provider of a spec that names none (`JobSpec.provider`'s default)
DEFAULT_PROVIDER = "local"
# Providers registered at run time (`register`): tests, or a provider outside this package.
_EXTRA: dict[str, ProviderInfo] = {}


def names() -> tuple[str, ...]:
    """Every registered provider's name, built-in first. Pure; imports nothing."""
    return _BUILT_IN + tuple(n for n in _EXTRA if n not in _BUILT_IN)


def register(provider_info: ProviderInfo) -> None:
    """Register a provider that is not built in (replaces one of the same name). Idempotent."""
    _EXTRA[provider_info.name] = provider_info


def info(name: str) -> ProviderInfo:
    """The named provider's INFO. Imports only its light module (no SDK). Raises UsageError for
    an unknown name or a provider whose module is not in this version."""
    if name in _EXTRA:
        return _EXTRA[name]
    if name not in _BUILT_IN:
        raise UsageError(f"unknown provider {name!r}; known providers: {', '.join(names())}")
    module_name = REGISTERED[name]
    if not module_exists(module_name):
        raise UsageError(f"provider {name!r} is not available in this version of cloudtrain")
    found = getattr(importlib.import_module(module_name), "INFO", None)
    if not isinstance(found, ProviderInfo) or found.name != name:
        raise UsageError(f"provider {name!r} is not available in this version of cloudtrain")
    return found


def declared(name: str) -> ProviderInfo:
    """What `name` declares: its INFO; for a name this version does not register (`cheapest`,
    a test's stand-in, a newer version's provider in the ledger) a ProviderInfo of defaults,
    which are what a cloud declares. Never raises; imports as `info` does."""
    try:
        return info(name)
    except UsageError:
        return ProviderInfo(name=name, scheme="", adapter="")


def infos() -> list[ProviderInfo]:
    """Every registered provider's INFO, in `names()` order (imports each light module)."""
    return [info(n) for n in names()]


def load(ref: str) -> Any:
    """The object a "module:attr" reference names (an INFO field), importing its module.
    Raises ImportError/AttributeError as importing does."""
    module_name, _, attr = ref.partition(":")
    value: Any = importlib.import_module(module_name)
    for part in attr.split(".") if attr else ():
        value = getattr(value, part)
    return value


def info_for_uri(uri: str) -> ProviderInfo:
    """The INFO of the provider that serves a storage URI (file://, s3://, gs://, az://).
    Raises UsageError for any other scheme."""
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    known = infos()
    for provider_info in known:
        if provider_info.scheme == scheme:
            return provider_info
    schemes = [f"{i.scheme}://" for i in known]
    listed = ", ".join(schemes[:-1]) + " or " + schemes[-1] if len(schemes) > 1 else schemes[0]
    raise UsageError(f"unsupported storage URI {uri!r}; use {listed}")


def provider_for_uri(uri: str) -> str:
    """The provider name that serves a storage URI (file://, s3://, gs://, az://)."""
    return info_for_uri(uri).name


def module_exists(module_name: str) -> bool:
    """Whether `module_name` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError:
        return False


def adapter_class(name: str) -> type:
    """The named provider's adapter class, its SDK imported. Raises UsageError for an unknown
    name, a missing extra or an SDK that does not import."""
    provider_info = info(name)
    extra, sdk = provider_info.extra, provider_info.sdk_module
    if sdk is not None and not module_exists(sdk):
        raise UsageError(
            f"provider {name!r} needs its SDK, which is not installed",
            hint=f"pip install 'cloudtrain[{extra}]'",
        )
    module_name, _, class_name = provider_info.adapter.partition(":")
    cls = None
    if module_exists(module_name):
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # the SDK is there but does not import (a broken install)
            raise UsageError(
                f"provider {name!r} cannot load its SDK: {' '.join(str(exc).split())}",
                hint=f"pip install --force-reinstall 'cloudtrain[{extra}]'" if extra else None,
            ) from None
        cls = getattr(module, class_name, None)
    if cls is None:  # the adapter is missing, or only partly there (an adapter in progress)
        raise UsageError(f"provider {name!r} is not available in this version of cloudtrain")
    return cls  # type: ignore[no-any-return]


def plain_store(uri: str) -> ObjectStore:
    """The ObjectStore for `uri` as its provider builds it with its default config, NOT
    wrapped: for a provider whose own `store` opens another's (a Slurm run's bucket in S3),
    which `get_provider` wraps once already. Creates nothing; UsageError as `adapter_class`."""
    from cloudtrain.providers.base import ProviderConfig

    name = provider_for_uri(uri)
    store: ObjectStore = adapter_class(name)(ProviderConfig(name=name)).store(uri)
    return store
