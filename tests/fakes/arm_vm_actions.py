"""VM actions, boot diagnostics and extensions of the ARM fake: `VmActionsMixin`.

Under `.../Microsoft.Compute/virtualMachines/{vm}`:
- POST `deallocate`, `powerOff`, `start`, `restart`: 202 with an LRO; the power state is
  deallocating/stopping/starting/restarting until it succeeds, then deallocated/stopped/running.
  409 Conflict while the VM is being deleted.
- POST `simulateEviction`: 204; a Spot VM is evicted at once (evictionPolicy Delete removes it
  and what it owns with deleteOption Delete, Deallocate deallocates it); 409 OperationNotAllowed
  for a regular VM.
- POST `retrieveBootDiagnosticsData`: `{"consoleScreenshotBlobUri", "serialConsoleLogBlobUri"}`,
  SAS-like URLs under `{fake.url}/bootdiagnostics/...` that the fake serves itself without auth
  (`_serve_blob()`: GET/HEAD, `Range`/`x-ms-range` honoured with 206, Blob-like headers; the log
  is the text of `set_serial(vm_name, ...)`, 404 BlobNotFound once the VM is gone). It needs
  `diagnosticsProfile.bootDiagnostics.enabled` (else 409 OperationNotAllowed; the code is a guess).
- `extensions/{name}` PUT (LRO; needs a running VM, else 409 OperationNotAllowed, and
  publisher/type/typeHandlerVersion, else 400 InvalidParameter), GET (`$expand=instanceView`),
  DELETE (LRO), and `extensions` GET list. An extension PUT fails through its LRO with
  VMExtensionProvisioningError when scripted (`fail_next_extension`), and, like the real
  NvidiaGpuDriverLinux, on a VM with Secure Boot or a size that is not N-series (exit code 13).
"""

from __future__ import annotations

import email.utils
import re
from typing import Any

from tests.fakes.arm_errors import ArmApiError, invalid_parameter
from tests.fakes.arm_faults import extension_fault_message
from tests.fakes.arm_http import Reply
from tests.fakes.arm_routes import Req
from tests.fakes.arm_state import Resource
from tests.fakes.arm_vmbodies import status
from tests.fakes.arm_vms import EXT, VmsMixin

ACTIONS = {
    "deallocate": ("deallocating", "deallocated"),
    "poweroff": ("stopping", "stopped"),
    "start": ("starting", "running"),
    "restart": ("restarting", "running"),
}
NOT_RUNNING = ("deallocated", "deallocating", "stopped", "stopping")
BLOB_RE = re.compile(r"/bootdiagnostics/(?P<sub>[^/]+)/(?P<rg>[^/]+)/(?P<vm>[^/]+)/(?P<file>[^/]+)")
SAS = "sv=2025-01-05&sr=b&sp=r&se=2099-01-01T00%3A00%3A00Z&sig=ZmFrZQ%3D%3D"
SCREENSHOT = b"BM" + bytes(52)  # an empty bitmap header


