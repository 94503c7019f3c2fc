"""Provider registry: name -> adapter, imported lazily so the CLI pays for no SDK it does not use.

`get_provider("aws", config)` imports `cloudtrain.providers.aws` only then. A missing SDK becomes a
UsageError that says which `pip install` fixes it. `open_store(uri)` picks the store by URI scheme,
which is how the node agent reaches the bucket with nothing but the URI it was given.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

from cloudtrain.errors import UsageError

if TYPE_CHECKING:
    from cloudtrain.providers.base import ObjectStore, Provider, ProviderConfig

# name -> (module, class, pip extra, an SDK module whose absence means the extra is missing)
PROVIDERS: dict[str, tuple[str, str, str | None, str | None]] = {
    "local": ("cloudtrain.providers.local", "LocalProvider", None, None),
    "aws": ("cloudtrain.providers.aws", "AwsProvider", "aws", "boto3"),
    "gcp": ("cloudtrain.providers.gcp", "GcpProvider", "gcp", "google.cloud.compute_v1"),
    "azure": ("cloudtrain.providers.azure", "AzureProvider", "azure", "azure.mgmt.compute"),
}
SCHEMES: dict[str, str] = {"file": "local", "s3": "aws", "gs": "gcp", "az": "azure"}


def _load_class(name: str) -> type:
    if name not in PROVIDERS:
        known = ", ".join(PROVIDERS)
        raise UsageError(f"unknown provider {name!r}; known providers: {known}")
    module_name, class_name, extra, sdk = PROVIDERS[name]
    if sdk is not None and not _module_exists(sdk):
        raise UsageError(
            f"provider {name!r} needs its SDK, which is not installed",
            hint=f"pip install 'cloudtrain[{extra}]'",
        )
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
    if cls is None:  # the package is missing, or only partly there (an adapter in progress)
        raise UsageError(f"provider {name!r} is not available in this version of cloudtrain")
    return cls  # type: ignore[no-any-return]


def _module_exists(module_name: str) -> bool:
    try:
        return importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError:
        return False


def get_provider(name: str, config: ProviderConfig | None = None) -> Provider:
    """Build the named provider. Raises UsageError for an unknown name or a missing extra."""
    from cloudtrain.providers.base import ProviderConfig

    cls = _load_class(name)
    return cls(config or ProviderConfig(name=name))  # type: ignore[no-any-return]


def provider_for_uri(uri: str) -> str:
    """The provider name that serves a storage URI (file://, s3://, gs://, az://)."""
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    if scheme not in SCHEMES:
        raise UsageError(f"unsupported storage URI {uri!r}; use file://, s3://, gs:// or az://")
    return SCHEMES[scheme]


def open_store(uri: str) -> ObjectStore:
    """The ObjectStore for `uri`, built with the provider's default config. Creates nothing."""
    return get_provider(provider_for_uri(uri)).store(uri)
