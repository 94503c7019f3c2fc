"""The ARM fake's stored state, kept in one `State` object that `ArmFake.reset()` replaces.

It holds the resource groups (by subscription and lower-cased name: ARM names are
case-insensitive), the resources (`Resource`, by lower-cased id, in creation order), the
long-running operations (`Operation`, by id), the role assignments (by lower-cased id), the
serial console text per VM name, the scripted faults and throttles, the account's quotas,
sold-out zones and the caller's permissions (azure_account.AccountState), the log of served requests
and the counters that hand out private and public IPs. Every access goes through the fake's lock.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.arm_faults import ExtensionFault, VmFault
from tests.fakes.azure_account import AccountState


@dataclass
class Resource:
    """One tracked resource: its full stored body (what GET answers, plus write-only fields) and
    where it lives. `kind` is the full type, e.g. `Microsoft.Compute/virtualMachines`; `extra`
    holds what the fake keeps beside the body (a VM's power state, its failure)."""

    body: dict[str, Any]
    kind: str
    sub: str
    group: str
    name: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return str(self.body["id"])


@dataclass
class Operation:
    """A long-running operation and what happens when it finishes.

    `on_done` applies the effect and returns an ARM error dict (`{code, message}`) if the
    operation fails instead; `style` is `async` (Azure-AsyncOperation: a status body) or
    `location` (Location: 202 until done, then 200 with `result()` or no body)."""

    id: str
    namespace: str
    location: str
    polls_needed: int
    on_done: Callable[[], dict[str, Any] | None]
    style: str = "async"
    result: Callable[[], Any] = lambda: None
    polls: int = 0
    status: str = "InProgress"
    error: dict[str, Any] | None = None
    start_time: str = ""
    end_time: str = ""


@dataclass
class State:
    """Everything the fake stores; a fresh one is an empty fake."""

    groups: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    resources: dict[str, Resource] = field(default_factory=dict)
    operations: dict[str, Operation] = field(default_factory=dict)
    role_assignments: dict[str, dict[str, Any]] = field(default_factory=dict)
    role_definitions: dict[str, dict[str, Any]] = field(default_factory=dict)  # custom, by GUID
    serial: dict[str, str] = field(default_factory=dict)
    vm_faults: list[VmFault] = field(default_factory=list)
    extension_faults: list[ExtensionFault] = field(default_factory=list)
    role_faults: list[tuple[str, str | None]] = field(default_factory=list)
    throttles: list[int] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    account: AccountState = field(default_factory=AccountState)  # quotas, capacity, rights
    public_ips: Iterator[int] = field(default_factory=lambda: itertools.count(10))
