"""Provider registry: each provider declares itself in one `INFO` object (`providers/info.py`),
and this module reads those objects and nothing else.

`get_provider("aws", config)` imports `cloudtrain.providers.aws` (its light `__init__`, holding
INFO) and then the adapter INFO names, only then. A missing SDK becomes a UsageError that says
which `pip install` fixes it. `open_store(uri)` picks the store by URI scheme, which is how the
node agent reaches the bucket with nothing but the URI it was given.

Adding a provider: providers/README.md.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from cloudtrain.errors import UsageError
from cloudtrain.providers.info import ProviderInfo

if TYPE_CHECKING:
    from cloudtrain.providers.base import ObjectStore, Provider, ProviderConfig

# The registered providers' modules, in the order help text and error messages list them: each is
# `cloudtrain.providers.<name>` (a package, or local.py) holding `INFO`, a ProviderInfo. Spelled
# out in full so that tests/python_gate.py, which follows dotted names, reaches every provider.
REGISTERED: tuple[str, ...] = (
    "cloudtrain.providers.local",
    "cloudtrain.providers.aws",
    "cloudtrain.providers.gcp",
    "cloudtrain.providers.azure",
)
_BUILT_IN = tuple(module.rpartition(".")[2] for module in REGISTERED)
# Providers registered at run time (`register`): tests, or a provider outside this package.
_EXTRA: dict[str, ProviderInfo] = {}

__all__ = [
    "REGISTERED",
    "ProviderInfo",
    "get_provider",
    "info",
    "info_for_uri",
    "load",
    "names",
    "open_store",
    "provider_for_uri",
    "register",
]


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
    module_name = REGISTERED[_BUILT_IN.index(name)]
    if not _module_exists(module_name):
        raise UsageError(f"provider {name!r} is not available in this version of cloudtrain")
    found = getattr(importlib.import_module(module_name), "INFO", None)
    if not isinstance(found, ProviderInfo) or found.name != name:
        raise UsageError(f"provider {name!r} is not available in this version of cloudtrain")
    return found


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


def _load_class(name: str) -> type:
    provider_info = info(name)
    extra, sdk = provider_info.extra, provider_info.sdk_module
    if sdk is not None and not _module_exists(sdk):
        raise UsageError(
            f"provider {name!r} needs its SDK, which is not installed",
            hint=f"pip install 'cloudtrain[{extra}]'",
        )
    module_name, _, class_name = provider_info.adapter.partition(":")
    cls = None
    if _module_exists(module_name):
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


def _module_exists(module_name: str) -> bool:
    try:
        return importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError:
        return False


def get_provider(name: str, config: ProviderConfig | None = None) -> Provider:
    """Build the named provider. Creates nothing in the cloud. Raises UsageError for an unknown
    name or a missing extra."""
    from cloudtrain.providers.base import ProviderConfig

    cls = _load_class(name)
    return cls(config or ProviderConfig(name=name))  # type: ignore[no-any-return]


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


def open_store(uri: str) -> ObjectStore:
    """The ObjectStore for `uri`, built with the provider's default config and retrying with the
    one policy. Creates nothing."""
    return get_provider(provider_for_uri(uri)).store(uri)
