"""What a node's identity may do to each key of the bucket protocol (issue 29, the first slice
of least privilege), one table for every cloud's test: key -> (may the node read it, may it
write and delete it). Every key comes from the key builders (`jobs/protocol.py`,
`run_key.key_object` for the run's key, `journal.entry_key`), never spelled here.

The rules are per run, not per node: a node may still write another node's documents (one
identity per node is out of this slice), so the table holds a peer's keys as writable too.
"""

from __future__ import annotations

from cloudtrain import journal, run_key
from cloudtrain.jobs import protocol as p

NODE, PEER, CHIEF = p.node_id("worker", 0), p.node_id("worker", 1), p.node_id("chief", 0)


def node_rights(run_id: str) -> dict[str, tuple[bool, bool]]:
    """Key -> (read, write) for run `run_id`'s node identity: the run's key sealed, the
    controller's documents read-only, every key the agent writes writable. Pure."""
    controllers = (
        p.lease_key(run_id),  # read: the chief's orphan check
        p.stop_key(run_id),  # read: every agent stops on it
        p.cluster_key(run_id),  # read: every agent's configuration
        p.yield_key(run_id),
        p.launch_key(run_id),
        p.journal_prefix(run_id) + journal.entry_key(1, 0, journal.writer_id("laptop")),
        p.bundle_key(run_id, "0" * 64),
    )
    agents = (
        p.status_key(run_id, NODE),
        p.status_key(run_id, CHIEF),  # a peer's: per-node rules are out of this slice
        p.heartbeat_key(run_id, NODE),
        p.notice_key(run_id, NODE),
        p.log_chunk_key(run_id, NODE, 7),
        p.log_index_key(run_id, NODE),
        p.log_segment_key(run_id, NODE, 0, 6),
        p.log_open_segment_key(run_id, NODE, 7),
        p.metrics_chunk_key(run_id, NODE, 3),
        p.trace_key(run_id, NODE),
        p.registration_key(run_id, 2, NODE),
        p.registration_key(run_id, 2, PEER),
        p.checkpoints_ready_key(run_id, 2),
        p.checkpoints_prefix(run_id) + "ckpt-4.data-00000-of-00001",
        p.model_prefix(run_id) + "saved_model.pb",
        p.tensorboard_prefix(run_id) + "train/events.out.tfevents.1",
        p.orphaned_key(run_id),
        p.bootstrap_log_key(run_id, NODE),  # written through a presigned URL; allowed too
    )
    table = {run_key.key_object(run_id): (False, False)}
    table.update({key: (True, False) for key in controllers})
    table.update({key: (True, True) for key in agents})
    return table


def other_runs(run_id: str) -> dict[str, tuple[bool, bool]]:
    """Keys of other runs, one whose id `run_id` is a prefix of among them: nothing. Pure."""
    return {
        key: (False, False)
        for key in (
            p.cluster_key("other-run"),
            p.status_key("other-run", NODE),
            p.cluster_key(f"{run_id}-2"),
        )
    }
