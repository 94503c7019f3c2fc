"""The box's GCP account for TPUs, as stingy as a test makes it: the TPU fake's test-side rules.

    account = tpu.account                 # or TpuAccount(tpu_fake)
    account.new_project()                 # every TPU quota 0 (granted on request only)
    account.set_quota("us-west4", "v5litepod", 8)              # on-demand chips/cores
    account.set_quota("us-west4", "v5litepod", 8, spot=True)   # the Preemptible limit
    account.add_usage("us-west4", "v5litepod", 4)              # used by TPUs the fake lacks
    account.sell_out("us-west4-a")        # creates fail (code 8), queued requests wait
    account.sell_out("us-west4-a", spot_only=True)
    account.restore("us-west4-a")         # ("*": what sell_out("*") took)
    account.deny("tpu.nodes.create")      # 403 PERMISSION_DENIED naming it
    account.disable()                     # tpu.googleapis.com off: 403 SERVICE_DISABLED

Quotas and capacity are the TPU fake's (tpu_access); `deny`/`allow` and `disable`/`enable`
write the GCE fake's `AccountRules` (the box has one caller and one project policy), so the
GCE fake's `testIamPermissions` leaves a denied TPU permission out and its Service Usage
`services.get` answers tpu.googleapis.com DISABLED. Each method is idempotent, takes effect on
the next request, and is forgotten by `TpuFake.reset()` (quotas, capacity) or
`GceFake.reset()` (rights, services).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.fakes.gce_regions import REGION_RE
from tests.fakes.tpu_access import EVERY, TPU_ENFORCED
from tests.fakes.tpu_catalog import GENERATIONS
from tests.fakes.tpu_errors import TPU_API

if TYPE_CHECKING:
    from tests.fakes.tpu_fake import TpuFake


class TpuAccount:
    """The TPU rules of `fake`'s account (see the module docstring). Thread-safe."""

    def __init__(self, fake: TpuFake) -> None:
        self._fake = fake

    @staticmethod
    def _key(region: str, generation: str, spot: bool) -> tuple[str, str, bool]:
        if region != EVERY and not REGION_RE.fullmatch(region):
            raise ValueError(f"not a GCP region name: {region!r}")
        if generation not in GENERATIONS:
            raise ValueError(f"not a TPU generation: {generation!r}: {sorted(GENERATIONS)}")
        return region, generation, spot

    def new_project(self) -> None:
        """Every TPU quota (on-demand and Preemptible, every generation) 0 in every region."""
        with self._fake._lock:
            for generation in GENERATIONS:
                for spot in (False, True):
                    self._fake._state.rules.limits[(EVERY, generation, spot)] = 0.0

    def set_quota(self, region: str, generation: str, limit: float, spot: bool = False) -> None:
        """Set the limit (cores or chips, the unit of the type names' numbers) of `generation`
        in `region` ("*": every region not set apart); `spot`: the Preemptible limit."""
        with self._fake._lock:
            self._fake._state.rules.limits[self._key(region, generation, spot)] = float(limit)

    def add_usage(self, region: str, generation: str, amount: float, spot: bool = False) -> None:
        """Count `amount` more of `generation` as used in `region`."""
        with self._fake._lock:
            usage = self._fake._state.rules.extra_usage
            key = self._key(region, generation, spot)
            usage[key] = usage.get(key, 0.0) + amount

    def sell_out(self, zone: str, spot_only: bool = False) -> None:
        """From now until `restore(zone)`, no TPU capacity in `zone` ("*": anywhere): a node
        create's operation fails with code 8, a queued request waits (WAITING_FOR_RESOURCES);
        with `spot_only`, only spot/preemptible TPUs."""
        with self._fake._lock:
            self._fake._state.rules.sold_out[zone] = spot_only

    def restore(self, zone: str) -> None:
        """Give `zone` its TPU capacity back."""
        with self._fake._lock:
            self._fake._state.rules.sold_out.pop(zone, None)

    def deny(self, permission: str) -> None:
        """The box's caller lacks `permission` from now on; ValueError for one the TPU fake
        does not enforce."""
        if permission not in TPU_ENFORCED:
            raise ValueError(
                f"the TPU fake does not enforce {permission!r}: {sorted(TPU_ENFORCED)}"
            )
        with self._fake._lock:
            self._fake._rules_gcp.denied.add(permission)

    def allow(self, permission: str) -> None:
        """Give the caller `permission` back."""
        with self._fake._lock:
            self._fake._rules_gcp.denied.discard(permission)

    def disable(self) -> None:
        """Turn the TPU API (tpu.googleapis.com) off for the project."""
        with self._fake._lock:
            self._fake._rules_gcp.disabled.add(TPU_API)

    def enable(self) -> None:
        """Turn the TPU API back on."""
        with self._fake._lock:
            self._fake._rules_gcp.disabled.discard(TPU_API)

    def usage(self, region: str, generation: str, project: str, spot: bool = False) -> float:
        """What `project` uses of `generation` in `region` now (spot: the Preemptible one)."""
        with self._fake._lock:
            key = self._key(region, generation, spot)
            return self._fake._tpu_usage(project).get(key, 0.0)
