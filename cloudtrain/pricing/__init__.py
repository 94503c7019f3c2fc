"""Live prices from each cloud's public price API, written as a user catalog that overrides the
bundled one (`cloudtrain catalog refresh --provider aws|gcp|azure`).

Importing this package is cheap: stdlib only. The cloud SDKs (boto3, google-auth) are imported
inside the functions that call them. See `cloudtrain.pricing.common` for the contract of
`refresh`, and `aws`, `gcp`, `azure` for what each API's parser keeps and skips.
"""

from __future__ import annotations

from cloudtrain.pricing.common import (
    AZURE_URL_ENV,
    GCP_KEY_ENV,
    GCP_URL_ENV,
    PRICED_PROVIDERS,
    RefreshResult,
    refresh,
    refresh_result,
)

__all__ = [
    "AZURE_URL_ENV",
    "GCP_KEY_ENV",
    "GCP_URL_ENV",
    "PRICED_PROVIDERS",
    "RefreshResult",
    "refresh",
    "refresh_result",
]
