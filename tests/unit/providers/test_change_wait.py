"""providers/change_wait.py: a folder store wakes its waiter on a write; others sleep it out.
Node-side (the agents wait on it too): runs on 3.10-3.12."""

from __future__ import annotations

import threading
from pathlib import Path

from cloudtrain.providers.change_wait import ChangeWaiter
from cloudtrain.providers.local import LocalStore

RUN = "cloudtrain/runs/r-1/"


def _write_soon(store: LocalStore, key: str, after_s: float = 0.05) -> threading.Timer:
    timer = threading.Timer(after_s, store.put, (key, b"{}"))
    timer.start()
    return timer


def test_a_write_in_a_watched_folder_wakes_the_waiter(tmp_path: Path) -> None:
    store = LocalStore((tmp_path / "bucket").as_uri())
    store.put(f"{RUN}status/worker-0.json", b"{}")
    waiter = ChangeWaiter(store.uri, [f"{RUN}status/", f"{RUN}notice/"])
    assert waiter.wakes_on_change
    assert waiter.wait(0.05) is False  # nothing changed: the timeout
    _write_soon(store, f"{RUN}status/worker-0.json").join()  # a rewrite (rename over the file)
    assert waiter.wait(30) is True
    # a folder that did not exist yet, made by the write (notice/ of a spot node)
    timer = _write_soon(store, f"{RUN}notice/worker-1.json")
    assert waiter.wait(30) is True
    timer.join()
    # a put touches the folder more than once (its lock file, temp file and rename): the wake may
    # come at the first, and the rest is still a change for the next wait; taken here
    waiter.wait(0)
    # a write elsewhere (a log chunk) is not a change it waits for
    _write_soon(store, f"{RUN}logs/worker-0/00000001.log").join()
    assert waiter.wait(0.05) is False


def test_an_object_store_in_a_cloud_sleeps_the_timeout_out() -> None:
    waiter = ChangeWaiter("s3://bucket", [f"{RUN}status/"])
    assert not waiter.wakes_on_change
    assert waiter.wait(0.01) is False
