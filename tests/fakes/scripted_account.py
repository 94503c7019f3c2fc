"""A scripted AccountProbe: a TEST FIXTURE at the provider boundary, not a cloud.

The controller's account logic (cloudtrain/plan/account_check.py, account_plan.py, api_check.py) is
tested against it for its decisions: which regions a plan skips, in which order, with which words.
Each cloud's own probe is tested with its real SDK against that cloud's box
(tests/fakes/*_account*.py). `asked` records every question, so a test can show what was not
asked (no quota question after the credentials failed, say).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cloudtrain.core.errors import CredentialsError, ProviderError
from cloudtrain.providers.account import (
    AccountProbe,
    ApiState,
    CredentialSource,
    QuotaLine,
    QuotaNeed,
)


@dataclass
class ScriptedProbe(AccountProbe):
    """Answers from its fields. `gpu_limits`: region -> the GPU quota (default: `default_limit`);
    `refuse_quotas`: regions whose quota question is refused; `missing`: rights lacked."""

    source: CredentialSource | None = field(
        default_factory=lambda: CredentialSource("scripted", "user/alice", "acct-1")
    )
    apis_down: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    gpu_limits: dict[str, float] = field(default_factory=dict)
    default_limit: float = 64.0
    usage: dict[str, float] = field(default_factory=dict)
    refuse_quotas: tuple[str, ...] = ()
    asked: list[str] = field(default_factory=list)

    def credentials(self) -> CredentialSource:
        self.asked.append("credentials")
        if self.source is None:
            raise CredentialsError("no credentials found (scripted)")
        return self.source

    def apis(self) -> list[ApiState]:
        self.asked.append("apis")
        return [
            ApiState(n, n not in self.apis_down, "off" if n in self.apis_down else "")
            for n in ("a", "b")
        ]

    def missing_rights(self) -> list[str]:
        self.asked.append("rights")
        return list(self.missing)

    def quotas(self, region: str, needs: Sequence[QuotaNeed]) -> list[QuotaLine]:
        self.asked.append(f"quotas {region}")
        if region in self.refuse_quotas:
            raise ProviderError(f"not allowed to read quotas in {region} (scripted)")
        gpus = sum(n.nodes * n.accelerator_count for n in needs)
        if not gpus:
            return []
        limit = self.gpu_limits.get(region, self.default_limit)
        return [QuotaLine(region, "GPUS", "GPU", limit, self.usage.get(region, 0.0), gpus)]
