"""Large-file transfers shared by the stores: part plans, resumable state, parallel parts and the
ranged download into a hidden sidecar. Standard library only (node-side: Python 3.10+).

- A file larger than one part moves in parts of `part_bytes()` (8 MiB, or
  $CLOUDTRAIN_TRANSFER_PART_BYTES, e.g. for tests), `CONCURRENCY` at a time.
- Resume state lives OUTSIDE the folders being mirrored: one small JSON file per transfer under
  $CLOUDTRAIN_TRANSFER_DIR (default: <tempdir>/cloudtrain-transfers, mode 0700), named by a hash
  of (store URI, key, local path). It is deleted when the transfer completes.
- A download writes into `.<name>.cloudtrain-part` next to its destination (`sidecar_path`) and
  renames it into place when every range is there; the ranges done are in the state file, with
  the object's version tag (ETag / generation): a call after a failure fetches only the missing
  ranges of the same version, and starts over when the object changed. Mirrors of a folder must
  skip such sidecars: `is_sidecar(name)` (a name starting with '.' and ending in
  '.cloudtrain-part').
- `progress(n)` is called from any thread with the bytes of each part once it is durably moved
  (uploaded and acknowledged, or written to the sidecar), so over a failed call and the call that
  resumes it the counts add up to the file's size.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Optional, TypeVar

from cloudtrain.core import env
from cloudtrain.core.errors import PreconditionFailed, TransientError

MiB = 1024 * 1024
DEFAULT_PART_BYTES = 8 * MiB
PART_BYTES_ENV = env.TRANSFER_PART_BYTES.name
STATE_DIR_ENV = env.TRANSFER_DIR.name
CONCURRENCY = 8  # parts in flight per transfer
SIDECAR_SUFFIX = ".cloudtrain-part"
COPY_CHUNK = 4 * MiB  # local copies report progress this often

T = TypeVar("T")
R = TypeVar("R")
Progress = Optional[Callable[[int], None]]  # noqa: UP045 (a runtime alias on Python 3.10)
Part = tuple[int, int]  # (offset, length)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def part_bytes(minimum: int = 1, align: int = 1) -> int:
    """The part size: $CLOUDTRAIN_TRANSFER_PART_BYTES or 8 MiB, at least `minimum`, rounded up
    to a multiple of `align`. Read at call time. Pure but for the environment."""
    raw = env.TRANSFER_PART_BYTES.text()
    size = int(raw) if raw.isdigit() and int(raw) > 0 else DEFAULT_PART_BYTES
    size = max(size, minimum)
    return _ceil(size, align) * align


def plan(size: int, part: int, max_parts: int | None = None, align: int = 1) -> list[Part]:
    """(offset, length) of each part of a `size`-byte file, `part` bytes each (the last one
    shorter); when that would be more than `max_parts` parts, the part grows to fit (rounded up
    to `align`). An empty file is one empty part. Pure."""
    if max_parts is not None and _ceil(size, part) > max_parts:
        part = _ceil(_ceil(size, max_parts), align) * align
    if size == 0:
        return [(0, 0)]
    return [(off, min(part, size - off)) for off in range(0, size, part)]


def fingerprint(path: str | os.PathLike[str]) -> dict[str, int]:
    """What identifies a version of a local file for resuming: size and mtime (ns). Blocks."""
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def read_part(path: str | os.PathLike[str], part: Part) -> bytes:
    """The bytes of one part of a file (short only if the file shrank). Blocks."""
    with open(path, "rb") as fh:
        fh.seek(part[0])
        return fh.read(part[1])


def sidecar_path(dest: str | os.PathLike[str]) -> Path:
    """Where a download to `dest` collects its bytes: `.<name>.cloudtrain-part` beside it."""
    d = Path(dest)
    return d.with_name(f".{d.name}{SIDECAR_SUFFIX}")


def is_sidecar(name: str) -> bool:
    """Whether a file name is a download's sidecar (which a folder mirror must skip). Pure."""
    return name.startswith(".") and name.endswith(SIDECAR_SUFFIX)


def state_dir() -> Path:
    """The folder of resume state ($CLOUDTRAIN_TRANSFER_DIR or <tempdir>/cloudtrain-transfers)."""
    raw = env.TRANSFER_DIR.text()
    return Path(raw) if raw else Path(tempfile.gettempdir()) / "cloudtrain-transfers"


