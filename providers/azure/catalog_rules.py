"""Azure's catalog rules (`INFO.catalog_rules`), read by `cloudtrain.catalog.retired`:
machines Azure has retired, never in a catalog, bundled or refreshed. Standard library only, no SDK.

Each rule names its source. Azure prices every row as a whole VM and the source lacks none of its
rows, so there is no `attach` or `SUPPLEMENT_CSV`. `build` (read by `cloudtrain.catalog.build`)
corrects the GPU count of the sizes whose upstream row is wrong (GPU_COUNT_FIXES).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# (instance types matching this, gone since, source)
RETIRED: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (
        re.compile(r"^standard_nc\d+r?s_v3$", re.IGNORECASE),  # NC6s/12s/24s(r)_v3, V100
        "2025-09-30",
        "MicrosoftDocs/azure-docs articles/virtual-machines/ncv3-nc6s-nc12s-nc24s-retirement.md",
    ),
)


# size -> (accelerator, GPUs per VM, source): the upstream catalog's count is wrong for these.
# The source snapshot (coopslarhette/skypilot-catalog catalogs/v8/azure/vms.csv@20291d7e...) writes
# AcceleratorCount 12 for Standard_ND96isr_H100_v5; Azure sells it with 8 H100 GPUs.
GPU_COUNT_FIXES: dict[str, tuple[str, int, str]] = {
    "Standard_ND96isr_H100_v5": (
        "H100",
        8,
        "MicrosoftDocs/azure-docs articles/virtual-machines/sizes/gpu-accelerated/"
        "nd-h100-v5-series.md; microsoft/aspire AksNodeVmSizes.cs (96 vCPUs, 1900 GB, 8 GPUs)",
    ),
}


# size -> why it is held out of the bundled catalog: a GPU size the Azure adapter cannot boot yet
# (no image of providers/azure/images.py gives it a driver); the snapshot keeps its rows. None now:
# ND H100 v5, once held here, boots the Ubuntu-HPC image (images.HPC_FAMILIES).
AWAITING_IMAGE: dict[str, str] = {}


def build(rows: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """Azure's catalog rows from its normalised source rows (in order): the GPU count of each
    GPU_COUNT_FIXES size set to what Azure sells (the `source` cell says so), and the sizes of
    AWAITING_IMAGE left out. Pure."""
    out = []
    for row in rows:
        if row["instance_type"] in AWAITING_IMAGE:
            continue
        fix = GPU_COUNT_FIXES.get(row["instance_type"])
        if (
            fix is not None
            and row["accelerator"] == fix[0]
            and row["accelerator_count"] != str(fix[1])
        ):
            row = {
                **row,
                "accelerator_count": str(fix[1]),
                "source": f"{row['source']} (GPU count {fix[1]}, not {row['accelerator_count']}: "
                f"{fix[2].split(';')[0]})",
            }
        out.append(row)
    return out
