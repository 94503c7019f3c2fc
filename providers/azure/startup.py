"""The Azure pieces of a node's startup script (jobs/startup.sh.j2).

- The node's address comes from the Instance Metadata Service (unless CLOUDTRAIN_NODE_HOST is
  set); $CLOUDTRAIN_AZURE_IMDS overrides its address (the offline tests point it nowhere).
- A SAS PUT must say `x-ms-blob-type: BlockBlob`: `storage_headers` adds it for SAS URLs.
- The dead-man switch deletes the VM through its own managed identity ("Virtual Machine
  Contributor" on itself): powering off would leave an allocated VM that still bills. If that
  fails (no identity yet, no IMDS), the node powers off instead. The same happens when the agent
  exits and nobody tore the node down.
- With the NvidiaGpuDriverLinux extension, the script waits for its driver install rather than
  installing a second driver.
"""

from __future__ import annotations

from cloudtrain.providers.base import StartupBlocks
from cloudtrain.providers.startup_snippets import METADATA_CURL, node_address, wait_for_driver

VENV_PYTHON = "/opt/cloudtrain/venv/bin/python"
DRIVER_WAIT_S = 1200  # the extension may take 10+ minutes (and reboot once)
VM_API = "2024-07-01"

_DELETE_SELF = """\
delete_self() { # delete this VM through its managed identity; non-zero if that is impossible
  local imds="${CLOUDTRAIN_AZURE_IMDS:-http://169.254.169.254}" token vm
  local arm="https%3A%2F%2Fmanagement.azure.com%2F"
  token="$(curl -fsS --connect-timeout 2 --max-time 10 -H Metadata:true \\
    "$imds/metadata/identity/oauth2/token?api-version=2018-02-01&resource=$arm" |
    sed -n 's/.*"access_token" *: *"\\([^"]*\\)".*/\\1/p')" || return 1
  [ -n "$token" ] || return 1
  vm="$(curl -fsS --connect-timeout 2 --max-time 10 -H Metadata:true \\
    "$imds/metadata/instance/compute/resourceId?api-version=2021-02-01&format=text")" || return 1
  curl -fsS --connect-timeout 10 --max-time 60 -X DELETE -H "Authorization: Bearer $token" \\
    "https://management.azure.com${vm}?api-version=VM_API" >/dev/null
}""".replace("VM_API", VM_API)

_SELF_SHUTDOWN = (
    _DELETE_SELF
    + """
ct_wait=$(( DEADLINE_EPOCH - $(date +%s) ))
if [ "$ct_wait" -lt 60 ]; then ct_wait=60; fi
( sleep "$ct_wait"; delete_self || shutdown -h now "cloudtrain: run deadline reached" ) \\
  </dev/null >/dev/null 2>&1 &"""
)

# the node's private IP (Azure IMDS, "Instance metadata": network/interface/0/ipv4/ipAddress/0)
_METADATA = (
    node_address(
        f"{METADATA_CURL} --retry-connrefused -H Metadata:true "
        '"${CLOUDTRAIN_AZURE_IMDS:-http://169.254.169.254}/metadata/instance/network'
        '/interface/0/ipv4/ipAddress/0/privateIpAddress?api-version=2021-02-01&format=text"',
        "private IP",
    )
    + """
storage_headers() { # Put Blob through a SAS URL needs the blob type
  case "$1" in *sig=*) printf 'x-ms-blob-type: BlockBlob\\n' ;; esac
}"""
)

_DRIVER_WAIT = wait_for_driver("the NvidiaGpuDriverLinux extension", DRIVER_WAIT_S)


def startup_blocks(driver_extension: bool) -> StartupBlocks:
    """The Azure blocks; `driver_extension`: the VM gets NvidiaGpuDriverLinux. Pure."""
    return StartupBlocks(
        python=VENV_PYTHON,
        metadata=_METADATA + (_DRIVER_WAIT if driver_extension else ""),
        self_shutdown=_SELF_SHUTDOWN,
        env={},
        install_stack=True,
        power_off='delete_self || shutdown -h now "cloudtrain: job over"',
    )
