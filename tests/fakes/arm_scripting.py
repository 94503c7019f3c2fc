"""Inspection and scripting of the ARM fake: `ScriptingMixin`, the test-facing methods.

Inspection answers copies, taken under the fake's lock: `resources(kind, group)` (stored bodies,
write-only fields such as customData included), `groups()`, `role_assignments()`, `requests`
(`METHOD /path?query` of every request served) and `vm_power_state(name)`. Scripting changes
what the fake will answer: `set_serial`/`append_serial` (a VM's serial console log),
`set_vm_power_state` (e.g. deallocated, as a Spot eviction with policy Deallocate leaves it),
`remove_vm` (the VM vanishes with what it owns), `evict` (Azure takes a Spot VM back, as its
evictionPolicy says), `fail_next_vm_create`, `fail_next_extension`,
`fail_next_role_assignment` (see arm_faults) and `throttle_next` (429 TooManyRequests or 503
ServiceUnavailable with `Retry-After: 0`, before any other check). Methods that name a VM raise
KeyError if there is none.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable

from tests.fakes.arm_faults import ExtensionFault, VmFault
from tests.fakes.arm_resources import ResourcesMixin
from tests.fakes.arm_state import Resource
from tests.fakes.arm_vmbodies import POWER_DISPLAY

THROTTLE = {
    429: ("TooManyRequests", "The request is being throttled. Retry after the time given."),
    503: ("ServiceUnavailable", "The service is temporarily unavailable. Retry later."),
}


class ScriptingMixin(ResourcesMixin):
    """Inspection and scripting (see the module docstring)."""

    _lock: threading.RLock
    _evict: Callable[[Resource], None]  # arm_vm_actions: what an eviction does to a VM

    # -- inspection -----------------------------------------------------------------------

    def resources(self, kind: str | None = None, group: str | None = None) -> list[dict]:
        """Copies of the stored resources (write-only fields such as customData included), in
        creation order; `kind` is a full type (`Microsoft.Compute/virtualMachines`) or its last
        segment (`virtualMachines`), both case-insensitive, like `group`."""
        with self._lock:
            return [copy.deepcopy(r.body) for r in self._matching(kind, group)]

    def _matching(
        self, kind: str | None, group: str | None, name: str | None = None
    ) -> list[Resource]:
        wanted = (kind or "").lower()
        return [
            r
            for r in self._state.resources.values()
            if (not wanted or wanted in (r.kind.lower(), r.kind.lower().rsplit("/", 1)[1]))
            and (group is None or r.group.lower() == group.lower())
            and (name is None or r.name.lower() == name.lower())
        ]

    def groups(self) -> list[dict]:
        """Copies of the resource groups, in creation order."""
        with self._lock:
            return [copy.deepcopy(g) for g in self._state.groups.values()]

    def role_assignments(self) -> list[dict]:
        """Copies of the role assignments, in creation order."""
        with self._lock:
            return [copy.deepcopy(a) for a in self._state.role_assignments.values()]

    @property
    def requests(self) -> list[str]:
        """Every request served so far, as `METHOD /path?query`."""
        with self._lock:
            return list(self._state.requests)

    def vm_power_state(self, name: str, group: str | None = None) -> str:
        """The power state (`running`, `deallocated`...) of VM `name`; KeyError if none."""
        with self._lock:
            return str(self._vm_named(name, group).extra.get("power", ""))

    # -- scripting --------------------------------------------------------------------------

    def _vm_named(self, name: str, group: str | None) -> Resource:
        hits = self._matching("Microsoft.Compute/virtualMachines", group, name)
        if not hits:
            raise KeyError(f"no VM {name!r} in the fake")
        return hits[0]

    def set_serial(self, vm_name: str, text: str) -> None:
        """Set the serial console log of VM `vm_name` (it may not exist yet)."""
        with self._lock:
            self._state.serial[vm_name] = text

    def append_serial(self, vm_name: str, text: str) -> None:
        """Append to the serial console log of VM `vm_name`."""
        with self._lock:
            self._state.serial[vm_name] = self._state.serial.get(vm_name, "") + text

    def set_vm_power_state(self, name: str, state: str, group: str | None = None) -> None:
        """Force VM `name`'s power state, e.g. `deallocated` after a Spot eviction."""
        if state not in POWER_DISPLAY:
            raise ValueError(f"unknown power state {state!r}; one of {sorted(POWER_DISPLAY)}")
        with self._lock:
            self._vm_named(name, group).extra["power"] = state

    def remove_vm(self, name: str, group: str | None = None) -> None:
        """Make VM `name` vanish as a Spot eviction with policy Delete does (its NICs and disk
        with deleteOption Delete go too)."""
        with self._lock:
            self._remove(self._vm_named(name, group))

    def evict(self, name: str, group: str | None = None) -> None:
        """Evict Spot VM `name` as Azure does, not as a user's delete: with evictionPolicy Delete
        the VM is gone, and with it, as on a VM delete, its NICs, OS disk and public IPs whose
        deleteOption is Delete (others stay: for disks stricter than Azure, whose evicted VMs
        "are deleted together with their underlying disks"); with Deallocate it is deallocated.
        Its role assignments stay: Azure never removes them with their principal. ValueError for
        a regular VM (Azure's simulateEviction answers OperationNotAllowed). Sources:
        MicrosoftDocs/azure-compute-docs virtual-machines/spot-vms.md and delete.md;
        MicrosoftDocs/azure-docs role-based-access-control/role-assignments.md ("Role
        assignments with identity not found")."""
        with self._lock:
            vm = self._vm_named(name, group)
            if vm.body["properties"].get("priority") not in ("Spot", "Low"):
                raise ValueError(f"VM {name!r} is not a Spot VM: Azure never evicts it")
            self._evict(vm)

    def fail_next_vm_create(
        self,
        zone_or_location: str,
        code: str = "AllocationFailed",
        message: str | None = None,
        *,
        lro: bool | None = None,
        count: int = 1,
    ) -> None:
        """Make the next `count` VM creates in `zone_or_location` fail with `code`.

        `zone_or_location`: `*`, a location (`eastus`), a zone (`1`) or both (`eastus-1`).
        `lro=False` fails the PUT itself (HTTP 409: SkuNotAvailable, OperationNotAllowed quota),
        `lro=True` its operation (`Failed`: AllocationFailed, ZonalAllocationFailed...); None
        picks the way Azure reports `code`. `message` replaces Azure's text (arm_faults)."""
        with self._lock:
            self._state.vm_faults.extend(
                VmFault(zone_or_location, code, message, lro) for _ in range(count)
            )

    def fail_next_extension(
        self,
        vm_name: str | None = None,
        code: str = "VMExtensionProvisioningError",
        message: str | None = None,
    ) -> None:
        """Make the LRO of the next extension PUT (on `vm_name`, or any VM) fail with `code`;
        `message` is the agent's detail (default `Enable failed with exit code 1`)."""
        with self._lock:
            self._state.extension_faults.append(ExtensionFault(vm_name, code, message))

    def fail_next_role_assignment(
        self, code: str = "PrincipalNotFound", message: str | None = None, count: int = 1
    ) -> None:
        """Refuse the next `count` role assignment PUTs with HTTP 400 `code`."""
        with self._lock:
            self._state.role_faults.extend((code, message) for _ in range(count))

    def throttle_next(self, n: int = 1, status: int = 429) -> None:
        """Answer the next `n` ARM requests 429 TooManyRequests (or 503 ServiceUnavailable)
        with `Retry-After: 0`, before any other check."""
        if status not in THROTTLE:
            raise ValueError(f"status must be one of {sorted(THROTTLE)}")
        with self._lock:
            self._state.throttles.extend([status] * n)
