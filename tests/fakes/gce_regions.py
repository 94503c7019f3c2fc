"""Region and zone routes of the GCE fake: `RegionsMixin`.

Serves `regions/{region}` (GET, a compute#region with its `quotas[]`: gce_quotas) and `zones`
(GET, ZonesClient.list, with `filter`, `maxResults` and `pageToken` as in gce_listing). Any
region named like GCE's (`REGION_RE`, e.g. `us-central1`) exists and is UP; others are 404
notFound. A region's zones are `{region}-a`, `-b` and `-c` (`us-central1` also has `-f`)
unless `GceFake.set_region_zones()` scripted others; the zone list covers `DEFAULT_REGIONS`
plus every scripted region. Ids are stable numbers derived from the names and creation times
GCE's epoch placeholder. Methods run under the fake's lock.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

from tests.fakes.gce_errors import not_found
from tests.fakes.gce_formats import API_ROOT
from tests.fakes.gce_listing import page
from tests.fakes.gce_quotas import QuotasMixin
from tests.fakes.gce_state import State

REGION_RE = re.compile(r"[a-z]+-[a-z]+[0-9]+")
DEFAULT_REGIONS = (
    "asia-east1",
    "europe-west1",
    "europe-west4",
    "us-central1",
    "us-east1",
    "us-east4",
    "us-west1",
)
EXTRA_ZONES = {"us-central1": ("f",)}
CREATED = "1969-12-31T16:00:00.000-08:00"  # what GCE answers for regions and zones


def _stable_id(name: str, base: int) -> str:
    return str(base + zlib.crc32(name.encode()) % 1_000_000)


class RegionsMixin(QuotasMixin):
    """The `regions/{region}` and `zones` routes (see the module docstring)."""

    _state: State

    def _zones_of(self, region: str) -> list[str]:
        """The zone names of `region`: scripted ones, else GCE-like defaults."""
        scripted = self._state.region_zones.get(region)
        if scripted is not None:
            return list(scripted)
        return [f"{region}-{s}" for s in ("a", "b", "c", *EXTRA_ZONES.get(region, ()))]

    def _get_region(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        project, region = params["project"], params["region"]
        if not REGION_RE.fullmatch(region):
            raise not_found(f"projects/{project}/regions/{region}")
        return {
            "kind": "compute#region",
            "id": _stable_id(region, 1000),
            "creationTimestamp": CREATED,
            "name": region,
            "description": region,
            "status": "UP",
            "zones": [f"{API_ROOT}/projects/{project}/zones/{z}" for z in self._zones_of(region)],
            "selfLink": f"{API_ROOT}/projects/{project}/regions/{region}",
            "supportsPzs": False,
            "quotas": self._quota_lines(project, region),
        }

    def _list_zones(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        project = params["project"]
        regions = sorted({*DEFAULT_REGIONS, *self._state.region_zones})
        items = [
            {
                "kind": "compute#zone",
                "id": _stable_id(zone, 2_000_000),
                "creationTimestamp": CREATED,
                "name": zone,
                "description": zone,
                "status": "UP",
                "region": f"{API_ROOT}/projects/{project}/regions/{region}",
                "selfLink": f"{API_ROOT}/projects/{project}/zones/{zone}",
                "supportsPzs": False,
            }
            for region in regions
            for zone in self._zones_of(region)
        ]
        link = f"{API_ROOT}/projects/{project}/zones"
        return page(items, query, link, "compute#zoneList")
