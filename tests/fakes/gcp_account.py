"""The box's GCP account, as stingy as a new project: the test-side API of the GCE fake's rules.

    account = cloud.gce.account          # or GcpAccount(gce_fake)
    account.new_project()                # GPU quotas 0 everywhere, GPUS_ALL_REGIONS 0
    account.set_quota("us-east1", "NVIDIA_T4_GPUS", 8)
    account.set_quota("global", "GPUS_ALL_REGIONS", 8)
    account.add_usage("us-east1", "NVIDIA_T4_GPUS", 4)  # used by something the fake does not hold
    account.sell_out("us-west1-b")       # every insert there: ZONE_RESOURCE_POOL_EXHAUSTED
    account.sell_out("us-west1-a", spot_only=True)
    account.sell_out_region("us-central1")  # each of its zones
    account.sell_out_everywhere(spot_only=True)  # no Spot capacity in any zone
    account.restore("us-west1-b")
    account.deny("iam.serviceAccounts.create")   # the box's caller lacks it
    account.disable("compute.googleapis.com")    # the API is off for the project

What each does to the fake (gce_quotas, gce_access), in GCP's own shapes:

- quotas: `regions.get` and `projects.get` answer `quotas[]` with the limits set here (else
  generous defaults; PREEMPTIBLE_* are 0, "not granted", until set) and usage counted from the
  instances the fake holds plus `add_usage`; an insert over a quota fails its operation with
  QUOTA_EXCEEDED naming the metric, the limit and the region (or "globally");
- capacity: a sold-out zone fails every insert's operation there (or every Spot insert's) with
  ZONE_RESOURCE_POOL_EXHAUSTED, each time, until `restore`;
- the caller: the box's laptop is anonymous on the fake, so the project's policy for the box's
  caller is "every permission but the denied ones"; each Compute Engine, IAM or Resource
  Manager call needing a denied one is refused (403 forbidden "Required 'P' permission for
  'R'", or 403 PERMISSION_DENIED "Permission 'P' denied on resource ..."), and
  `projects:testIamPermissions` leaves it out of the held subset;
- services: a disabled API refuses every call (403 SERVICE_DISABLED / accessNotConfigured) and
  Service Usage answers its state DISABLED.

The rules apply to every project of the fake and are forgotten by `GceFake.reset()`. Each
method is idempotent and takes effect on the next request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.fakes.gce_access import COMPUTE, CRM, ENFORCED, IAM
from tests.fakes.gce_quotas import EVERY_REGION, GLOBAL, GPU_METRICS, PROJECT_METRICS
from tests.fakes.gce_regions import REGION_RE

if TYPE_CHECKING:
    from tests.fakes.gce_fake import GceFake
    from tests.fakes.gce_state import AccountRules

SERVED_APIS = frozenset({COMPUTE, IAM, CRM})


class GcpAccount:
    """The rules of `fake`'s account (see the module docstring). Thread-safe."""

    def __init__(self, fake: GceFake) -> None:
        self._fake = fake

    @property
    def _rules(self) -> AccountRules:
        return self._fake._state.account

    @staticmethod
    def _scope(region: str, metric: str) -> str:
        if region == GLOBAL or metric in PROJECT_METRICS:
            if region != GLOBAL or metric not in PROJECT_METRICS:
                raise ValueError(f"{metric} is a project quota: set it on region 'global'")
            return GLOBAL
        if region != EVERY_REGION and not REGION_RE.fullmatch(region):
            raise ValueError(f"not a GCE region name: {region!r}")
        return region

    def new_project(self) -> None:
        """A new project's GPU quotas: every GPU metric (and its PREEMPTIBLE_ twin) 0 in every
        region, and GPUS_ALL_REGIONS 0 (GCP grants GPUs only on request)."""
        with self._fake._lock:
            for metric in GPU_METRICS.values():
                self._rules.limits[(EVERY_REGION, metric)] = 0.0
                self._rules.limits[(EVERY_REGION, f"PREEMPTIBLE_{metric}")] = 0.0
            self._rules.limits[(GLOBAL, "GPUS_ALL_REGIONS")] = 0.0

    def set_quota(self, region: str, metric: str, limit: float) -> None:
        """Set `metric`'s limit in `region` ("*": every region not set apart; "global": a
        project quota such as GPUS_ALL_REGIONS). ValueError for a bad region or scope."""
        with self._fake._lock:
            self._rules.limits[(self._scope(region, metric), metric)] = float(limit)

    def add_usage(self, region: str, metric: str, amount: float) -> None:
        """Count `amount` more of `metric` as used in `region` (or "global"), as by VMs the
        fake does not hold."""
        with self._fake._lock:
            key = (self._scope(region, metric), metric)
            self._rules.extra_usage[key] = self._rules.extra_usage.get(key, 0.0) + amount

    def sell_out(self, zone: str, spot_only: bool = False) -> None:
        """Every instance insert in `zone` (only Spot ones with `spot_only`) fails with
        ZONE_RESOURCE_POOL_EXHAUSTED from now until `restore(zone)`."""
        with self._fake._lock:
            self._rules.sold_out[zone] = spot_only

    def sell_out_region(self, region: str, spot_only: bool = False) -> list[str]:
        """`sell_out` every zone of `region` (as `regions.get` lists them); returns them."""
        with self._fake._lock:
            zones = self._fake._zones_of(region)
            for zone in zones:
                self._rules.sold_out[zone] = spot_only
            return zones

    def sell_out_everywhere(self, spot_only: bool = False) -> None:
        """`sell_out` every zone of every region (Spot only: a spot plan finds none anywhere)
        until `restore("*")`; zones sold out by name stay so."""
        self.sell_out(EVERY_REGION, spot_only)

    def restore(self, zone: str) -> None:
        """Give `zone` (or "*": what `sell_out_everywhere` took) its capacity back."""
        with self._fake._lock:
            self._rules.sold_out.pop(zone, None)

    def deny(self, permission: str) -> None:
        """The box's caller lacks `permission` from now on. ValueError for one the fake does
        not enforce (Cloud Storage's, say: the GCS emulator checks none), so what
        testIamPermissions reports is always what the calls do."""
        if permission not in ENFORCED:
            raise ValueError(f"the box does not enforce {permission!r}: {sorted(ENFORCED)}")
        with self._fake._lock:
            self._rules.denied.add(permission)

    def allow(self, permission: str) -> None:
        """Give the box's caller `permission` back."""
        with self._fake._lock:
            self._rules.denied.discard(permission)

    def disable(self, service: str) -> None:
        """Turn off an API the fake serves (compute, iam, cloudresourcemanager)."""
        if service not in SERVED_APIS:
            raise ValueError(f"the box serves {sorted(SERVED_APIS)}, not {service!r}")
        with self._fake._lock:
            self._rules.disabled.add(service)

    def enable(self, service: str) -> None:
        """Turn an API back on."""
        with self._fake._lock:
            self._rules.disabled.discard(service)

    def usage(self, region: str, metric: str, project: str) -> float:
        """What `project` uses of `metric` in `region` (or "global") now."""
        with self._fake._lock:
            return self._fake._usage(project).get((self._scope(region, metric), metric), 0.0)
