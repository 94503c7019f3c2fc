"""Machines their cloud has retired: never in a catalog, bundled or refreshed.

`is_retired(provider, instance_type)` is read by the catalog build (`cloudtrain.catalog.build`)
and by `catalog refresh` (`cloudtrain.catalog.pricing.common`), so neither can bring such a machine
back.
The rules are each provider's own: `RETIRED` in its catalog rules (`ProviderInfo.catalog_rules`,
e.g. providers/azure/catalog_rules.py), each naming its source. Pure but for importing those
rules (stdlib only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Retired:
    """Instance types of `provider` matching `pattern` are gone since `date` (see `source`)."""

    provider: str
    pattern: re.Pattern[str]
    date: str
    source: str


@lru_cache(maxsize=32)
def retired_rules(provider: str) -> tuple[Retired, ...]:
    """The provider's retirement rules (none for a provider this version does not know)."""
    from cloudtrain.core.errors import CloudtrainError
    from cloudtrain.providers.registry import info, load

    try:
        ref = info(provider).catalog_rules
    except CloudtrainError:
        return ()
    rules = getattr(load(ref), "RETIRED", ()) if ref else ()
    return tuple(Retired(provider, pattern, date, source) for pattern, date, source in rules)


def is_retired(provider: str, instance_type: str) -> Retired | None:
    """The rule that retires `instance_type` on `provider`, or None. Pure."""
    return next((r for r in retired_rules(provider) if r.pattern.match(instance_type)), None)
