"""A local node's folder is its VM's disk: deleting the node takes what it wrote with it, as
deleting a cloud VM takes its boot disk, and a node created again under the same name boots on
an empty disk, as a new VM does (its predecessor's checkpoints, model, bundle and partial
downloads are not there to be found). What stays is the node's record (node.json: the local
provider's tags, which `list_nodes` and `inventory` read) and its console log."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from cloudtrain.providers.base import NodeRequest, RunInfo
from cloudtrain.providers.local import KEPT_AFTER_DELETE, LocalCompute, kill_session

# what a node writes in its folder: a checkpoint, a model, a half-fetched file, a link out
WRITE = """mkdir -p checkpoints model bundle/code tmp
head -c 1000000 /dev/zero > checkpoints/ckpt-1.data
echo m > model/saved_model.pb && echo c > bundle/code/train.py
echo partial > checkpoints/ckpt-2.data.ct-part
ln -s "$OUTSIDE" data
echo written
sleep 600
"""


class WrittenNode:
    """A local node (run `run_id`) that wrote WRITE's files in its folder and runs on."""

    def __init__(self, tmp_path: Path, run_id: str, index: int) -> None:
        self.compute = LocalCompute(tmp_path / "local")
        self.run = RunInfo(run_id, "local", None, (2222, 2232))
        request = NodeRequest(run_id, "worker", index, "local", WRITE)
        self.node = self.compute.create_node(self.run, request)
        self.folder = tmp_path / "local" / "runs" / run_id / "nodes" / request.name
        console, deadline = self.folder / "console.log", time.time() + 30
        while not (console.exists() and "written" in console.read_text()):
            assert time.time() < deadline, "the node did not write its files"
            time.sleep(0.05)


def test_deleting_a_node_deletes_its_disk_but_its_record_and_console(
    tmp_path: Path, monkeypatch
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "dataset.csv").write_text("x\n")
    monkeypatch.setenv("OUTSIDE", str(outside))
    written = WrittenNode(tmp_path, "disk-abcdef", 0)
    compute, run, node, folder = written.compute, written.run, written.node, written.folder
    assert (folder / "checkpoints" / "ckpt-1.data").stat().st_size == 1_000_000
    compute.delete_node(node)
    assert sorted(os.listdir(folder)) == sorted(KEPT_AFTER_DELETE)
    assert "written" in (folder / "console.log").read_text()
    assert (outside / "dataset.csv").read_text() == "x\n"  # a link is removed, not followed
    assert compute.list_nodes(run.run_id) == []
    compute.delete_node(node)  # idempotent
    assert sorted(os.listdir(folder)) == sorted(KEPT_AFTER_DELETE)


def test_a_node_created_again_boots_on_an_empty_disk(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("OUTSIDE", str(tmp_path))
    written = WrittenNode(tmp_path, "again-abcdef", 1)
    compute, run, node, folder = written.compute, written.run, written.node, written.folder
    # the node is lost (its session killed from outside), not deleted: then made again
    kill_session(int(json.loads((folder / "node.json").read_text())["pid"]))
    assert [n.state for n in compute.list_nodes(run.run_id)] == ["terminated"]
    again = NodeRequest(run.run_id, "worker", 1, "local", "ls -a\nsleep 600\n")
    compute.create_node(run, again)
    try:
        deadline = time.time() + 30
        while "startup.sh" not in (folder / "console.log").read_text().split("written", 1)[-1]:
            assert time.time() < deadline
            time.sleep(0.05)
        listing = (folder / "console.log").read_text().split("written", 1)[-1].split()
        for gone in ("checkpoints", "model", "bundle", "tmp", "data"):
            assert gone not in listing, listing
    finally:
        compute.delete_node(node)
