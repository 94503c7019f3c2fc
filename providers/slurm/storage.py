"""The Slurm provider's bucket: a folder on the cluster's shared filesystem, `slurm:///PATH`.

The nodes see the folder: on the cluster (no login host configured) the store is the folder
store itself (providers/local_store.py's LocalStore at PATH). The controller does not: it runs
each operation on the login host with the cluster's Python (`SlurmStore`, one ssh call per
operation, providers/slurm/folder_serve.py), so both sides write by the same rules, the
conditional writes included. Presigned URLs are file:// URLs of the folder: only the nodes,
which see it, fetch them.

What comes back is untrusted: a listing line that does not parse is skipped, reads are bounded
as asked, a file streamed in lands whole or not at all (the sidecar, then a rename).
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from cloudtrain.core.errors import NotFound, PreconditionFailed, ProviderError, TooLarge
from cloudtrain.providers.base import ObjectInfo, Resource
from cloudtrain.providers.local_store import LocalStore, _path_to_uri
from cloudtrain.providers.slurm import folder_serve as fs
from cloudtrain.providers.slurm.login import LoginHost, run_on_login_raw
from cloudtrain.providers.transfer import report, sidecar_path
from cloudtrain.providers.uri_rules import split_uri, uri_problem

SCHEME = "slurm"
SERVE_MODULE = "cloudtrain.providers.slurm.folder_serve"
TRANSFER_TIMEOUT_S = 3600.0  # one streamed file; a call's own (the retry layer's are per call)
MAX_READ_BYTES = 1 << 30  # an unbounded get: what one call holds in memory (get_file streams)
_ANSWERS = (fs.EXIT_NOT_FOUND, fs.EXIT_TOO_LARGE, fs.EXIT_PRECONDITION)


def folder_of(uri: str) -> str:
    """The absolute path of a `slurm:///PATH` URI (percent-decoded), by the URI rules the spec
    applies too (providers/uri_rules.py). ProviderError for any other URI. Pure."""
    problem = uri_problem(uri, SCHEME)
    if problem:
        raise ProviderError(
            f"the Slurm provider's buckets are slurm:///PATH URIs, not {uri!r}: {problem}"
        )
    return split_uri(uri)[2].rstrip("/")


def uri_of(path: str) -> str:
    """`slurm:///PATH` of an absolute path. Pure."""
    return f"{SCHEME}://" + urllib.parse.quote(path)


def node_store(uri: str) -> LocalStore:
    """The store of a node on the cluster: the folder itself. Creates nothing."""
    return LocalStore(_path_to_uri(Path(folder_of(uri))))


class SlurmStore:
    """The bucket as the controller reaches it: each operation one ssh call running
    folder_serve with `python` on the login host (module docstring). Thread-safe."""

    def __init__(self, uri: str, login: LoginHost, python: str = "python3") -> None:
        self.root = folder_of(uri)
        self.uri = uri_of(self.root)
        self.login, self.python = login, python

    def _call(
        self,
        op: str,
        *args: str,
        stdin: bytes | Path = b"",
        stdout_to: Path | None = None,
        timeout_s: float = 120,
        max_bytes: int | None = None,
    ) -> bytes:
        """Run `op`; its stdout (at most `max_bytes`, None: login's bound). Raises NotFound,
        TooLarge (with the object's tag), PreconditionFailed or ProviderError as folder_serve
        answered."""
        command = [self.python, "-m", SERVE_MODULE, op, self.root, *args]
        out, err, code = run_on_login_raw(
            self.login, command, stdin=stdin, stdout_to=stdout_to, timeout_s=timeout_s,
            what=f"{op} {args[0] if args else ''} in {self.uri}".strip(), accept=_ANSWERS,
            max_bytes=max_bytes,
        )  # fmt: skip
        lines = err.decode("utf-8", errors="replace").splitlines()
        said = lines[-1][:300] if lines else ""
        where = f"{op} {args[0]!r} in {self.uri}" if args else f"{op} {self.uri}"
        if code == fs.EXIT_NOT_FOUND:
            raise NotFound(f"{where}: no such object")
        if code == fs.EXIT_TOO_LARGE:
            exc = TooLarge(f"{where}: {said}")
            tag = lines[0].strip() if lines else fs.NO_TAG
            exc.tag = None if tag == fs.NO_TAG else tag[:200]
            raise exc
        if code == fs.EXIT_PRECONDITION:
            raise PreconditionFailed(f"{where}: {said}")
        return out

    def ensure_bucket(self) -> Resource:
        """Make the folder, private to the user. Idempotent; blocks (one ssh)."""
        self._call("ensure")
        return Resource(SCHEME, "bucket", self.uri, None, "")

    def put(self, key: str, data: bytes) -> None:
        """Write atomically. Idempotent; blocks."""
        self._call("put", key, stdin=data)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        """Read an object (bounded by `max_bytes`: TooLarge). NotFound if missing. Blocks."""
        bound, limit = _bounded(max_bytes)
        return self._call("get", key, bound, max_bytes=limit)

    def get_tagged(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str] | None:
        """The object and its stamp (the folder store's), or None when there is none;
        TooLarge past `max_bytes`. Blocks."""
        try:
            bound, limit = _bounded(max_bytes, extra=256)
            out = self._call("get_tagged", key, bound, max_bytes=limit)
        except NotFound:
            return None
        tag, sep, data = out.partition(b"\n")
        if not sep or not tag:
            raise ProviderError(f"get_tagged {key!r} in {self.uri}: an answer without a tag")
        return data, tag.decode("ascii", errors="replace")[:200]

    def put_if(self, key: str, data: bytes, tag: str | None) -> str:
        """Write only if the stamp is `tag` (None: only if absent), atomically against every
        writer of the folder; the new stamp. PreconditionFailed otherwise. Blocks."""
        if tag is not None and (not tag or any(c.isspace() for c in tag)):
            raise PreconditionFailed(f"put {key!r} in {self.uri}: {tag!r} is no stamp")
        answer = self._call("put_if", key, tag or fs.NO_TAG, stdin=data)
        return answer.decode("ascii", errors="replace").strip()[:200]

    def put_file(self, key: str, path: str, progress: Callable[[int], None] | None = None) -> None:
        """Stream a file in; it appears whole. Not resumed: a failed call sends it all again.
        Idempotent; blocks."""
        self._call("put_file", key, stdin=Path(path), timeout_s=TRANSFER_TIMEOUT_S)
        report(progress, os.path.getsize(path))

    def get_file(self, key: str, path: str, progress: Callable[[int], None] | None = None) -> None:
        """Stream an object out into `path` (through its sidecar, renamed when whole).
        NotFound if missing. Blocks."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        side = sidecar_path(path)
        try:
            self._call("get_file", key, stdout_to=side, timeout_s=TRANSFER_TIMEOUT_S)
            os.replace(side, path)
        except BaseException:
            with contextlib.suppress(OSError):
                side.unlink()
            raise
        report(progress, os.path.getsize(path))

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with `prefix`, sorted by key. Blocks."""
        out: list[ObjectInfo] = []
        for line in self._call("list", prefix).splitlines():
            with contextlib.suppress(ValueError, TypeError, KeyError):
                obj = json.loads(line)
                key, size, updated = obj["key"], obj["size"], obj["updated"]
                if isinstance(key, str) and key.startswith(prefix):
                    out.append(ObjectInfo(key, int(size), float(updated)))
        return sorted(out, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        """Delete one object. Idempotent."""
        self._call("delete", key)

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix`; how many. Idempotent."""
        answer = self._call("delete_prefix", prefix).strip()
        return int(answer) if answer.isdigit() else 0

    def presign_get(self, key: str, ttl_s: int = 3600) -> str:
        """A file:// URL of the object on the cluster (the nodes see the folder). Pure."""
        return "file://" + urllib.parse.quote(f"{self.root}/{_key(key)}")

    def presign_put(self, key: str, ttl_s: int = 3600) -> str:
        """A file:// URL the nodes' `curl -T` writes (its folder made now, on the cluster)."""
        folder = f"{self.root}/{_key(key)}".rsplit("/", 1)[0]
        run_on_login_raw(self.login, ["mkdir", "-p", "--", folder], what=f"mkdir {folder}")
        return self.presign_get(key)


def _bounded(max_bytes: int | None, extra: int = 0) -> tuple[str, int]:
    """folder_serve's bound argument and the stdout this side takes: the bound + 1 (+ `extra`,
    a tag line), or the largest object one call reads into memory. Pure."""
    if max_bytes is None:
        return fs.NO_TAG, MAX_READ_BYTES
    return str(max_bytes), max_bytes + 1 + extra


def _key(key: str) -> str:
    if key.startswith("/") or ".." in key.split("/") or "\x00" in key:
        raise ProviderError(f"invalid object key {key!r}")
    return key
