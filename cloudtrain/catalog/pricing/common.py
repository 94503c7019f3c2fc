"""Shared parts of the price refresh: HTTP GET of JSON, endpoint overrides, and `refresh`.

`refresh(provider)` blocks while it queries the provider's public price API (seconds to a minute:
the GCP catalog is paged through in full), then writes one file,
`$CLOUDTRAIN_HOME/catalog/<provider>.csv`, atomically (a temp file in the same folder, fsync, then
rename). That file has exactly the bundled CSV's columns, so `Catalog.bundled()` reads it instead of
the bundled `cloudtrain/catalog/<provider>.csv`. Nothing is written when anything fails: a network
error, an HTTP error, malformed JSON, or a response without a single usable GPU price.

What is written: the rows priced by the API, stamped with today's date in `prices_date`, plus the
bundled rows the API did not price (for example a zone or machine type it does not list), which keep
their bundled price and date so they stay visibly older; never a machine its cloud has retired
(`cloudtrain.catalog.retired`), whatever the API or an older bundle says. GPU model names,
vCPUs
and memory come from the bundled catalog where an API does not say them (GCP and Azure never do,
AWS not the GPU model).

Each provider's price client is its own (`ProviderInfo.pricing`, e.g. providers/aws/pricing.py:
`fetch(bundled, regions) -> offers` and the API's name as its module's `API`); its module says
which endpoint override (tests, proxies) and which credentials it reads. Stdlib only at import
time.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import http.client
import importlib
import json
import math
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from cloudtrain import __version__
from cloudtrain.catalog.offers import Offer, read_offers, user_catalog_dir
from cloudtrain.catalog.retired import is_retired
from cloudtrain.core import env as environment
from cloudtrain.core.errors import CloudtrainError, CredentialsError, ProviderError, TransientError

HTTP_TIMEOUT_S = 60.0
HTTP_ATTEMPTS = 4


def base_url(env: str, default: str) -> str:
    """`$env` (a variable of cloudtrain/core/env.py) when set, without a trailing slash, else
    `default`. Reads the environment; KeyError for a variable not declared there."""
    return (environment.by_name(env).text() or default).rstrip("/")


def redact(url: str) -> str:
    """The URL without its query string (which may hold an API key or a long filter). Pure."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def _error_detail(body: bytes) -> str:
    """A one-line reason from an error body (`{"error": {"message"}}` in either case, or plain
    text). Pure."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error") or data.get("Error") or data
        if isinstance(error, dict):
            message = error.get("message") or error.get("Message")
            if message:
                return " ".join(str(message).split())[:300]
    return " ".join(text.split())[:300]


def _get_once(url: str, api: str, headers: dict[str, str], timeout: float, auth_hint: str) -> Any:
    where = redact(url)
    request = urllib.request.Request(
        url,
        headers={
            "Accept": "application/json",
            "User-Agent": f"cloudtrain/{__version__}",
            **headers,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        with contextlib.closing(exc):
            detail = _error_detail(exc.read() or b"")
        text = f"{api}: GET {where} failed with HTTP {exc.code}" + (f": {detail}" if detail else "")
        if exc.code == 429 or exc.code >= 500:
            raise TransientError(
                text, hint="the API is throttling or unavailable; retry later"
            ) from None
        if exc.code in (401, 403):
            raise CredentialsError(text, hint=auth_hint) from None
        raise ProviderError(text, hint="the request was refused; report it") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise TransientError(
            f"{api}: cannot reach {where}: {reason}", hint="check the network or proxy and retry"
        ) from None
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ProviderError(
            f"{api}: GET {where} returned malformed JSON ({len(body)} bytes)",
            hint="retry later; if it persists the API's format changed",
        ) from None


def get_json(
    url: str,
    *,
    api: str,
    headers: dict[str, str] | None = None,
    timeout: float = HTTP_TIMEOUT_S,
    auth_hint: str = "check the credentials for this API",
) -> Any:
    """GET `url` and decode its JSON body. Blocks; retries TransientError with backoff.

    Raises TransientError (HTTP 5xx/429, connection errors, timeouts) after the last attempt,
    CredentialsError for HTTP 401/403 (with `auth_hint`), ProviderError for other HTTP errors and
    for a body that is not JSON. Messages name `api` and the URL without its query string.
    """
    from cloudtrain.core.retry import retrying

    return retrying(
        lambda: _get_once(url, api, dict(headers or {}), timeout, auth_hint),
        what=f"{api} GET {redact(url)}",
        max_attempts=HTTP_ATTEMPTS,
        deadline_s=max(60.0, timeout * HTTP_ATTEMPTS),
    )


def bundled_offers(provider: str) -> list[Offer]:
    """The rows of the package's bundled `<provider>.csv` (never the user override). Reads it."""
    entry = resources.files("cloudtrain") / "catalog" / f"{provider}.csv"
    return read_offers(
        entry.read_text(encoding="utf-8"), f"bundled catalog/{provider}.csv", provider
    )


def offer_key(offer: Offer) -> tuple[str, str, int, str, str]:
    """What identifies a catalog row: type, accelerator, count, region, zone. Pure."""
    return (
        offer.instance_type,
        offer.accelerator or "",
        offer.accelerator_count,
        offer.region,
        offer.zone or "",
    )


def money(value: float) -> str:
    """A price as the catalog writes it: at most 6 decimals, no trailing zeros. Pure."""
    return f"{value:.6f}".rstrip("0").rstrip(".")


