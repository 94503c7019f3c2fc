"""GCP's TPU catalog rows: how the source snapshot's TPU rows become TPU offers (read by the
catalog build through `catalog_rules.build`, and by the planner for a TPU job's request).

The snapshot (`cloudtrain/catalog/source/skypilot_v8.csv`) holds the upstream rows of
skypilot-org/skypilot-catalog `catalogs/v8/gcp/vms.csv` @ 006059e0f18acb1341e22a27751e9f80df6ba92f
for the TPU types of `tpu_types.TPU_TYPES` in the zones Google's "TPU regions and zones" lists
(v4-8 is written twice upstream; once here), prices as written. Upstream writes a TPU as an
accelerator-only row: empty instance type, accelerator `tpu-<type>`, count 1, the whole slice's
$/h. Its prices are a per chip-hour price times the chips (Google prices Cloud TPU per
chip-hour, https://cloud.google.com/tpu/pricing; the upstream catalog reads the figures from
Cloud Billing's TPU SKUs): v5e $1.20/chip-hour in us-central1 (v5litepod-8 $9.60), v6e
(Trillium) $2.70 (v6e-8 $21.60), v5p $4.20 (v5p-8, 4 chips, $16.80), v4 $3.22 (v4-8, 4 chips,
$12.88); spot likewise (v5litepod-8 spot $1.95941 = 8 x $0.24493). The stored copy of Google's
pricing page within reach here is an old revision (v2/v3/v4 Preview) without the v5e, v6e and
v5p figures, so these are upstream's, not checked against the page itself.

The offer made of such a row:
`instance_type` the TPU type (`v5litepod-8`, what the TPU API's acceleratorType takes),
`accelerator` `TPU-<generation>` (`TPU-v5e`), `accelerator_count` its chips, no vCPU or memory
figure (the TPU VM's size is not in the source).

Standard library only (and tpu_types): `cloudtrain plan` and the catalog build read it.
"""

from __future__ import annotations

from collections.abc import Iterable

from cloudtrain.providers.gcp.tpu_types import TPU_TYPES, TpuType

UPSTREAM_PREFIX = "tpu-"  # upstream's accelerator name of a TPU type: tpu-v5litepod-8
# the upstream accelerator names the build keeps (compared upper-case, as the catalog's
# canonical names are): one per TPU type of tpu_types
ACCELERATORS = frozenset(f"{UPSTREAM_PREFIX}{name}".upper() for name in TPU_TYPES)


def accelerator_name(tpu: TpuType) -> str:
    """The catalog's accelerator of a TPU type's offers: `TPU-v5e`. Pure."""
    return f"TPU-{tpu.generation}"


def is_tpu_row(row: dict[str, str]) -> bool:
    """True for an upstream TPU row (empty instance type, accelerator `tpu-...`). Pure."""
    return not row["instance_type"] and row["accelerator"].lower().startswith(UPSTREAM_PREFIX)


def tpu_rows(rows: Iterable[dict[str, str]]) -> list[dict[str, str]]:
    """The TPU offers' catalog rows made of the upstream TPU rows among `rows` (others are
    ignored), in order: each of a type tpu_types knows, in a zone it lists. Pure; ValueError
    for a TPU row whose count is not 1 (upstream prices one whole slice per row)."""
    out = []
    for row in rows:
        if not is_tpu_row(row):
            continue
        tpu = TPU_TYPES.get(row["accelerator"][len(UPSTREAM_PREFIX) :].lower())
        if tpu is None or row["zone"] not in tpu.zones:
            continue
        if row["accelerator_count"] != "1":
            raise ValueError(
                f"gcp {row['accelerator']} in {row['zone']}: a TPU row prices one slice"
                f" (count 1), not {row['accelerator_count']}"
            )
        out.append(
            {
                **row,
                "instance_type": tpu.name,
                "accelerator": accelerator_name(tpu),
                "accelerator_count": str(tpu.chips),
                "source": f"{row['source']} ({row['accelerator']}: {tpu.chips} chips)",
            }
        )
    return out
