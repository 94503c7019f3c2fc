"""What one node's identity may write in its run's bucket: the key rules every cloud renders.

Each node of a run has its own cloud identity (an IAM role, a service account, a managed
identity), made for its node id and reused by every replacement of that node. That identity
reads every object under the run's prefix except the run's key (`protocol.KEY_NAME`), and writes
and deletes only what its own agent writes:

- every node: its status, heartbeat, notice, trace and bootstrap log documents, its logs/ and
  metrics/ folders, and its rendezvous registration in any attempt;
- the chief (`chief_of`) also: checkpoints/, model/, tensorboard/, control/orphaned and each
  attempt's checkpoints-ready marker.

Never the controller's documents (`controller_rules`: the lease, stop, yield, launch document,
cluster.json, the journal, the bundle, the run's key), and never another node's. A `KeyRule` is
"starts with `prefix` and ends with `suffix`", the one shape that all three clouds can say: an
S3 object ARN or an Azure blob path `StringLike` as `wildcard()` (`*` matches any run of
characters, `/` included), a GCS IAM condition as `resource.name.startsWith(..) &&
resource.name.endsWith(..)`. Keys are relative to the store's root (the store URI's prefix goes
in front). Standard library only: the agent imports the protocol beside it (Python 3.10+).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cloudtrain.jobs import protocol
from cloudtrain.jobs.tf_config import chief_task


@dataclass(frozen=True)
class KeyRule:
    """The keys that start with `prefix` and end with `suffix` (not overlapping)."""

    prefix: str
    suffix: str = ""

    def matches(self, key: str) -> bool:
        """Whether `key` is one of this rule's keys. Pure."""
        return (
            len(key) >= len(self.prefix) + len(self.suffix)
            and key.startswith(self.prefix)
            and key.endswith(self.suffix)
        )

    def wildcard(self) -> str:
        """The rule as one `*` pattern (S3 ARNs, Azure StringLike): prefix*suffix. Pure."""
        return f"{self.prefix}*{self.suffix}"

    def under(self, root: str) -> KeyRule:
        """The same rule below the store's root folder `root` ("" or ending in "/"). Pure."""
        return KeyRule(root + self.prefix, self.suffix)


def chief_of(nodes: Iterable[str]) -> str:
    """The node id that acts as chief among the node ids `nodes` ("chief-0" when the run has a
    chief, else "worker-0"): the one that writes checkpoints, the model and TensorBoard. Pure."""
    roles: dict[str, list[str]] = {}
    for node in nodes:
        role, _, _ = node.rpartition("-")
        roles.setdefault(role, []).append(node)
    return protocol.node_id(*chief_task(roles))


def _attempts(run_id: str, per_attempt: str) -> KeyRule:
    """Every attempt's key whose path inside `attempt-<n>/` is `per_attempt`."""
    return KeyRule(protocol.attempt_prefix(run_id, 0).removesuffix("0/"), "/" + per_attempt)


def _inside_attempt(run_id: str, key: str) -> str:
    """The path of attempt 0's `key` inside its `attempt-0/` folder."""
    return key.removeprefix(protocol.attempt_prefix(run_id, 0))


def node_writes(run_id: str, node: str, *, chief: bool) -> tuple[KeyRule, ...]:
    """The rules of the keys node `node` of run `run_id` writes and deletes (the module
    docstring), with the chief's when `chief`. Built from the protocol's key builders. Pure."""
    own = (
        KeyRule(protocol.status_key(run_id, node)),
        KeyRule(protocol.heartbeat_key(run_id, node)),
        KeyRule(protocol.notice_key(run_id, node)),
        KeyRule(protocol.trace_key(run_id, node)),
        KeyRule(protocol.bootstrap_log_key(run_id, node)),
        KeyRule(protocol.logs_prefix(run_id, node)),
        KeyRule(protocol.metrics_prefix(run_id, node)),
        _attempts(run_id, _inside_attempt(run_id, protocol.registration_key(run_id, 0, node))),
    )
    if not chief:
        return own
    ready = _inside_attempt(run_id, protocol.checkpoints_ready_key(run_id, 0))
    return (
        *own,
        KeyRule(protocol.checkpoints_prefix(run_id)),
        KeyRule(protocol.model_prefix(run_id)),
        KeyRule(protocol.tensorboard_prefix(run_id)),
        KeyRule(protocol.orphaned_key(run_id)),
        _attempts(run_id, ready),
    )


def controller_rules(run_id: str) -> tuple[KeyRule, ...]:
    """The rules of the keys only a controller writes (no node identity may write them, and
    the run's key no node may even read): lease, stop, yield, launch document, cluster.json,
    the run's key, the journal and the bundle. Pure."""
    return (
        KeyRule(protocol.lease_key(run_id)),
        KeyRule(protocol.stop_key(run_id)),
        KeyRule(protocol.yield_key(run_id)),
        KeyRule(protocol.launch_key(run_id)),
        KeyRule(protocol.cluster_key(run_id)),
        KeyRule(protocol.run_prefix(run_id) + protocol.KEY_NAME),
        KeyRule(protocol.journal_prefix(run_id)),
        KeyRule(protocol.bundle_prefix(run_id)),
    )


def may_write(run_id: str, node: str, key: str, *, chief: bool) -> bool:
    """Whether node `node`'s identity may write `key` (relative to the store's root). Pure."""
    if any(rule.matches(key) for rule in controller_rules(run_id)):
        return False
    return any(rule.matches(key) for rule in node_writes(run_id, node, chief=chief))
