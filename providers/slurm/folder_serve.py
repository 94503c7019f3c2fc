"""The Slurm provider's bucket, served on the cluster: ONE operation of the folder store the
nodes use (providers/local_store.py's LocalStore) per call, which the controller runs over SSH
with the cluster's Python (providers/slurm/storage.py):

    python -m cloudtrain.providers.slurm.folder_serve OP ROOT [ARG...]

so the controller and the nodes write the bucket by one set of rules: the same temp files and
renames, the same flock on a key's folder (a conditional write is atomic against every
writer, node or controller), the same stamps, the same refusals (no symlink followed, no FIFO
read, no key out of the folder). Not SFTP: SFTP has no conditional write, and the run's lease
needs one.

Operations (data in on stdin, out on stdout): ensure; put KEY; get KEY MAX (MAX "-": no
bound); get_tagged KEY MAX (stdout: the tag, a newline, the bytes); put_if KEY TAG (TAG "-":
only if there is no object; stdout: the new tag); put_file KEY (a stream); get_file KEY (a
stream); list PREFIX (stdout: one JSON object per line); delete KEY; delete_prefix PREFIX
(stdout: how many). The outcome is the exit status, EXIT_* below; an error's one line is the
last line on stderr. Node-side code: standard library and cloudtrain's node modules, Python 3.10.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from cloudtrain.core.errors import NotFound, PreconditionFailed, ProviderError, TooLarge
from cloudtrain.providers.local_store import LocalStore, _folder_lock, _open_object, _path_to_uri
from cloudtrain.providers.transfer import COPY_CHUNK

EXIT_OK = 0
EXIT_NOT_FOUND = 3
EXIT_TOO_LARGE = 4  # stderr's first line: the object's tag ("-" when it has none)
EXIT_PRECONDITION = 5
EXIT_ERROR = 6
EXIT_USAGE = 2
NO_TAG = "-"


def _bound(text: str) -> int | None:
    return None if text == NO_TAG else int(text)


def _put_stream(store: LocalStore, key: str) -> None:
    """Stdin into a temp file beside the key, renamed over it under the folder's lock (what
    LocalStore.put_file does with a file). A failed stream leaves no object and no temp."""
    dest = store._path(key)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(sys.stdin.buffer, out, COPY_CHUNK)
        with _folder_lock(dest.parent):
            os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _get_stream(store: LocalStore, key: str) -> None:
    """The object to stdout, read through one descriptor that never followed a symlink."""
    opened = _open_object(store._path(key), f"get {key} in {store.uri}")
    if opened is None:
        raise NotFound(f"no object {key!r} in {store.uri}")
    with os.fdopen(opened[0], "rb") as src:
        shutil.copyfileobj(src, sys.stdout.buffer, COPY_CHUNK)


def serve(op: str, root: str, args: list[str]) -> int:
    """Run one operation on the folder store at `root`; its exit status. Blocks."""
    store = LocalStore(_path_to_uri(Path(root)))
    out = sys.stdout.buffer
    if op == "ensure":
        store.ensure_bucket()
    elif op == "put":
        store.put(args[0], sys.stdin.buffer.read())
    elif op == "get":
        out.write(store.get(args[0], _bound(args[1])))
    elif op == "get_tagged":
        found = store.get_tagged(args[0], _bound(args[1]))
        if found is None:
            return EXIT_NOT_FOUND
        out.write(found[1].encode() + b"\n" + found[0])
    elif op == "put_if":
        tag = None if args[1] == NO_TAG else args[1]
        out.write(store.put_if(args[0], sys.stdin.buffer.read(), tag).encode())
    elif op == "put_file":
        _put_stream(store, args[0])
    elif op == "get_file":
        _get_stream(store, args[0])
    elif op == "list":
        for obj in store.list(args[0]):
            line = {"key": obj.key, "size": obj.size, "updated": obj.updated}
            out.write(json.dumps(line).encode() + b"\n")
    elif op == "delete":
        store.delete(args[0])
    elif op == "delete_prefix":
        out.write(str(store.delete_prefix(args[0])).encode())
    else:
        print(f"folder_serve: unknown operation {op!r}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def main(argv: list[str]) -> int:
    """The command line: OP ROOT [ARG...]; its exit status (module docstring)."""
    if len(argv) < 2:
        print("usage: folder_serve OP ROOT [ARG...]", file=sys.stderr)
        return EXIT_USAGE
    try:
        return serve(argv[0], argv[1], argv[2:])
    except NotFound as exc:
        print(exc, file=sys.stderr)
        return EXIT_NOT_FOUND
    except TooLarge as exc:
        print(getattr(exc, "tag", None) or NO_TAG, file=sys.stderr)
        print(exc, file=sys.stderr)
        return EXIT_TOO_LARGE
    except PreconditionFailed as exc:
        print(exc, file=sys.stderr)
        return EXIT_PRECONDITION
    except (ProviderError, OSError, ValueError, IndexError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
