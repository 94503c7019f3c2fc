"""The `local` provider's bucket: a folder (LocalStore), re-exported by providers/local.py.

The folder is writable by the run's nodes (their processes run user code on this machine), so a
read treats it as untrusted: only regular files are objects, a read never follows a symlink at
the key or blocks on a FIFO, no key leads out of the folder, and a listing skips the rest.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from cloudtrain.core.crashpoints import crash_point
from cloudtrain.core.errors import NotFound, PreconditionFailed, ProviderError, TooLarge
from cloudtrain.providers.base import ObjectInfo, Resource
from cloudtrain.providers.transfer import COPY_CHUNK, Progress, copy_file, report, sidecar_path
from cloudtrain.providers.uri_rules import split_uri, uri_problem


def _uri_to_path(uri: str) -> Path:
    """The folder of a file:// URI, by the rule the spec applies too (providers/uri_rules.py).
    Raises ProviderError."""
    problem = uri_problem(uri, "file")
    if problem:
        raise ProviderError(f"the local provider takes file:///PATH URIs, not {uri!r}: {problem}")
    return Path(split_uri(uri)[2])


def _path_to_uri(path: Path) -> str:
    return "file://" + urllib.parse.quote(str(path.resolve()))


def _stamp(st: os.stat_result, data: bytes) -> str:
    """The tag of a file as written by LocalStore: its inode, mtime (ns), size and a digest of
    its bytes. Every write is a new file (temp + rename), and `put_if` also moves mtime past the
    file it replaces, so a write changes the stamp even when the bytes are the same. Pure."""
    digest = hashlib.blake2b(data, digest_size=8).hexdigest()
    return f"{st.st_ino}-{st.st_mtime_ns}-{st.st_size}-{digest}"


def _stamp_of_fd(fd: int, st: os.stat_result) -> str:
    """`_stamp` of the open file `fd`, its digest taken in chunks (no whole read into memory).
    Blocks on the reads."""
    digest = hashlib.blake2b(digest_size=8)
    offset = 0
    while chunk := os.pread(fd, COPY_CHUNK, offset):
        digest.update(chunk)
        offset += len(chunk)
    return f"{st.st_ino}-{st.st_mtime_ns}-{st.st_size}-{digest.hexdigest()}"


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive flock on `folder` (made if missing) for the block. flock, not fcntl's
    record locks: those are per process, and would not keep this process's threads apart; a
    fresh descriptor per call makes flock exclude threads and processes alike. Blocks."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


# how a store opens an object to read it: never through a symlink, never blocking on a FIFO
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def _open_object(path: Path, what: str) -> tuple[int, os.stat_result] | None:
    """A descriptor of the regular file at `path` and its stat, or None when there is none (or a
    folder is there). The last component is opened without following a symlink and without
    blocking, so a FIFO, a device, a socket or a symlink at the key is not read: it is no object
    (a listing skips it too), NotFound, which a bounded reader takes as nothing there (a poll
    that raised on it failed the run). Other errors (EACCES, ...) raise ProviderError. The caller
    closes the descriptor."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError as exc:  # ELOOP: a symlink at the key (O_NOFOLLOW); ENXIO: a socket
        if exc.errno in (errno.ELOOP, errno.ENXIO):
            raise NotFound(f"{what}: not a regular file, no object ({exc.strerror})") from None
        raise ProviderError(f"{what}: not a readable regular file ({exc.strerror})") from None
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode):
        os.set_blocking(fd, True)
        return fd, st
    os.close(fd)
    if stat.S_ISDIR(st.st_mode):
        return None
    raise NotFound(f"{what}: not a regular file, no object (mode {stat.filemode(st.st_mode)})")


