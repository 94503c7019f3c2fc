"""Live prices from each cloud's public price API, written as a user catalog that overrides the
bundled one (`cloudtrain catalog refresh --provider NAME`).

Importing this package is cheap: stdlib only. Each provider's price client lives in its own
package (`ProviderInfo.pricing`, e.g. providers/aws/pricing.py), imported only by `refresh`; the
cloud SDKs (boto3, google-auth) are imported inside the functions that call them. See
`cloudtrain.catalog.pricing.common` for the contract of `refresh`.
"""

from __future__ import annotations

from typing import Any

# Importing the package stays free: `cloudtrain --help` imports it for the refresh command's
# help, and common pulls in http.client and ssl. These names load common on first use (PEP 562).
_FROM_COMMON = ("RefreshResult", "refresh", "refresh_result")


def priced_providers() -> tuple[str, ...]:
    """The providers with a price client (`ProviderInfo.pricing`), in registry order. Imports
    only the providers' light INFO modules."""
    from cloudtrain.providers.registry import info, names

    return tuple(n for n in names() if info(n).pricing is not None)


def __getattr__(name: str) -> Any:
    if name in _FROM_COMMON:
        from cloudtrain.catalog.pricing import common

        return getattr(common, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "RefreshResult",
    "priced_providers",
    "refresh",
    "refresh_result",
]
