"""The `provider` fixture: the contract suite runs once per entry of `CASES`.

Each `ProviderCase` says how to build the provider for one test, which store URI to use, whether
it can run today (an emulator or SDK may be missing: the case then skips with the reason), and
what its nodes leave behind (for `local`, the processes of a node's session). Adding a cloud is
one entry, e.g.

    "aws": ProviderCase(
        name="aws",
        build=lambda tmp: AwsProvider(ProviderConfig("aws", region="us-east-1")),
        store_uri=lambda tmp: f"s3://ct-contract-{tmp.name[-8:]}",
        unavailable=lambda: None if moto_server_running() else "moto server is not running",
    ),

The fixture records every run id a test uses (`harness.run_id()`) and tears all of them down:
their nodes and network resources, and for `local` any process still in a node's session.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cloudtrain.providers.base import Node, Provider, ProviderConfig


@dataclass(frozen=True)
class ProviderCase:
    """One provider under contract: how to build it and how to check what it leaves behind."""

    name: str
    build: Callable[[Path], Provider]  # gets a fresh temporary folder
    store_uri: Callable[[Path], str]  # a fresh, not yet created bucket for one test
    unavailable: Callable[[], str | None] = lambda: None  # a skip reason, or None to run
    fetchable_urls: bool = True  # presigned URLs work with curl (False for in-memory fakes)
    runs_scripts: bool = False  # nodes really run their startup script (as processes here)
    leftovers: Callable[[Node], list[int]] = lambda node: []  # live pids of a deleted node
    force_cleanup: Callable[[Provider], None] = lambda provider: None  # last resort, teardown


def _local_build(tmp: Path) -> Provider:
    from cloudtrain.providers.local import LocalProvider

    return LocalProvider(ProviderConfig(name="local", options={"root": str(tmp / "local")}))


def _local_leftovers(node: Node) -> list[int]:
    from cloudtrain.providers.local import session_pids

    return session_pids(int(node.cloud_id)) if node.cloud_id and node.cloud_id.isdigit() else []


def _local_force_cleanup(provider: Provider) -> None:
    """SIGKILL what is left in the session of any node this provider started and did not delete
    (a deleted node was verified empty; its pid may since belong to someone else)."""
    from cloudtrain.providers.local import LocalProvider, session_pids

    assert isinstance(provider, LocalProvider)
    for meta_path in provider.root.glob("runs/*/nodes/*/node.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            meta = json.loads(meta_path.read_text())
            if meta.get("deleted"):
                continue
            sid = int(meta["pid"])
            for _ in range(100):
                pids = session_pids(sid)
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.02)


def _memory_build(tmp: Path) -> Provider:
    from tests.fakes.memory_provider import MemoryProvider

    return MemoryProvider()


CASES: dict[str, ProviderCase] = {
    "local": ProviderCase(
        name="local",
        build=_local_build,
        store_uri=lambda tmp: f"file://{tmp / 'bucket'}",
        runs_scripts=True,
        leftovers=_local_leftovers,
        force_cleanup=_local_force_cleanup,
    ),
    "memory": ProviderCase(
        name="memory",
        build=_memory_build,
        store_uri=lambda tmp: f"mem://ct-contract-{uuid.uuid4().hex[:8]}",
        fetchable_urls=False,
    ),
}


@dataclass
class Harness:
    """What a contract test gets: the provider, its case, and run ids that are cleaned up."""

    case: ProviderCase
    provider: Provider
    store_uri: str
    run_ids: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.case.name

    def run_id(self) -> str:
        """A fresh run id, torn down after the test."""
        run_id = f"ct{uuid.uuid4().hex[:10]}"
        self.run_ids.append(run_id)
        return run_id

    def teardown(self) -> None:
        compute = self.provider.compute
        errors: list[BaseException] = []
        for run_id in self.run_ids:
            try:
                compute.delete_nodes(run_id)
                compute.delete_resources(compute.list_resources(run_id))
            except Exception as exc:  # keep cleaning the other runs, then report
                errors.append(exc)
        self.case.force_cleanup(self.provider)
        if errors:
            raise errors[0]


@pytest.fixture(params=sorted(CASES), ids=str)
def provider(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Harness]:
    """One provider of `CASES`, isolated in `tmp_path`, with every run it made torn down."""
    case = CASES[request.param]
    reason = case.unavailable()
    if reason:
        pytest.skip(f"{case.name}: {reason}")
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path / "home"))
    harness = Harness(case, case.build(tmp_path), case.store_uri(tmp_path))
    try:
        yield harness
    finally:
        harness.teardown()