def _read_fd(fd: int, max_bytes: int | None, what: str) -> bytes:
    """The bytes of the open file `fd` from its start: all of them, or with `max_bytes` at most
    max_bytes + 1 read before raising TooLarge. Blocks on the read."""
    limit = None if max_bytes is None else max_bytes + 1
    parts: list[bytes] = []
    got = 0
    while limit is None or got < limit:
        chunk = os.read(fd, COPY_CHUNK if limit is None else min(COPY_CHUNK, limit - got))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    if max_bytes is not None and got > max_bytes:
        raise TooLarge(f"{what}: more than {max_bytes} bytes, not read")
    return b"".join(parts)


class LocalStore:
    """An ObjectStore that is a folder. Writes are atomic (temp file + rename); thread-safe.

    Every write of a key (put, put_file, put_if, delete) holds an flock on the key's folder, so a
    conditional write's compare and rename are atomic against all of them, in any process.
    The folder is writable by the run's nodes, so it is untrusted: only regular files are
    objects; a read never follows a symlink at the key, never blocks on a FIFO, and no key leads
    out of the folder through a symlinked folder."""

    def __init__(self, uri: str) -> None:
        self.root = _uri_to_path(uri)
        self.uri = _path_to_uri(self.root)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise ProviderError(f"invalid object key {key!r}")
        path = self.root / key
        if not self._inside(path.parent):
            raise ProviderError(f"object key {key!r} leads out of {self.uri} (a symlink)")
        return path

    def _inside(self, folder: Path) -> bool:
        """Whether `folder`, its symlinks resolved, is the bucket's folder or inside it."""
        root = os.path.realpath(self.root)
        real = os.path.realpath(folder)
        return real == root or real.startswith(root.rstrip(os.sep) + os.sep)

    def ensure_bucket(self) -> Resource:
        """Create the folder, private to this user. Idempotent; a folder that already exists
        keeps its mode (a checkpoint URI may name any folder, even /etc)."""
        if not self.root.is_dir():
            self.root.mkdir(parents=True, exist_ok=True)
            crash_point("bucket")
            self.root.chmod(0o700)
        return Resource("local", "bucket", self.uri, "local", "")

    def put(self, key: str, data: bytes) -> None:
        """Write atomically. Idempotent."""
        path = self._path(key)
        with _folder_lock(path.parent):
            self._write(path, data)

    def _write(self, path: Path, data: bytes, after_ns: int = 0) -> os.stat_result:
        """Write `data` to a temp file in `path`'s folder (its mtime set past `after_ns` when it
        is not already), rename it over `path`; returns the new file's stat. The caller holds
        the folder's lock."""
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            st = os.stat(tmp)
            if st.st_mtime_ns <= after_ns:  # a coarse clock: same mtime as the file replaced
                os.utime(tmp, ns=(st.st_atime_ns, after_ns + 1))
                st = os.stat(tmp)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return st

    def _read(
        self, path: Path, max_bytes: int | None = None, tagged: bool = False
    ) -> tuple[bytes, os.stat_result] | None:
        """The bytes of the regular file `path` and the stat of that very file (one
        descriptor), or None when there is none. Raises NotFound for anything else at the key (a
        FIFO, a symlink: no object) and TooLarge past `max_bytes` (with `tagged`, carrying the
        file's stamp: a conditional write can still replace it)."""
        what = f"get {path.relative_to(self.root).as_posix()} in {self.uri}"
        opened = _open_object(path, what)
        if opened is None:
            return None
        fd, st = opened
        try:
            return _read_fd(fd, max_bytes, what), st
        except TooLarge as exc:
            if tagged:
                exc.tag = _stamp_of_fd(fd, st)
            raise
        finally:
            os.close(fd)

    def get_tagged(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str] | None:
        """The object and its stamp (inode, mtime, size, digest: see `_stamp`), or None when
        there is none; TooLarge when it holds more than `max_bytes` (at most max_bytes + 1
        read). Reads one file through one descriptor, so bytes and stamp belong together.
        Blocks briefly; takes no lock (writes are renames)."""
        found = self._read(self._path(key), max_bytes, tagged=True)
        return None if found is None else (found[0], _stamp(found[1], found[0]))

    def put_if(self, key: str, data: bytes, tag: str | None) -> str:
        """Write the object only if its stamp is `tag` (None: only if there is no object);
        returns the new stamp. The compare and the rename happen under the folder's flock, which
        every writer of this store takes, in any process. Raises PreconditionFailed when the
        condition does not hold. Not idempotent. Blocks while another write holds the lock."""
        path = self._path(key)
        with _folder_lock(path.parent):
            found = self._read(path)
            current = None if found is None else _stamp(found[1], found[0])
            if current != tag:
                state = "no object" if current is None else f"stamp {current}"
                raise PreconditionFailed(
                    f"put {key!r} in {self.uri} if its stamp is {tag}: it has {state}"
                )
            st = self._write(path, data, after_ns=0 if found is None else found[1].st_mtime_ns)
        return _stamp(st, data)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        """Read an object; NotFound if missing, TooLarge when it holds more than `max_bytes`
        (at most max_bytes + 1 read); NotFound too for what is not a regular file (a FIFO, a
        symlink: no object). Blocks briefly."""
        found = self._read(self._path(key), max_bytes)
        if found is None:
            raise NotFound(f"no object {key!r} in {self.uri}")
        return found[0]

    def put_file(self, key: str, path: str, progress: Progress = None) -> None:
        """Copy a file in atomically, calling `progress` per 4 MiB copied. Idempotent."""
        dest = self._path(key)
        with _folder_lock(dest.parent):
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
            os.close(fd)
            try:
                copy_file(path, tmp, progress)
                os.replace(tmp, dest)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise

    def get_file(self, key: str, path: str, progress: Progress = None) -> None:
        """Copy an object out to `path` atomically (through the sidecar, renamed when
        complete), calling `progress` per 4 MiB copied; NotFound if missing. A local copy: a
        failed one starts over."""
        opened = _open_object(self._path(key), f"get {key} in {self.uri}")
        if opened is None:
            raise NotFound(f"no object {key!r} in {self.uri}")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        side = sidecar_path(path)
        try:
            with os.fdopen(opened[0], "rb") as fin, open(side, "wb") as fout:
                while chunk := fin.read(COPY_CHUNK):
                    fout.write(chunk)
                    report(progress, len(chunk))
            os.replace(side, path)
        except BaseException:
            with contextlib.suppress(OSError):
                side.unlink()
            raise

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Objects under `prefix` (a key prefix, not only a folder), sorted by key."""
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self._path(base) if base else self.root
        out: list[ObjectInfo] = []
        if not start.is_dir() or not self._inside(start):
            return out
        for dirpath, _dirs, files in os.walk(start):  # never into a symlinked folder
            for fname in files:
                if fname.startswith(".tmp-"):
                    continue
                full = Path(dirpath) / fname
                key = full.relative_to(self.root).as_posix()
                if not key.startswith(prefix):
                    continue
                try:
                    st = os.lstat(full)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):  # no symlink, FIFO, socket or device
                    out.append(ObjectInfo(key, st.st_size, st.st_mtime))
        out.sort(key=lambda o: o.key)
        return out

    def delete(self, key: str) -> None:
        """Delete one object. Idempotent."""
        path = self._path(key)
        if not path.parent.is_dir():
            return
        with _folder_lock(path.parent), contextlib.suppress(FileNotFoundError):
            path.unlink()

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix`. Idempotent."""
        objs = self.list(prefix)
        for obj in objs:
            self.delete(obj.key)
        return len(objs)

    def presign_get(self, key: str, ttl_s: int = 3600) -> str:
        """A file:// URL (a folder needs no signature; curl reads it)."""
        return _path_to_uri(self._path(key))

    def presign_put(self, key: str, ttl_s: int = 3600) -> str:
        """A file:// URL that `curl -T` can write to; its folder is created now."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        return _path_to_uri(path)
