"""The GCP box with every VM its own host: test_gcp_in_a_box's box in namespace mode
(tests/fakes/netns.py), behind the firewall rules the adapter made.

- The box's GCS emulator is its own, on the network's host address, not the session's on
  loopback: the controller presigns the nodes' bundle and log URLs on its emulator endpoint
  (providers/gcp/storage.py), and every namespace must reach them, as every VM reaches GCS.
- The node identities (the metadata server with the service-account routes, the GCS front that
  decides each node request by the bucket policy) listen there too; the GCE fake stays on
  loopback, as only the laptop side calls it.
- Before each VM's first boot, the project's firewall rules are read back from the fake and
  compiled (tests/fakes/firewall_gcp.py) into every booted VM's namespace, so a rule's members
  (its source service accounts and tags) follow the instances as they come, as on GCE. Inbound
  is GCE's implied deny; outbound stays its implied allow (the VMs reach the emulators).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.conftest import Env
from tests.e2e.test_gcp_in_a_box import GcpBox, gcp_box
from tests.fakes import netns
from tests.fakes.boot_harness import BootHarness, Vm
from tests.fakes.firewall_gcp import gcp_rulesets
from tests.fakes.gcp_cloud import GcpCloud, gcp_cloud_on
from tests.fakes.gcs_emulator import start_gcs_emulator, use_gcs_emulator
from tests.fakes.netns import Host, Network


class GcpFirewall:
    """Compiles the rules the GCE fake holds into every booted VM's namespace (before_boot)."""

    def __init__(self, cloud: GcpCloud, harness: BootHarness) -> None:
        self.cloud, self.harness = cloud, harness
        self.applied: dict[str, str] = {}  # instance id -> its ruleset now
        self._lock = threading.Lock()

    def __call__(self, _vm: Vm, _host: Host) -> None:
        with self._lock:
            hosts = dict(self.harness.hosts)
            rulesets = gcp_rulesets(
                self.cloud.gce.url, self.cloud.project, {i: h.ip for i, h in hosts.items()}
            )
            for vm_id, host in hosts.items():
                if vm_id in rulesets:  # not an instance deleted meanwhile
                    host.apply_nft(rulesets[vm_id])
                    self.applied[vm_id] = rulesets[vm_id]


@dataclass
class GcpNetBox:
    box: GcpBox
    network: Network
    firewall: GcpFirewall


@pytest.fixture
def gcp_net(ct: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[GcpNetBox]:
    """The GCP box of the module docstring, for one test; everything of it stopped after."""
    netns.require()  # fails, never skips: tests/run.sh installs what it needs
    with contextlib.ExitStack() as stack:
        network = stack.enter_context(Network())
        emulator = start_gcs_emulator(host=network.host_ip)
        stack.callback(emulator.stop)
        use_gcs_emulator(monkeypatch, emulator)
        cloud = stack.enter_context(gcp_cloud_on(emulator, monkeypatch))
        box = stack.enter_context(gcp_box(ct, cloud, tmp_path / "box", network))
        firewall = GcpFirewall(cloud, box.harness)
        box.harness.before_boot = firewall  # no VM exists before the test's run creates one
        yield GcpNetBox(box, network, firewall)
