"""The GCE fake's stored state, kept in one `State` object that `GceFake.reset()` replaces.

It holds the instances (by project, zone and name), firewall rules (by project and name) and
operations (by project, scope and name, in creation order), the operation each `requestId` of a
project started, the scripted zones of regions, the serial port text per instance name, the
scripted insert faults per zone, the log of served requests, the IAM service accounts (by
project and email) and the scripted IAM propagation lag, and the counters that hand out
resource ids and internal IPs, and the account's rules (`AccountRules`: quotas, sold-out zones,
the caller's denied permissions, disabled services; see gcp_account). `Operation` is one zonal
or global operation with the callback that applies its effect when it is DONE. Every access
goes through the fake's lock.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.gce_faults import Fault


@dataclass
class Operation:
    """A zonal or global operation and what happens when it is DONE."""

    body: dict[str, Any]
    polls_needed: int
    on_done: Callable[[], dict[str, Any] | None] = lambda: None  # returns error fields, if any
    polls: int = 0


@dataclass
class AccountRules:
    """What the box's account allows (tests/fakes/gcp_account.py scripts it): quota limits by
    (region or "global", metric), extra usage by (region or "global", metric) on top of what
    the fake's instances use, sold-out zones (all VMs, or Spot ones only), the permissions the
    caller lacks and the services disabled. Empty: a generous account (every default quota,
    every zone, every right)."""

    limits: dict[tuple[str, str], float] = field(default_factory=dict)
    extra_usage: dict[tuple[str, str], float] = field(default_factory=dict)
    sold_out: dict[str, bool] = field(default_factory=dict)  # zone -> only Spot VMs sold out
    denied: set[str] = field(default_factory=set)
    disabled: set[str] = field(default_factory=set)


def host_numbers() -> Iterator[int]:
    """Host numbers of 10.128.0.0/16 in order (10.128.0.2 first), skipping .0, .1 and .255."""
    return (n for n in itertools.count(2) if n % 256 not in (0, 1, 255))


@dataclass
class State:
    """Everything the fake stores; a fresh one is an empty fake."""

    instances: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    firewalls: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    operations: dict[tuple[str, str, str], Operation] = field(default_factory=dict)
    request_ids: dict[tuple[str, str], tuple[str, str, str]] = field(default_factory=dict)
    region_zones: dict[str, list[str]] = field(default_factory=dict)
    serial: dict[str, str] = field(default_factory=dict)
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    service_accounts: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    account_lag: int = 0  # instance inserts naming a non-default account still to refuse
    # IAM allow policies (gce_policies): ("project", project) or ("account", email) -> policy,
    # and every setIamPolicy body the fake accepted, in order
    policies: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    policy_writes: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    account: AccountRules = field(default_factory=AccountRules)
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(4_611_686_018_427_387_904))
    hosts: Iterator[int] = field(default_factory=lambda: host_numbers())
