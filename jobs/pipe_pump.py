"""The thread that drains a training process's output pipe (stdout and stderr together) into
the agent's sinks (the log stream, the Keras progress parser), one line at a time. The output is
untrusted: a line is read at most MAX_LINE_BYTES at a time (a longer one keeps its head and its
tail, the middle cut and said), bytes are decoded with replacement, and a sink that raises does
not stop the draining: the pump keeps reading to the end of the pipe, so the process never
blocks on a full pipe, and keeps the failure (`failure`) for the agent to end the node with.
Standard library only (node-side: Python 3.10+).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

from cloudtrain.jobs.logpump import MAX_LINE_BYTES

__all__ = ["KEEP_TAIL_BYTES", "PipePump", "bounded_lines"]

KEEP_TAIL_BYTES = 4096  # of a cut line, the end kept (Keras' final `\r` update is there)


def bounded_lines(stream: BinaryIO, max_bytes: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """The lines of `stream` (each with its newline, the last maybe without), none longer than
    about `max_bytes` + KEEP_TAIL_BYTES: a longer line is its first `max_bytes`, a note of the
    bytes cut, and its last KEEP_TAIL_BYTES. Memory stays bounded whatever the stream holds.
    Blocks on the stream until its end."""
    while True:
        head = stream.readline(max_bytes)
        if not head:
            return
        if head.endswith(b"\n") or len(head) < max_bytes:
            yield head
            continue
        tail, cut = b"", 0
        while True:  # the rest of the line: only its end is kept
            piece = stream.readline(max_bytes)
            if not piece:
                break
            kept = tail + piece
            cut += max(0, len(kept) - KEEP_TAIL_BYTES)
            tail = kept[-KEEP_TAIL_BYTES:]
            if piece.endswith(b"\n"):
                break
        note = f" [... {cut} bytes cut ...] ".encode() if cut else b""
        yield head + note + tail


class PipePump(threading.Thread):
    """A daemon thread feeding every line of `stream`, decoded and with `prefix` before it, to
    each of `sinks` in order, until the stream ends. Never raises: the first error of a sink
    (or of the reading) is kept as `failure` ("log pump: ValueError: ..."), after which the
    rest of the stream is read and dropped. `start()` returns at once; join() to wait."""

    def __init__(
        self, stream: BinaryIO, sinks: Sequence[Callable[[str], object]], prefix: str = ""
    ) -> None:
        super().__init__(daemon=True, name="log-pump")
        self.stream, self.sinks, self.prefix = stream, list(sinks), prefix
        self.failure: str | None = None

    def run(self) -> None:
        try:
            for raw in bounded_lines(self.stream):
                if self.failure is not None:
                    continue  # drained and dropped: the process must not block
                line = self.prefix + raw.decode(errors="replace")
                try:
                    for sink in self.sinks:
                        sink(line)
                except Exception as exc:
                    self.failure = _reason(exc)
        except Exception as exc:  # the pipe itself (an OSError, a closed file)
            if self.failure is None:
                self.failure = _reason(exc)


def _reason(exc: BaseException) -> str:
    return f"log pump: {type(exc).__name__}: {str(exc)[:300]}"
