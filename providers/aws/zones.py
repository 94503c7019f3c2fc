"""Availability zones: catalogs price by zone ID (`use1-az1`, the same physical zone for every
account), while EC2's Placement takes zone names (`us-east-1b`, mapped per account)."""

from __future__ import annotations

import re
from functools import lru_cache

from cloudtrain.providers.aws.clients import client
from cloudtrain.providers.aws.errors import aws_errors

_ZONE_ID = re.compile(r"^[a-z]{2,5}\d+-az\d+$")


@lru_cache(maxsize=16)
def _zones(region: str) -> tuple[tuple[str, str], ...]:
    """(zone id, zone name) of every available zone of the region, by id."""
    with aws_errors(f"list the availability zones of {region}"):
        answer = client("ec2", region).describe_availability_zones(
            Filters=[{"Name": "state", "Values": ["available"]}]
        )
    pairs = [(z.get("ZoneId", z["ZoneName"]), z["ZoneName"]) for z in answer["AvailabilityZones"]]
    return tuple(sorted(pairs))


def zone_ids(region: str) -> list[str]:
    """The region's zone IDs, sorted (failover candidates)."""
    return [zid for zid, _ in _zones(region)]


def zone_name(region: str, zone: str | None) -> str | None:
    """The account's name for `zone` (an ID or already a name); None stays None."""
    if zone is None or not _ZONE_ID.match(zone):
        return zone
    for zid, name in _zones(region):
        if zid == zone:
            return name
    return zone
