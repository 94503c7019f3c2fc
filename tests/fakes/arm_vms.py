"""Virtual machine and disk routes of the ARM fake: `VmsMixin`.

Served under `resourceGroups/{rg}/providers/Microsoft.Compute`: `virtualMachines/{vm}` PUT
(create-or-update LRO, provisioningState `Creating` then `Succeeded`), GET (`$expand=
instanceView` adds `properties.instanceView`, `$expand=userData` the userData), DELETE (LRO),
`virtualMachines` GET (list in the group, `$expand=instanceView`), `virtualMachines/{vm}/
instanceView` GET, `disks` GET list, `disks/{name}` GET and DELETE (LRO; 409
OperationNotAllowed while attached); and `/subscriptions/{sub}/providers/Microsoft.Compute/
virtualMachines` GET (all VMs; `statusOnly=true` adds instance views).

A PUT is checked by arm_vmbodies (400 InvalidParameter, 409 PropertyChangeNotAllowed), needs its
NICs to exist (400 InvalidResourceReference) and be free (409 NicInUse), answers identity
principalId/tenantId, is held to the account's quotas and capacity (arm_usages: 409
OperationNotAllowed over a quota; a sold-out zone fails the LRO), and consumes a scripted fault
of its location or zone (arm_faults): a
synchronous one answers 409 and stores nothing; an LRO one leaves the VM `Failed` (its instance
view says `ProvisioningState/failed/{code}`) as Azure does. A VM that succeeds is `running` and
gets its OS disk resource (`Microsoft.Compute/disks`, managedBy the VM); deleting the VM deletes
the NICs and the disk whose deleteOption is Delete, and detaches the others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.fakes.arm_errors import ArmApiError, conflict
from tests.fakes.arm_faults import VmFault, vm_fault_message
from tests.fakes.arm_http import Reply
from tests.fakes.arm_ids import now, resource_id
from tests.fakes.arm_resources import ResourcesMixin
from tests.fakes.arm_routes import Req
from tests.fakes.arm_state import Resource
from tests.fakes.arm_vmbodies import check_immutable, check_vm, complete_vm, identity, instance_view

VM = "Microsoft.Compute/virtualMachines"
EXT = "Microsoft.Compute/virtualMachines/extensions"
DISK = "Microsoft.Compute/disks"


class VmsMixin(ResourcesMixin):
    """The virtual machine and disk routes (see the module docstring)."""

    tenant_id: str
    _check_quota: Callable[[str, str, str, str | None], None]  # arm_usages
    _sold_out_fault: Callable[[str, list[str]], VmFault | None]  # arm_usages
    _check_offered: Callable[[str, str, list[str]], None]  # arm_usages

    def _vm(self, req: Req) -> Resource:
        return self._existing(VM, req.params["sub"], req.params["rg"], req.params["vm"])

    def _vm_view(self, res: Resource, expand: str | None) -> dict[str, Any]:
        body = self._public(res)
        wanted = {e.strip().lower() for e in (expand or "").split(",")}
        if "instanceview" in wanted:
            body["properties"]["instanceView"] = self._instance_view(res)
        if "userdata" not in wanted:
            body["properties"].pop("userData", None)
        return body

    def _instance_view(self, res: Resource) -> dict[str, Any]:
        return instance_view(res.body, res.extra.get("power", ""), res.extra.get("error"))

    def _decorate(self, res: Resource, body: dict[str, Any]) -> None:
        if res.kind == VM:
            exts = [
                r
                for r in self._state.resources.values()
                if r.kind == EXT and r.id.lower().startswith(res.id.lower() + "/")
            ]
            if exts:
                body["resources"] = [self._public(e) for e in exts]
        elif res.kind == DISK:
            users = self._disk_users(res.id)
            body["properties"]["diskState"] = "Attached" if users else "Unattached"
            if users:
                body["managedBy"] = users[0]
        super()._decorate(res, body)

    def _disk_users(self, disk_id: str) -> list[str]:
        return [
            r.id
            for r in self._state.resources.values()
            if r.kind == VM
            and str(r.body["properties"]["storageProfile"]["osDisk"]["managedDisk"]["id"]).lower()
            == disk_id.lower()
        ]

    # -- PUT --------------------------------------------------------------------------------

    def _put_vm(self, req: Req) -> Reply:
        sub, rg, name = req.params["sub"], req.params["rg"], req.params["vm"]
        ctx = self._put_context(req, VM, [name])
        check_vm(ctx.body, ctx.props)
        old = ctx.existing.body if ctx.existing else None
        if old is not None:
            check_immutable(old, ctx.body, ctx.props)
        vm_id = resource_id(sub, rg, VM, name)
        for ref in ctx.props["networkProfile"]["networkInterfaces"]:
            self._check_nic_free(str(ref["id"]), vm_id)
        zones = [str(z) for z in ctx.body.get("zones") or (old or {}).get("zones") or []]
        fault = None if old else self._take_vm_fault(ctx.location, zones)
        size = ctx.props["hardwareProfile"]["vmSize"]
        if old is None and (fault is None or fault.is_lro):
            # the account (arm_usages): quota first, synchronously, then capacity via the LRO
            self._check_offered(ctx.location, size, zones)
            self._check_quota(sub, ctx.location, size, ctx.props.get("priority"))
            fault = fault or self._sold_out_fault(ctx.location, zones)
        if fault is not None and not fault.is_lro:
            message = fault.message or vm_fault_message(fault.code, size, ctx.location, zones)
            raise ArmApiError(409, fault.code, message)
        extra: dict[str, Any] = {}
        if zones:
            extra["zones"] = zones
        ident = identity(ctx.body, old, self.tenant_id)
        if ident is not None:
            extra["identity"] = ident
        elif old and old.get("identity"):
            extra["identity"] = old["identity"]
        for key in ("plan", "extendedLocation"):
            if ctx.body.get(key):
                extra[key] = ctx.body[key]
        ctx.props = complete_vm(sub, rg, name, ctx.props, old)
        power = ctx.existing.extra.get("power", "") if ctx.existing else "starting"

        def created(res: Resource) -> dict[str, Any] | None:
            if fault is not None:
                error = {
                    "code": fault.code,
                    "message": fault.message
                    or vm_fault_message(fault.code, size, ctx.location, zones),
                }
                res.extra["error"] = error
                res.extra["power"] = ""
                return error
            res.extra["power"] = power if power not in ("starting", "") else "running"
            self._ensure_disk(res)
            return None

        reply = self._commit_put(req, VM, [name], ctx, extra, created, creating="Creating")
        stored = self._find(VM, sub, rg, name)
        if stored is not None and "power" not in stored.extra:
            stored.extra["power"] = power
        return reply

    def _check_nic_free(self, nic_id: str, vm_id: str) -> None:
        nic = self._by_id(nic_id)
        if nic is None or nic.kind != "Microsoft.Network/networkInterfaces":
            raise ArmApiError(
                400,
                "InvalidResourceReference",
                f"Resource {nic_id} referenced by resource {vm_id} was not found.",
            )
        for other in self._state.resources.values():
            refs = (other.body["properties"].get("networkProfile") or {}).get("networkInterfaces")
            if (
                other.kind == VM
                and other.id.lower() != vm_id.lower()
                and any(str(r.get("id", "")).lower() == nic_id.lower() for r in refs or [])
            ):
                raise ArmApiError(
                    409, "NicInUse", f"Network interface {nic_id} is already in use by {other.id}."
                )

    def _take_vm_fault(self, location: str, zones: list[str]) -> VmFault | None:
        for index, fault in enumerate(self._state.vm_faults):
            if fault.matches(location, zones):
                return self._state.vm_faults.pop(index)
        return None

    def _ensure_disk(self, vm: Resource) -> None:
        os_disk = vm.body["properties"]["storageProfile"]["osDisk"]
        disk_id = os_disk["managedDisk"]["id"]
        if self._by_id(disk_id) is not None:
            return
        body: dict[str, Any] = {
            "id": disk_id,
            "name": os_disk["name"],
            "type": DISK,
            "location": vm.body["location"],
            "sku": {"name": os_disk["managedDisk"]["storageAccountType"], "tier": "Premium"},
            "properties": {
                "osType": "Linux",
                "hyperVGeneration": "V2",
                "creationData": {"createOption": "FromImage"},
                "diskSizeGB": os_disk["diskSizeGB"],
                "timeCreated": now(),
                "provisioningState": "Succeeded",
            },
        }
        if vm.body.get("zones"):
            body["zones"] = list(vm.body["zones"])
        disk = Resource(body, DISK, vm.sub, vm.group, os_disk["name"])
        self._state.resources[disk_id.lower()] = disk

    # -- GET, DELETE, lists -----------------------------------------------------------------

    def _get_vm(self, req: Req) -> dict[str, Any]:
        return self._vm_view(self._vm(req), req.query.get("$expand"))

    def _vm_instance_view(self, req: Req) -> dict[str, Any]:
        return self._instance_view(self._vm(req))

    def _delete_vm(self, req: Req) -> Reply:
        return self._begin_delete(req, VM, [req.params["vm"]])

    def _list_vms(self, req: Req) -> dict[str, Any]:
        self._group(req.params["sub"], req.params["rg"])
        vms = self._listed(VM, req.params["sub"], req.params["rg"])
        return {"value": [self._vm_view(v, req.query.get("$expand")) for v in vms]}

    def _list_all_vms(self, req: Req) -> dict[str, Any]:
        expand = req.query.get("$expand")
        if str(req.query.get("statusOnly", "")).lower() == "true":
            expand = "instanceView"
        return {"value": [self._vm_view(v, expand) for v in self._listed(VM, req.params["sub"])]}

    def _list_disks(self, req: Req) -> dict[str, Any]:
        self._group(req.params["sub"], req.params["rg"])
        return self._value(self._listed(DISK, req.params["sub"], req.params["rg"]))

    def _get_disk(self, req: Req) -> dict[str, Any]:
        return self._public(
            self._existing(DISK, req.params["sub"], req.params["rg"], req.params["name"])
        )

    def _delete_disk(self, req: Req) -> Reply:
        def attached(disk: Resource) -> None:
            users = self._disk_users(disk.id)
            if users:
                raise ArmApiError(
                    409, "OperationNotAllowed", f"Disk {disk.name} is attached to VM {users[0]}."
                )

        return self._begin_delete(req, DISK, [req.params["name"]], attached)

    def _deleting(self, res: Resource) -> None:
        if res.body["properties"].get("provisioningState") == "Deleting":
            raise conflict(f"The virtual machine '{res.name}' is being deleted.")
