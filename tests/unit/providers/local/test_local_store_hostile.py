"""On the local provider the bucket is a folder a node writes into (issue 29): a FIFO at a
document's key, a symlink out of the bucket or a symlink loop must never block a read, leak a
file outside the bucket or break a listing. LocalStore reads regular files only, opens them
without following a symlink (O_NOFOLLOW) and without blocking (O_NONBLOCK), and its listing
skips what is not a regular file."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.core.errors import NotFound, ProviderError
from cloudtrain.providers.local import LocalStore


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    s = LocalStore((tmp_path / "bucket").as_uri())
    s.ensure_bucket()
    s.put("cloudtrain/runs/r/status/chief-0.json", b'{"state": "running"}')
    return s


def _within(fn: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    """fn() in a thread; fails the test when it has not returned after `timeout_s` (a read
    blocked on a FIFO never returns: the thread is a daemon and dies with the test run)."""
    done = threading.Event()
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:
            out["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(timeout_s), "the read blocked"
    if "error" in out:
        raise out["error"]
    return out.get("value")


KEY = "cloudtrain/runs/r/heartbeat/chief-0.json"


def test_a_fifo_at_a_key_is_refused_not_read_forever(store: LocalStore) -> None:
    path = store.root / KEY
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    for read in (
        lambda: store.get(KEY),
        lambda: store.get(KEY, max_bytes=100),
        lambda: store.get_tagged(KEY),
        lambda: store.get_file(KEY, str(store.root.parent / "out")),
    ):
        with pytest.raises(ProviderError):
            _within(read)
    listed = _within(lambda: store.list("cloudtrain/runs/r/"))
    assert [o.key for o in listed] == ["cloudtrain/runs/r/status/chief-0.json"]


def test_a_symlink_out_of_the_bucket_is_not_followed(store: LocalStore, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"the user's private key")
    path = store.root / KEY
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(secret)
    (store.root / "cloudtrain/runs/r/logs").symlink_to(tmp_path, target_is_directory=True)
    for read in (
        lambda: store.get(KEY),
        lambda: store.get_tagged(KEY),
        lambda: store.get("cloudtrain/runs/r/logs/secret.txt"),
        lambda: store.get_file(KEY, str(tmp_path / "copy")),
    ):
        with pytest.raises((NotFound, ProviderError)):
            read()
    assert not (tmp_path / "copy").exists()
    keys = [o.key for o in store.list("cloudtrain/runs/r/")]
    assert keys == ["cloudtrain/runs/r/status/chief-0.json"]


def test_a_symlink_loop_is_skipped_by_a_listing(store: LocalStore) -> None:
    folder = store.root / "cloudtrain/runs/r/logs/chief-0"
    folder.mkdir(parents=True)
    (folder / "loop").symlink_to(folder, target_is_directory=True)
    (folder / "a.log").symlink_to(folder / "b.log")
    (folder / "b.log").symlink_to(folder / "a.log")
    store.put("cloudtrain/runs/r/logs/chief-0/00000000.log", b"line\n")
    keys = [o.key for o in _within(lambda: store.list("cloudtrain/runs/r/logs/"))]
    assert keys == ["cloudtrain/runs/r/logs/chief-0/00000000.log"]
    with pytest.raises((NotFound, ProviderError)):
        store.get("cloudtrain/runs/r/logs/chief-0/a.log")
