"""What one node's identity may do to each key of the bucket protocol (issue 29, least
privilege), one table for every cloud's test: key -> (may the node read it, may it write and
delete it). Every key comes from the key builders (`jobs/protocol.py`, `run_key.key_object`
for the run's key, `journal.entry_key`), never spelled here, and never from
`jobs/node_rights.py`, the production rules these tables check.

The run of the tables has nodes chief-0, worker-0, worker-1 and worker-10 (`NODES`): worker-1
(`NODE`) must not reach worker-10's keys, which its own id is a prefix of, nor worker-0's
(`PEER`); the chief (`CHIEF`) alone writes checkpoints, the model, TensorBoard, the orphan
notice and the restore marker.
"""

from __future__ import annotations

from cloudtrain.jobs import protocol as p
from cloudtrain.state import journal, run_key

NODE, PEER, CHIEF = p.node_id("worker", 1), p.node_id("worker", 0), p.node_id("chief", 0)
TENTH = p.node_id("worker", 10)  # NODE's id is a prefix of its id
NODES = (CHIEF, PEER, NODE, TENTH)


def own_keys(run_id: str, node: str) -> tuple[str, ...]:
    """Keys the agent of `node` writes in every role. Pure."""
    return (
        p.status_key(run_id, node),
        p.heartbeat_key(run_id, node),
        p.notice_key(run_id, node),
        p.log_chunk_key(run_id, node, 7),
        p.log_index_key(run_id, node),
        p.log_segment_key(run_id, node, 0, 6),
        p.log_open_segment_key(run_id, node, 7),
        p.metrics_chunk_key(run_id, node, 3),
        p.trace_key(run_id, node),
        p.registration_key(run_id, 2, node),
        p.registration_key(run_id, 11, node),
        p.bootstrap_log_key(run_id, node),
    )


def chief_keys(run_id: str) -> tuple[str, ...]:
    """Keys only the chief's agent writes. Pure."""
    return (
        p.checkpoints_ready_key(run_id, 2),
        p.checkpoints_prefix(run_id) + "ckpt-4.data-00000-of-00001",
        p.checkpoints_prefix(run_id) + "chief/checkpoint",
        p.model_prefix(run_id) + "saved_model.pb",
        p.tensorboard_prefix(run_id) + "train/events.out.tfevents.1",
        p.orphaned_key(run_id),
    )


def controller_keys(run_id: str) -> tuple[str, ...]:
    """Keys only a controller writes (a node reads them). Pure."""
    return (
        p.lease_key(run_id),  # read: the chief's orphan check
        p.stop_key(run_id),  # read: every agent stops on it
        p.cluster_key(run_id),  # read: every agent's configuration
        p.yield_key(run_id),
        p.launch_key(run_id),
        p.journal_prefix(run_id) + journal.entry_key(1, 0, journal.writer_id("laptop")),
        p.bundle_key(run_id, "0" * 64),
        p.archived_bootstrap_log_key(run_id, 2, NODE),
    )


def node_rights(run_id: str, node: str = NODE) -> dict[str, tuple[bool, bool]]:
    """Key -> (read, write) for node `node`'s identity in run `run_id` of `NODES`: the run's
    key sealed, the controller's documents and the other nodes' keys read-only, its own keys
    (and the chief's, for the chief) writable. Pure."""
    table = {run_key.key_object(run_id): (False, False)}
    table.update({key: (True, False) for key in controller_keys(run_id)})
    for other in NODES:
        table.update({key: (True, other == node) for key in own_keys(run_id, other)})
    table.update({key: (True, node == CHIEF) for key in chief_keys(run_id)})
    return table


def other_runs(run_id: str) -> dict[str, tuple[bool, bool]]:
    """Keys of other runs, one whose id `run_id` is a prefix of among them: nothing. Pure."""
    return {
        key: (False, False)
        for key in (
            p.cluster_key("other-run"),
            p.status_key("other-run", NODE),
            p.cluster_key(f"{run_id}-2"),
            p.status_key(f"{run_id}-2", NODE),
        )
    }
