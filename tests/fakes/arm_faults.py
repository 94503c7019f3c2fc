"""Scripted failures of the ARM fake and how Azure words them.

`ArmFake.fail_next_vm_create()` queues a `VmFault`; the next VM create whose location or zone
matches takes it. A fault fails either synchronously (the PUT answers 409 with `{"error": {code,
message}}`, nothing is created) or through the LRO (the PUT answers 201, the operation ends
`Failed` with the error, the VM stays with provisioningState `Failed` as on Azure). By default
SkuNotAvailable and OperationNotAllowed (quota) fail synchronously and every other code
(AllocationFailed, ZonalAllocationFailed, OverconstrainedAllocationRequest...) through the LRO.
`vm_fault_message()` writes Azure's text for the known codes. `ExtensionFault` fails the LRO of
the next matching VM extension PUT with VMExtensionProvisioningError.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tests.fakes.azure_account import IN_ERRORS

SYNC_CODES = frozenset({"SkuNotAvailable", "OperationNotAllowed"})
ALLOCATION_HELP = "Read more about improving likelihood of allocation success at http://aka.ms/allocation-guidance"
# Quota family names Azure reports for a few GPU sizes (first match of the size's series wins).
QUOTA_FAMILIES = (
    (r"NC\d+as_T4_v3", "standardNCASv3_T4Family"),
    (r"NC\d+s_v3", "standardNCSv3Family"),
    (r"NC\d+ads_A100_v4", "StandardNCADSA100v4Family"),
    (r"ND\d+asr_v4", "standardNDASv4_A100Family"),
    (r"NV\d+ads_A10_v5", "StandardNVADSA10v5Family"),
    (r"NC\d+ads_H100_v5", "standardNCadsH100v5Family"),
    (r"D\d+s_v5", "standardDSv5Family"),
    (r"B\d+m?s", "standardBSFamily"),
)


@dataclass
class VmFault:
    """One scripted failure of a VM create."""

    where: str
    code: str
    message: str | None = None
    lro: bool | None = None

    @property
    def is_lro(self) -> bool:
        return self.lro if self.lro is not None else self.code not in SYNC_CODES

    def matches(self, location: str, zones: list[str]) -> bool:
        """True if this fault applies to a VM in `location` (and `zones`, if any).

        `where` may be `*` or empty (any VM), a location (`eastus`), a zone number (`1`), or a
        location and zone (`eastus-1`, `eastus/1`, `eastus:1`)."""
        where = self.where.replace(" ", "").lower()
        loc = location.replace(" ", "").lower()
        if where in ("", "*", loc):
            return True
        return any(where in (z, f"{loc}-{z}", f"{loc}/{z}", f"{loc}:{z}") for z in zones)


@dataclass
class ExtensionFault:
    """One scripted failure of a VM extension PUT (on VM `vm`, or any VM if None)."""

    vm: str | None
    code: str = "VMExtensionProvisioningError"
    message: str | None = None


def quota_family(vm_size: str) -> str:
    """The quota family Azure names for `vm_size` (e.g. standardNCASv3_T4Family)."""
    series = vm_size.removeprefix("Standard_")
    for pattern, family in QUOTA_FAMILIES:
        if re.fullmatch(pattern, series, re.IGNORECASE):
            return family
    letters = re.sub(r"\d+", "", series.split("_")[0]).upper()
    return f"standard{letters}Family"


def vm_cores(vm_size: str) -> int:
    """The vCPU count in a size name like Standard_NC4as_T4_v3 (4), or 1."""
    found = re.search(r"_[A-Z]+(\d+)", vm_size, re.IGNORECASE)
    return int(found.group(1)) if found else 1


def vm_fault_message(code: str, vm_size: str, location: str, zones: list[str]) -> str:
    """Azure's message for a VM create failing with `code`."""
    if code == "SkuNotAvailable":
        where = f"location '{location}'" + (f" zone '{zones[0]}'" if zones else "")
        return (
            "The requested VM size for resource 'Following SKUs have failed for Capacity "
            f"Restrictions: {vm_size}' is currently not available in {where}. Please try another "
            "size or deploy to a different location or different zone. See "
            "https://aka.ms/azureskunotavailable for details."
        )
    if code == "OperationNotAllowed":
        return quota_message(quota_family(vm_size), location, 0, 0, vm_cores(vm_size))
    if code == "AllocationFailed":
        return (
            "Allocation failed. We do not have sufficient capacity for the requested VM size in "
            f"this region. {ALLOCATION_HELP}"
        )
    if code == "ZonalAllocationFailed":
        return (
            "Allocation failed. We do not have sufficient capacity for the requested VM size in "
            f"this zone. {ALLOCATION_HELP}"
        )
    if code.startswith("Overconstrained"):
        return (
            "Allocation failed. VM(s) with the following constraints cannot be allocated, "
            f"because the condition is too restrictive. Please remove some constraints and try "
            f"again. Constraints applied are: VM Size: {vm_size}. {ALLOCATION_HELP}"
        )
    return f"The VM create failed: {code}."


def quota_message(quota: str, location: str, limit: float, usage: float, need: float) -> str:
    """Azure's 409 OperationNotAllowed text for a create that would take quota `quota` (a family,
    or `cores`/`lowPriorityCores`, named as Azure's errors name them: "Total Regional Cores",
    "LowPriorityCores") past `limit` in `location` (seen in nforgeio/neonKUBE#1671 and
    scylladb/scylla-cluster-tests#4994; Azure docs "Resolve errors for resource quotas")."""
    name = IN_ERRORS.get(quota, f"{quota} Cores")
    required = int(usage + need)
    return (
        "Operation could not be completed as it results in exceeding approved "
        f"{name} quota. Additional details - Deployment Model: Resource Manager, Location: "
        f"{location}, Current Limit: {int(limit)}, Current Usage: {int(usage)}, Additional "
        f"Required: {int(need)}, (Minimum) New Limit Required: {required}. Submit a request for "
        "Quota increase at https://aka.ms/ProdportalCRP/#blade/Microsoft_Azure_Capacity/"
        "UsageAndQuota.ReactView by specifying parameters listed in the 'Details' section for "
        "deployment to succeed."
    )


def extension_fault_message(name: str, publisher: str, ext_type: str, detail: str) -> str:
    """Azure's message for VM extension `name` failing to provision, with the agent's `detail`."""
    return (
        f"VM has reported a failure when processing extension '{name}' (publisher "
        f"'{publisher}' and type '{ext_type}'). Error message: '{detail}'. More information on "
        "troubleshooting is available at https://aka.ms/VMExtensionLinuxTroubleshoot."
    )
