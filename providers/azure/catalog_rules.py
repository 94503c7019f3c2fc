"""Azure's catalog rules (`INFO.catalog_rules`), read by `cloudtrain.pricing.retired`: machines
Azure has retired, never in a catalog, bundled or refreshed. Standard library only, no SDK.

Each rule names its source. Azure prices every row as a whole VM and the reference file lacks
none of its rows, so there is no `attach`, `build` or `SUPPLEMENT_CSV`.
"""

from __future__ import annotations

import re

# (instance types matching this, gone since, source)
RETIRED: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (
        re.compile(r"^standard_nc\d+r?s_v3$", re.IGNORECASE),  # NC6s/12s/24s(r)_v3, V100
        "2025-09-30",
        "MicrosoftDocs/azure-docs articles/virtual-machines/ncv3-nc6s-nc12s-nc24s-retirement.md",
    ),
)
