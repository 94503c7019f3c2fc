"""The TPU API fake's stored state, one `TpuState` that `TpuFake.reset()` replaces.

It holds the nodes and queued resources (by project, zone and id), the operations (by their
full name, in creation order), the VPC networks each project has besides `default`, and the
TPU rules of the account (`TpuRules`: quota limits and extra usage per region, TPU generation
and spot-ness; sold-out zones). The caller's denied permissions and disabled APIs are not here:
they are the GCE fake's `AccountRules` (one caller, one project policy for both fakes, so the
Resource Manager and Service Usage probes the GCE fake serves agree with the TPU refusals).
Every access goes through the GCE fake's lock.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# ("response", body) or ("error", google.rpc.Status) when the operation is done
Outcome = tuple[str, dict[str, Any]]


@dataclass
class TpuOperation:
    """A long-running operation and what happens when it is done."""

    body: dict[str, Any]
    polls_needed: int
    on_done: Callable[[], Outcome]
    polls: int = 0


@dataclass
class TpuRules:
    """The account's TPU quotas and capacity (tests/fakes/tpu_account.py scripts them): limits
    by (region or "*", generation, preemptible), extra usage by the same key, and sold-out
    zones ("*": every zone) -> whether only spot/preemptible TPUs are sold out there."""

    limits: dict[tuple[str, str, bool], float] = field(default_factory=dict)
    extra_usage: dict[tuple[str, str, bool], float] = field(default_factory=dict)
    sold_out: dict[str, bool] = field(default_factory=dict)


@dataclass
class TpuState:
    """Everything the TPU fake stores; a fresh one is an empty fake."""

    nodes: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    queued: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    operations: dict[str, TpuOperation] = field(default_factory=dict)
    queued_deadlines: dict[str, float] = field(default_factory=dict)  # name -> time.time()
    networks: set[tuple[str, str]] = field(default_factory=set)  # (project, name) besides default
    rules: TpuRules = field(default_factory=TpuRules)
    requests: list[str] = field(default_factory=list)
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(7_000_000_000_000_000_000))
    hosts: Iterator[int] = field(default_factory=lambda: itertools.count(2))