def to_row(offer: Offer) -> dict[str, str]:
    """The catalog CSV row (bundled columns, `source` last) for an offer. Pure."""
    return {
        "provider": offer.provider,
        "instance_type": offer.instance_type,
        "accelerator": offer.accelerator or "",
        "accelerator_count": str(offer.accelerator_count if offer.accelerator else 0),
        "vcpus": repr(float(offer.vcpus)) if offer.vcpus is not None else "",
        "memory_gib": repr(float(offer.memory_gib)) if offer.memory_gib is not None else "",
        "region": offer.region,
        "zone": offer.zone or "",
        "price_hourly_usd": money(offer.price_hourly),
        "spot_price_hourly_usd": (
            money(offer.spot_price_hourly) if offer.spot_price_hourly is not None else ""
        ),
        "prices_date": offer.prices_date,
        "source": offer.source,
    }


@dataclass(frozen=True)
class RefreshResult:
    """What `refresh_result` wrote: `rows` in all, `fresh` priced today, `kept` from the bundle."""

    provider: str
    path: Path
    rows: int
    fresh: int
    kept: int
    prices_date: str


def _good_price(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def validate(provider: str, api: str, fresh: list[Offer]) -> None:
    """Raise ProviderError unless `fresh` has a GPU row and only positive, finite prices. Pure."""
    if not any(o.accelerator for o in fresh):
        raise ProviderError(
            f"{api} returned no usable GPU price ({len(fresh)} row(s) parsed); nothing was written",
            hint="retry later; if it persists the API's format changed",
        )
    for o in fresh:
        if o.provider != provider or not o.region or (not o.instance_type and not o.accelerator):
            raise ProviderError(f"{api}: parsed an incomplete row {o}; nothing was written")
        spot_ok = o.spot_price_hourly is None or _good_price(o.spot_price_hourly)
        if not _good_price(o.price_hourly) or not spot_ok:
            raise ProviderError(
                f"{api}: {o.instance_type or o.accelerator} in {o.region} has price "
                f"{o.price_hourly}/{o.spot_price_hourly}; nothing was written"
            )


def merge(fresh: list[Offer], bundled: list[Offer]) -> list[Offer]:
    """Fresh rows (first of each key) plus the bundled rows none replaces, sorted, without
    machines their cloud has retired (`cloudtrain.catalog.retired`). Pure."""
    unique: dict[tuple[str, str, int, str, str], Offer] = {}
    for offer in fresh:
        unique.setdefault(offer_key(offer), offer)
    rows = list(unique.values()) + [o for o in bundled if offer_key(o) not in unique]
    return sorted((o for o in rows if not is_retired(o.provider, o.instance_type)), key=offer_key)


def _write_atomic(path: Path, provider: str, offers: list[Offer]) -> None:
    """Write `offers` as catalog CSV to `path`: temp file, read-back check, fsync, rename."""
    from cloudtrain.catalog.build import write_csv

    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{provider}.", suffix=".csv.tmp")
    os.close(handle)
    temp = Path(name)
    try:
        write_csv(temp, [to_row(o) for o in offers])
        back = read_offers(temp.read_text(encoding="utf-8"), str(path), provider=provider)
        if len(back) != len(offers):
            raise ProviderError(f"{path}: wrote {len(offers)} rows but read back {len(back)}")
        descriptor = os.open(temp, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def refresh_result(
    provider: str,
    home: Path | None = None,
    *,
    regions: list[str] | None = None,
    today: str | None = None,
) -> RefreshResult:
    """Fetch live prices for `provider` and write its user catalog. Blocks (network I/O).

    `home` defaults to $CLOUDTRAIN_HOME (the file goes to `<home>/catalog/<provider>.csv`);
    `regions` defaults to the regions of the bundled catalog; `today` (YYYY-MM-DD) stamps
    `prices_date`. Raises UsageError for an unknown provider, CredentialsError, TransientError or
    ProviderError when the API call or the parse fails, CloudtrainError when the file cannot be
    written; then nothing is written.
    """
    from cloudtrain.catalog.pricing import priced_providers
    from cloudtrain.core.errors import UsageError
    from cloudtrain.providers.registry import info, load

    priced = priced_providers()
    ref = info(provider).pricing if provider in priced else None
    if ref is None:
        raise UsageError(
            f"no price API for provider {provider!r}", hint=f"use one of {', '.join(priced)}"
        )
    module = importlib.import_module(ref.partition(":")[0])
    fetch = load(ref)
    bundled = bundled_offers(provider)
    wanted = list(regions) if regions else sorted({o.region for o in bundled})
    date = today or _dt.date.today().isoformat()
    try:
        fresh = [replace(o, prices_date=date) for o in fetch(bundled, wanted)]
    except CloudtrainError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # an unexpected shape
        raise ProviderError(
            f"{module.API}: unexpected response shape ({type(exc).__name__}: {exc}); "
            "nothing was written",
            hint="the API's format may have changed; report it",
        ) from exc
    validate(provider, module.API, fresh)
    rows = merge(fresh, bundled)
    path = (home / "catalog" if home is not None else user_catalog_dir()) / f"{provider}.csv"
    try:
        _write_atomic(path, provider, rows)
    except OSError as exc:
        raise CloudtrainError(
            f"cannot write the user catalog {path}: {exc}",
            hint="check that $CLOUDTRAIN_HOME is writable",
        ) from None
    fresh_rows = len({offer_key(o) for o in fresh if not is_retired(o.provider, o.instance_type)})
    return RefreshResult(provider, path, len(rows), fresh_rows, len(rows) - fresh_rows, date)


def refresh(provider: str, home: Path | None = None) -> tuple[Path, int]:
    """`refresh_result` for the bundled regions: (the file written, its number of rows)."""
    result = refresh_result(provider, home)
    return result.path, result.rows
