"""The formats of what the nodes stream, part of the bucket protocol (jobs/protocol.py, which
re-exports every name here): the metrics records a node measures and the heartbeat's figures, and
the body of an open log segment's upload. Standard library only and importing nothing else of
the project: the agent runs it on the node (Python 3.10+), the controller reads with it.
"""

from __future__ import annotations

# --- the metrics a node measures ------------------------------------------------------------------
METRICS = """One JSON object per line, in the training's metrics file ($CLOUDTRAIN_METRICS_FILE,
appended by `runtime.callbacks()`) and in the node's stream metrics/<node>/<seq>.jsonl (the agent
adds its own samples). Every record has `time` (epoch seconds) and `kind`:

  kind "epoch"   an epoch ended: epoch (1-based), steps, examples (this node's share), seconds,
                 examples_per_s, steps_per_s, step_p50_s, step_p95_s, loss, metrics ({name:
                 value}, Keras' logs), source ("runtime", or "keras-log": parsed by the agent
                 from Keras' `N/N - 2s - loss: ... - 52ms/step` lines, for a job without the
                 runtime; then only epoch, seconds, steps_per_s, step_p50_s and loss are known)
  kind "window"  every ~`window_s` during an epoch: the same rates over the last window of steps
                 (examples_per_s, steps_per_s, step_p50_s, step_p95_s, epoch, step)
  kind "first_step"  the fit's first train step ended (`time`; it traced the tf.function)
  kind "train_end"   the fit ended: last_step_time (its last train step's end), steps
  kind "process" the agent's sample of the training's process tree: cpu_percent (100 = one core;
                 null on the first sample), rss_bytes, processes
  kind "gpu"     the agent's `nvidia-smi` sample: gpus, a list of {index, util_percent,
                 mem_used_mib, mem_total_mib}

Unknown kinds and fields are ignored by readers (a newer writer's). The heartbeat's `metrics`
(HEARTBEAT_METRICS) is the node's latest figures from these."""
HEARTBEAT_METRICS = (
    "examples_per_s",  # the latest window's (else the last epoch's) rate of this node
    "steps_per_s",
    "step_p50_s",
    "step_p95_s",
    "epoch_seconds",  # the last whole epoch's duration
    "steps_per_epoch",  # Keras' params["steps"] (null for a dataset of unknown length)
    "global_batch",  # the job's global batch size, as runtime.callbacks(batch_size=) was told
    "workers",  # the data-parallel workers the global batch is split over
    "examples",  # examples this node trained on so far in the attempt
    "loss",  # the last epoch's loss
    "losses",  # the last epochs' losses, oldest first (at most 32): the live view's sparkline
    "cpu_percent",
    "rss_bytes",
    "gpu_util_percent",  # the mean over the node's GPUs
    "gpu_mem_used_mib",  # summed over the node's GPUs
    "source",  # "runtime" or "keras-log"
)


# --- the open log segment's upload (protocol.log_open_segment_key) ----------------------------
OPEN_SEGMENT_MARK = "# cloudtrain open log segment:"
OPEN_SEGMENT_HEADER = OPEN_SEGMENT_MARK + " last_seq={last_seq} lines={lines}\n"


def open_segment_body(last_seq: int, lines: int, data: bytes) -> bytes:
    """The object log_open_segment_key holds: the header naming the last chunk it holds and its
    line count (by `log_lines`), then the chunks' bytes. Pure."""
    return OPEN_SEGMENT_HEADER.format(last_seq=last_seq, lines=lines).encode() + data


def read_open_segment(body: bytes) -> tuple[int, int, str] | None:
    """(last_seq, lines, text) of an open segment's object; None when it is not one. Pure."""
    head, sep, rest = body.partition(b"\n")
    prefix = OPEN_SEGMENT_MARK.encode()
    if not sep or not head.startswith(prefix):
        return None
    words = head[len(prefix) :].decode(errors="replace").split()
    fields = dict(word.split("=", 1) for word in words if "=" in word)
    try:
        return int(fields["last_seq"]), int(fields["lines"]), rest.decode(errors="replace")
    except (KeyError, ValueError):
        return None
