"""Build and validate TensorFlow ``TF_CONFIG`` documents (stdlib only, no TensorFlow import).

A cluster is a mapping of role -> list of ``"host:port"`` addresses, e.g.
``{"chief": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222"], "ps": ["10.0.0.3:2222"]}``.
The rules enforced here are those of TensorFlow 2.21: task types are ``chief``, ``worker``,
``ps`` and ``evaluator`` (``master`` is rejected), at most one chief and one evaluator, and the
evaluator never appears in the ``cluster`` section of the emitted ``TF_CONFIG``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cloudtrain.jobs.strategies import ROLES, StrategyInfo


def _validate_cluster(cluster: Mapping[str, Sequence[str]]) -> None:
    """Raise ``ValueError`` unless ``cluster`` is a well-formed TensorFlow cluster layout."""
    if not cluster or not any(cluster.values()):
        raise ValueError("cluster is empty: at least one chief or worker address is required")
    for role, addresses in cluster.items():
        if role == "master":
            raise ValueError("role 'master' is not accepted by TensorFlow 2.x; use 'chief' instead")
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
        if isinstance(addresses, str):
            raise ValueError(f"addresses of role {role!r} must be a list, not a string")
        if not addresses:
            raise ValueError(f"role {role!r} has no addresses")
        for address in addresses:
            if not isinstance(address, str) or not address.strip():
                raise ValueError(f"role {role!r} has an empty address")
            host, sep, port = address.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(
                    f"address {address!r} of role {role!r} is not of the form 'host:port'"
                )
    if len(cluster.get("chief", ())) > 1:
        raise ValueError("at most one chief is allowed")
    if len(cluster.get("evaluator", ())) > 1:
        raise ValueError("at most one evaluator is allowed")
    if not cluster.get("chief") and not cluster.get("worker"):
        raise ValueError("cluster needs a chief or at least one worker")
    if cluster.get("ps"):
        if not cluster.get("chief"):
            raise ValueError("a cluster with parameter servers ('ps') requires a chief")
        if not cluster.get("worker"):
            raise ValueError("a cluster with parameter servers ('ps') requires at least one worker")


def build_tf_config(cluster: Mapping[str, Sequence[str]], role: str, index: int) -> dict[str, Any]:
    """Return the ``TF_CONFIG`` dict for task ``(role, index)`` of ``cluster``.

    The result is ``{"cluster": {...}, "task": {"type": role, "index": index}}``; the evaluator
    role, if present in ``cluster``, is left out of the ``cluster`` section as TensorFlow
    requires (its own task type is still ``evaluator``). Raises ``ValueError`` for an invalid
    layout, an unknown role, a role absent from the cluster, or an index out of range.
    """
    _validate_cluster(cluster)
    if role == "master":
        raise ValueError("role 'master' is not accepted by TensorFlow 2.x; use 'chief' instead")
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
    if role not in cluster and role != "evaluator":
        raise ValueError(f"role {role!r} is not present in the cluster")
    if isinstance(index, bool) or not isinstance(index, int):
        raise ValueError(f"task index must be an int, got {index!r}")
    size = len(cluster.get(role, ())) or (1 if role == "evaluator" else 0)
    if not 0 <= index < size:
        raise ValueError(f"task index {index} out of range for role {role!r} (size {size})")
    spec = {r: list(addrs) for r, addrs in cluster.items() if r != "evaluator"}
    return {"cluster": spec, "task": {"type": role, "index": index}}


def chief_task(cluster: Mapping[str, Sequence[str]]) -> tuple[str, int]:
    """Return the task that acts as chief: ``("chief", 0)`` if there is a chief, else worker 0."""
    return ("chief", 0) if cluster.get("chief") else ("worker", 0)


def is_chief(cluster: Mapping[str, Sequence[str]], role: str, index: int) -> bool:
    """Return True when ``(role, index)`` is the chief task of ``cluster`` (see ``chief_task``)."""
    return (role, index) == chief_task(cluster)


def needs_tf_config(cluster: Mapping[str, Sequence[str]]) -> bool:
    """Return False when the cluster is a single chief and nothing else, True otherwise.

    Single-node strategies (``StrategyInfo.spans_nodes`` False) run on a lone chief with no
    ``TF_CONFIG``; any other layout (several tasks, or a lone worker) gets one.
    """
    tasks = [(role, addr) for role, addrs in cluster.items() for addr in addrs]
    return not (len(tasks) == 1 and tasks[0][0] == "chief")


def task_tf_config(
    info: StrategyInfo, cluster: Mapping[str, Sequence[str]], role: str, index: int
) -> dict[str, Any] | None:
    """The ``TF_CONFIG`` of task ``(role, index)`` of ``cluster`` (every node's address by role)
    under the strategy ``info`` declares, or None when the task gets none: its cluster section
    lists the roles of ``info.tf_config_roles`` (none: no ``TF_CONFIG`` at all), and a lone chief
    gets none unless the task is the evaluator. Raises ``ValueError`` as ``build_tf_config``."""
    tf_cluster = {r: a for r, a in cluster.items() if r in info.tf_config_roles}
    if tf_cluster and (needs_tf_config(tf_cluster) or role == "evaluator"):
        return build_tf_config(tf_cluster, role, index)
    return None
