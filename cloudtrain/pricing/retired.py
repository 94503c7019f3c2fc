"""Machines their cloud has retired: never in a catalog, bundled or refreshed.

`is_retired(provider, instance_type)` is read by the catalog build (`cloudtrain.catalog_build`)
and by `catalog refresh` (`cloudtrain.pricing.common`), so neither can bring such a machine back.
Each rule names its source. Pure, stdlib only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Retired:
    """Instance types of `provider` matching `pattern` are gone since `date` (see `source`)."""

    provider: str
    pattern: re.Pattern[str]
    date: str
    source: str


RETIRED: tuple[Retired, ...] = (
    Retired(
        "azure",
        re.compile(r"^standard_nc\d+r?s_v3$", re.IGNORECASE),  # NC6s/12s/24s(r)_v3, V100
        "2025-09-30",
        "MicrosoftDocs/azure-docs articles/virtual-machines/ncv3-nc6s-nc12s-nc24s-retirement.md",
    ),
)


def is_retired(provider: str, instance_type: str) -> Retired | None:
    """The rule that retires `instance_type` on `provider`, or None. Pure."""
    return next(
        (r for r in RETIRED if r.provider == provider and r.pattern.match(instance_type)), None
    )
