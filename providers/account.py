"""What a cloud account allows before anything exists: the `AccountProbe` a provider offers.

`cloudtrain check`, `plan` (when credentials are present) and `run` (before it creates anything)
ask a provider's probe, read-only, about the caller's account:

- `credentials()`: which source the cloud's own chain found (never the secret) and who it is;
- `apis()`: whether the APIs a run calls answer (GCP's enabled services, for example);
- `missing_rights()`: the rights a run needs that the caller lacks, asked of the cloud itself
  (AWS IAM's policy simulator, GCP's testIamPermissions, Azure's permissions at the scope);
- `quotas(region, needs)`: the quotas a plan's machines count against in one region, with their
  limit and current usage, from the cloud's quota API.

Zone capacity is not part of a probe: no cloud says before a create whether a zone has the
machines (AWS, GCE and Azure answer it only at the create call: `InsufficientInstanceCapacity`,
`ZONE_RESOURCE_POOL_EXHAUSTED`, `AllocationFailed`/`SkuNotAvailable`); the run fails over then.

Standard library only. Every method reads; none creates anything.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CredentialSource:
    """Where the cloud's own credential chain found credentials, and whose they are.

    `source` names the link of the chain in words ("environment variables AWS_ACCESS_KEY_ID",
    "shared credentials file, profile default", "instance metadata", "application default
    credentials file", "Azure CLI"), never a secret. `principal` is the caller (an ARN, a
    service account's email, an object id) and `account` the account, project or subscription;
    "" where the cloud does not say."""

    source: str
    principal: str = ""
    account: str = ""


@dataclass(frozen=True)
class ApiState:
    """One API a run calls: `name` as the cloud spells it (`compute.googleapis.com`), whether it
    answers for this account, and why not when it does not."""

    name: str
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class QuotaNeed:
    """What a plan asks of a region for one kind of machine: `nodes` machines of
    `instance_type` (`vcpus` vCPUs and `accelerator_count` x `accelerator` each), on spot or on
    demand. A probe maps it to the cloud's quotas (AWS's vCPU quota of the instance family,
    GCE's per-GPU-model and CPU quotas, Azure's per-family vCPU usage)."""

    instance_type: str
    accelerator: str | None
    accelerator_count: int
    vcpus: int
    nodes: int
    spot: bool


@dataclass(frozen=True)
class QuotaLine:
    """One quota in one region (or the whole account: `region` "global"): its cloud name or code
    (`quota`, e.g. "L-DB2E81BA Running On-Demand G and VT instances", "NVIDIA_T4_GPUS",
    "standardNCASv3_T4Family"), its `unit` ("vCPU", "GPU", "instance"), the cloud's `limit`
    and current `usage`, and what the plan `need`s of it."""

    region: str
    quota: str
    unit: str
    limit: float
    usage: float
    need: float

    @property
    def free(self) -> float:
        """What is left of the quota."""
        return max(0.0, self.limit - self.usage)

    @property
    def fits(self) -> bool:
        """Whether the plan's need fits what is left."""
        return self.need <= self.free + 1e-9


class AccountProbe(ABC):
    """A cloud account, asked read-only. Each method blocks on the cloud's API and raises
    CredentialsError when no credentials are found, ProviderError (or a subtype) when the cloud
    refuses the question itself (the message names the right the question needs)."""

    @abstractmethod
    def credentials(self) -> CredentialSource:
        """The credential source and the caller. Raises CredentialsError when there is none."""

    @abstractmethod
    def apis(self) -> list[ApiState]:
        """Every API a run calls, with whether it answers."""

    @abstractmethod
    def missing_rights(self) -> list[str]:
        """The rights (the cloud's action or permission names, sorted) a run needs and the
        caller lacks; empty when it has them all."""

    @abstractmethod
    def quotas(self, region: str, needs: Sequence[QuotaNeed]) -> list[QuotaLine]:
        """The quotas `needs` count against in `region`, each with limit, usage and need (the
        needs that share a quota summed). Empty when none applies."""