class State:
    """The resume record of one transfer (kind, store URI, key, local path), a JSON object in
    `state_dir()`. It may hold an upload session URL: the folder and files are private (0700,
    0600). Thread-safe; every save is atomic (temporary file, rename)."""

    def __init__(self, kind: str, uri: str, key: str, path: str | os.PathLike[str]) -> None:
        ident = "\0".join((kind, uri, key, os.path.abspath(os.fspath(path))))
        digest = hashlib.sha256(ident.encode()).hexdigest()[:32]
        self.path = state_dir() / f"{kind}-{digest}.json"
        self._lock = threading.Lock()

    def load(self) -> dict[str, Any] | None:
        """The saved record, or None (none, or unreadable). Blocks."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def save(self, record: dict[str, Any]) -> None:
        """Replace the record (atomically). Blocks."""
        with self._lock:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".state-")
            try:
                with os.fdopen(fd, "w") as fh:
                    json.dump(record, fh)
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise

    def forget(self) -> None:
        """Delete the record. Idempotent."""
        with self._lock, contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def run_parts(fn: Callable[[T], R], items: Sequence[T], concurrency: int = CONCURRENCY) -> list[R]:
    """`fn(item)` for every item, `concurrency` at a time; the results in item order. On the
    first error, parts not yet started are cancelled, running ones finish, and that error is
    raised. Blocks."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    pool = ThreadPoolExecutor(min(concurrency, len(items)), thread_name_prefix="ct-part")
    try:
        futures = [pool.submit(fn, item) for item in items]
        wait(futures, return_when=FIRST_EXCEPTION)
        pool.shutdown(wait=True, cancel_futures=True)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    for future in futures:
        if not future.cancelled() and future.exception() is not None:
            raise future.exception()  # type: ignore[misc]
    return [f.result() for f in futures]


def report(progress: Progress, n: int) -> None:
    """Call `progress(n)` if there is a callback and `n` > 0."""
    if progress is not None and n > 0:
        progress(n)


def download_ranges(
    *,
    state: State,
    dest: str | os.PathLike[str],
    size: int,
    tag: str,
    part: int,
    fetch: Callable[[Part], bytes],
    progress: Progress = None,
    concurrency: int = CONCURRENCY,
) -> None:
    """Download an object of `size` bytes at version `tag` to `dest` by parallel ranged reads
    (`fetch((offset, length))` returns those bytes of that version, or raises
    PreconditionFailed when the object is no longer at `tag`) into the sidecar, which is renamed
    onto `dest` when complete. Resumes: ranges recorded in `state` for the same tag, size and
    part size with the sidecar still there are not fetched again; anything else starts over. An
    object that changed midway forgets the state and raises TransientError (the next call
    starts over). Blocks."""
    target = Path(dest)
    target.parent.mkdir(parents=True, exist_ok=True)
    side = sidecar_path(target)
    parts = plan(size, part)
    if len(parts) == 1:  # one request: nothing to resume
        data = fetch(parts[0])
        if len(data) != size:
            raise TransientError(f"{tag}: got {len(data)} bytes of {size}")
        with open(side, "wb") as fh:
            fh.write(data)
        os.replace(side, target)
        state.forget()
        report(progress, size)
        return
    record = state.load()
    fresh: dict[str, Any] = {"tag": tag, "size": size, "part": part, "done": []}
    valid = (
        record is not None
        and all(record.get(k) == fresh[k] for k in ("tag", "size", "part"))
        and side.is_file()
        and side.stat().st_size == size
    )
    if not valid:
        record = fresh
        with open(side, "wb") as fh:
            fh.truncate(size)
        state.save(record)
    assert record is not None
    done = set(int(i) for i in record.get("done", []))
    lock = threading.Lock()
    fd = os.open(side, os.O_RDWR)
    try:

        def get(index: int) -> None:
            offset, length = parts[index]
            try:
                data = fetch(parts[index])
            except PreconditionFailed as exc:
                state.forget()
                raise TransientError(f"{tag}: the object changed during the download") from exc
            if len(data) != length:
                raise TransientError(f"range {offset}+{length}: got {len(data)} bytes")
            os.pwrite(fd, data, offset)
            os.fdatasync(fd)  # recorded as done only once it is on disk
            with lock:
                done.add(index)
                state.save({**record, "done": sorted(done)})
            report(progress, length)

        run_parts(get, [i for i in range(len(parts)) if i not in done], concurrency)
    finally:
        os.close(fd)
    os.replace(side, target)
    state.forget()


def copy_file(src: str | os.PathLike[str], dst: str | os.PathLike[str], progress: Progress) -> None:
    """Copy `src` to `dst` (created or truncated) in chunks, calling `progress` per chunk."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while True:
            chunk = fin.read(COPY_CHUNK)
            if not chunk:
                break
            fout.write(chunk)
            report(progress, len(chunk))


def missing(count: int, have: Iterable[int]) -> list[int]:
    """The part indexes 0..count-1 not in `have`, in order. Pure."""
    held = set(have)
    return [i for i in range(count) if i not in held]