class VmActionsMixin(VmsMixin):
    """VM actions, boot diagnostics and extensions (see the module docstring)."""

    def _vm_action(self, req: Req) -> Reply:
        vm = self._vm(req)
        self._deleting(vm)
        action = req.params["action"].lower()
        if action == "simulateeviction":
            if vm.body["properties"].get("priority") not in ("Spot", "Low"):
                raise ArmApiError(
                    409,
                    "OperationNotAllowed",
                    "Simulate eviction is only supported for Spot virtual machines.",
                )
            self._evict(vm)
            return Reply(204)
        during, after = ACTIONS[action]
        vm.extra["power"] = during

        def done() -> None:
            vm.extra["power"] = after

        return Reply(
            202, None, self._start_lro(vm.sub, "Microsoft.Compute", vm.body["location"], done)
        )

    def _evict(self, vm: Resource) -> None:
        """Evict Spot VM `vm` as its evictionPolicy says."""
        if vm.body["properties"].get("evictionPolicy") == "Delete":
            self._remove(vm)
        else:
            vm.extra["power"] = "deallocated"

    # -- boot diagnostics -------------------------------------------------------------------

    def _boot_diagnostics(self, req: Req) -> dict[str, Any]:
        vm = self._vm(req)
        diag = (vm.body["properties"].get("diagnosticsProfile") or {}).get("bootDiagnostics") or {}
        if not diag.get("enabled"):
            raise ArmApiError(
                409,
                "OperationNotAllowed",
                f"Boot diagnostics is not enabled for virtual machine '{vm.name}'.",
            )
        base = (
            f"{self.url}/bootdiagnostics/{vm.sub}/{vm.group}/{vm.name}/"
            f"{vm.name}.{vm.body['properties']['vmId']}"
        )
        return {
            "consoleScreenshotBlobUri": f"{base}.screenshot.bmp?{SAS}",
            "serialConsoleLogBlobUri": f"{base}.serialconsole.log?{SAS}",
        }

    def _serve_blob(self, method: str, path: str, headers: dict[str, str]) -> Reply | None:
        """Serve a boot diagnostics blob URL, or None if `path` is not one."""
        match = BLOB_RE.fullmatch(path)
        if match is None:
            return None
        vm = self._find("Microsoft.Compute/virtualMachines", match["sub"], match["rg"], match["vm"])
        if vm is None or method not in ("GET", "HEAD"):
            body = '<?xml version="1.0" encoding="utf-8"?><Error><Code>BlobNotFound</Code>'
            body += "<Message>The specified blob does not exist.</Message></Error>"
            return Reply(
                404, body, {"Content-Type": "application/xml", "x-ms-error-code": "BlobNotFound"}
            )
        if match["file"].endswith(".bmp"):
            data, kind = SCREENSHOT, "image/bmp"
        else:
            data, kind = self._state.serial.get(vm.name, "").encode(), "text/plain"
        head = {
            "Content-Type": kind,
            "Accept-Ranges": "bytes",
            "ETag": f'"0x{len(data):016X}"',
            "Last-Modified": email.utils.formatdate(usegmt=True),
            "x-ms-blob-type": "BlockBlob",
            "x-ms-version": "2025-01-05",
        }
        wanted = re.fullmatch(
            r"bytes=(\d+)-(\d*)", headers.get("x-ms-range") or headers.get("range") or ""
        )
        if wanted is None:
            return Reply(200, data, head)
        start = int(wanted[1])
        if start >= len(data):
            head["Content-Range"] = f"bytes */{len(data)}"
            return Reply(416, None, {**head, "x-ms-error-code": "InvalidRange"})
        end = min(int(wanted[2]) if wanted[2] else len(data) - 1, len(data) - 1)
        head["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        return Reply(206, data[start : end + 1], head)

    # -- extensions -------------------------------------------------------------------------

    def _ext_view(self, res: Resource, expand: str | None) -> dict[str, Any]:
        body = self._public(res)
        if "instanceview" in (expand or "").lower():
            p = body["properties"]
            error = res.extra.get("error")
            state = p.get("provisioningState", "Succeeded").lower()
            entry = (
                status(
                    "ProvisioningState/failed/1", "Provisioning failed", "Error", error["message"]
                )
                if error
                else status(
                    f"ProvisioningState/{state}",
                    f"Provisioning {state}",
                    message="Enable succeeded",
                )
            )
            p["instanceView"] = {
                "name": res.name,
                "type": f"{p.get('publisher')}.{p.get('type')}",
                "typeHandlerVersion": p.get("typeHandlerVersion"),
                "statuses": [entry],
            }
        return body

    def _put_extension(self, req: Req) -> Reply:
        vm, name = self._vm(req), req.params["name"]
        self._deleting(vm)
        if vm.extra.get("power") in NOT_RUNNING:
            raise ArmApiError(
                409,
                "OperationNotAllowed",
                "Cannot modify extensions in the VM when the VM is not running.",
            )
        ctx = self._put_context(req, EXT, [vm.name, name])
        for key in ("publisher", "type", "typeHandlerVersion"):
            if not ctx.props.get(key):
                raise invalid_parameter(f"Required parameter '{key}' is missing (null).", key)
        detail = self._extension_refusal(vm, ctx.props)
        code = "VMExtensionProvisioningError"
        for index, fault in enumerate(self._state.extension_faults):
            if fault.vm is None or fault.vm.lower() == vm.name.lower():
                del self._state.extension_faults[index]
                code, detail = fault.code, fault.message or "Enable failed with exit code 1"
                break
        publisher, ext_type = ctx.props["publisher"], ctx.props["type"]

        def done(res: Resource) -> dict[str, Any] | None:
            res.extra.pop("error", None)
            if not detail:
                return None
            message = extension_fault_message(name, publisher, ext_type, detail)
            res.extra["error"] = {"code": code, "message": message}
            return {"code": code, "message": message}

        return self._commit_put(req, EXT, [vm.name, name], ctx, None, done, creating="Creating")

    def _extension_refusal(self, vm: Resource, props: dict[str, Any]) -> str:
        """Why the real extension would fail on `vm` ('' if it would not)."""
        if str(props.get("type")).lower() != "nvidiagpudriverlinux":
            return ""
        vm_props = vm.body["properties"]
        uefi = ((vm_props.get("securityProfile") or {}).get("uefiSettings")) or {}
        if uefi.get("secureBootEnabled"):
            return (
                "Secure Boot is enabled: the NVIDIA driver cannot be loaded. Enable failed with "
                "exit code 1"
            )
        if not str(vm_props["hardwareProfile"]["vmSize"]).lower().startswith("standard_n"):
            return "Unsupported VM size: no NVIDIA GPU found. Enable failed with exit code 13"
        return ""

    def _get_extension(self, req: Req) -> dict[str, Any]:
        res = self._existing(
            EXT, req.params["sub"], req.params["rg"], req.params["vm"], req.params["name"]
        )
        return self._ext_view(res, req.query.get("$expand"))

    def _delete_extension(self, req: Req) -> Reply:
        vm = self._vm(req)
        self._deleting(vm)
        return self._begin_delete(req, EXT, [vm.name, req.params["name"]])

    def _list_extensions(self, req: Req) -> dict[str, Any]:
        vm = self._vm(req)
        exts = [
            r
            for r in self._state.resources.values()
            if r.kind == EXT and r.id.lower().startswith(vm.id.lower() + "/")
        ]
        return {"value": [self._ext_view(e, req.query.get("$expand")) for e in exts]}
