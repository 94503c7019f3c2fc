"""Live prices from each cloud's public price API, written as a user catalog that overrides the
bundled one (`cloudtrain catalog refresh --provider NAME`).

Importing this package is cheap: stdlib only. Each provider's price client lives in its own
package (`ProviderInfo.pricing`, e.g. providers/aws/pricing.py), imported only by `refresh`; the
cloud SDKs (boto3, google-auth) are imported inside the functions that call them. See
`cloudtrain.pricing.common` for the contract of `refresh`.
"""

from __future__ import annotations

from cloudtrain.pricing.common import (
    RefreshResult,
    priced_providers,
    refresh,
    refresh_result,
)

__all__ = [
    "RefreshResult",
    "priced_providers",
    "refresh",
    "refresh_result",
]
