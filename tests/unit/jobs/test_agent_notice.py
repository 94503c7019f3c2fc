"""The agent on a preemption notice: it flushes the chief's checkpoints inside the notice window,
writes `notice/<node>.json` for the controller, and the controller's reader picks it up; and the
watcher is chosen from the run's store (none for the local provider's folders)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cloudtrain.jobs.agent import Agent
from cloudtrain.jobs.preemption import PreemptionWatcher
from cloudtrain.providers.local import LocalStore
from cloudtrain.state.runstate import RunReader
from tests.fakes.metadata_server import MetadataServer
from tests.unit.agent_kit import PREFIX, RUN_ID, bucket_files, make_agent, read_logs

VM = f"ct-{RUN_ID}-chief-0"


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    s = LocalStore((tmp_path / "bucket").as_uri())
    s.ensure_bucket()
    return s


def _watching(agent: Agent, cloud: str, server: MetadataServer) -> Agent:
    agent.watcher = PreemptionWatcher(cloud, VM, base_url=server.url, interval_s=0.0)
    return agent


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_a_notice_flushes_the_chiefs_checkpoints_and_is_reported(
    store: LocalStore, tmp_path: Path, cloud: str
) -> None:
    agent = make_agent(store, tmp_path / "work")
    agent.ckpt_dir.mkdir(parents=True)
    (agent.ckpt_dir / "ckpt-3.index").write_text("epoch 3")
    with MetadataServer(vm_name=VM) as server:
        _watching(agent, cloud, server)
        agent.tick()
        assert agent.notice is None and not store.list(PREFIX + "notice/")
        assert bucket_files(store, "checkpoints/") == {"ckpt-3.index": b"epoch 3"}
        (agent.ckpt_dir / "ckpt-4.index").write_text("epoch 4")  # written since the last sync
        server.preempt(VM)
        agent._last["sync"] = 1e18  # the periodic sync is not due: only the notice flushes
        agent.tick()
    assert agent.notice is not None and agent.notice.cloud == cloud
    assert bucket_files(store, "checkpoints/")["ckpt-4.index"] == b"epoch 4"
    notice = json.loads(store.get(PREFIX + "notice/chief-0.json"))
    assert notice["attempt"] == 1 and notice["cloud"] == cloud
    assert "preemption notice" in read_logs(store, "chief-0")
    snap = RunReader(store, RUN_ID).poll()
    assert snap.notices["chief-0"]["attempt"] == 1


def test_a_notice_is_acted_on_once(store: LocalStore, tmp_path: Path) -> None:
    agent = make_agent(store, tmp_path / "work")
    with MetadataServer(vm_name=VM) as server:
        _watching(agent, "gcp", server)
        server.preempt(VM)
        agent.tick()
        first = store.get(PREFIX + "notice/chief-0.json")
        agent.tick()
        agent.tick()
    assert store.get(PREFIX + "notice/chief-0.json") == first
    assert read_logs(store, "chief-0").count("preemption notice") == 1


def test_the_local_provider_has_no_watcher(store: LocalStore, tmp_path: Path) -> None:
    agent = Agent(RUN_ID, "worker", 1, store, tmp_path / "work")
    assert not agent.watcher.enabled
