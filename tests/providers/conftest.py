"""The `provider` fixture: the contract suite runs once per registered provider
(`cloudtrain.providers.names()`) and once for the in-memory test provider (`TEST_ONLY`).

Each `ProviderCase` of `CASES` says how to build the provider for one test, which store URI to
use, whether it can run today (an emulator or SDK may be missing: the case then skips with the
reason), and what its nodes leave behind (for `local`, the processes of a node's session). A
registered provider without a case FAILS every contract test (it is never skipped silently), and
so does a case for a provider that is not registered. Adding a cloud is one entry (see
providers/README.md), e.g.

    "aws": ProviderCase(
        name="aws",
        build=_aws_build,  # AwsProvider(ProviderConfig(name="aws", region="us-east-1"))
        store_uri=lambda tmp: f"s3://cloudtrain-test-{uuid.uuid4().hex[:12]}/pfx",
        unavailable=lambda: None if moto_available() else "moto server mode is not installed",
        fixtures=("moto_server", "moto_public_images"),  # moto: one server, reset per test
    ),

`fixtures` are requested before `build` (e.g. an emulator that sets the SDK's environment), and
`compute_unavailable` skips only the compute tests (at `harness.compute`), for a case whose
compute cannot run here (every registered provider's can today: none sets it). Compute tests
must take the compute as `provider.compute` (the harness), not `provider.provider.compute`.

The fixture records every run id a test uses (`harness.run_id()`) and tears all of them down:
their nodes and network resources, and for `local` any process still in a node's session.
"""

from __future__ import annotations

import contextlib
import json
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cloudtrain.providers import names
from cloudtrain.providers.base import Compute, Node, Provider, ProviderConfig
from tests.fakes.azure_cloud import azure_cloud, azure_config, azurite, azurite_session
from tests.fakes.gcp_cloud import gcp_cloud, gcs_emulator, gcs_emulator_session
from tests.fakes.moto_server import (
    moto_available,
    moto_public_images,
    moto_server,
    moto_server_session,
)
from tests.fakes.slurm_box import SlurmBox, slurm_cluster

__all__ = [  # fixtures, for pytest
    "azure_cloud",
    "azurite",
    "azurite_session",
    "gcp_cloud",
    "gcs_emulator",
    "gcs_emulator_session",
    "moto_public_images",
    "moto_server",
    "moto_server_session",
]


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
    fixtures: tuple[str, ...] = ()  # pytest fixtures to set up before `build` (emulators)
    compute_unavailable: Callable[[], str | None] = lambda: None  # skips compute tests only
    put_headers: tuple[str, ...] = ()  # headers a presigned PUT needs (curl -H), e.g. Azure's


def _local_build(tmp: Path) -> Provider:
    from cloudtrain.providers.local import LocalProvider

    return LocalProvider(ProviderConfig(name="local", options={"root": str(tmp / "local")}))


def _local_leftovers(node: Node) -> list[int]:
    from cloudtrain.providers.local import session_pids

    return session_pids(int(node.cloud_id)) if node.cloud_id and node.cloud_id.isdigit() else []


def _local_force_cleanup(provider: Provider) -> None:
    """SIGKILL what is left in the session of any node this provider started and did not delete
    (a deleted node was verified empty; its pid may since belong to someone else)."""
    from cloudtrain.providers.local import LocalProvider, kill_session

    assert isinstance(provider, LocalProvider)
    for meta_path in provider.root.glob("runs/*/nodes/*/node.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            meta = json.loads(meta_path.read_text())
            if meta.get("deleted"):
                continue
            kill_session(int(meta["pid"]))


def _aws_build(tmp: Path) -> Provider:
    from cloudtrain.providers.aws.provider import AwsProvider

    return AwsProvider(ProviderConfig(name="aws", region="us-east-1"))


def _gcp_build(tmp: Path) -> Provider:
    from cloudtrain.providers.gcp.provider import GcpProvider

    return GcpProvider(ProviderConfig(name="gcp", region="us-central1", zone="us-central1-a"))


def _azure_build(tmp: Path) -> Provider:
    from cloudtrain.providers.azure.provider import AzureProvider

    return AzureProvider(azure_config("eastus"))


# the Slurm box of this test session (tests/fakes/slurm_box.py), started by the `slurm_box`
# fixture the slurm case names, once per session (per xdist worker)
_SLURM_BOXES: list[SlurmBox] = []


@pytest.fixture(scope="session")
def slurm_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmBox]:
    """A real Slurm cluster for the slurm case, closed at the session's end."""
    with slurm_cluster(tmp_path_factory) as box:
        _SLURM_BOXES.append(box)
        try:
            yield box
        finally:
            _SLURM_BOXES.remove(box)


def _slurm_build(tmp: Path) -> Provider:
    """The Slurm provider on the box, as a user configures it: the login host, user, key and
    known host key; the workdir on the shared filesystem; the cluster's Python (this one, with
    cloudtrain, as the node stack's venv would be)."""
    from cloudtrain.providers.slurm.provider import SlurmProvider

    box = _SLURM_BOXES[-1]
    options = {
        "host": box.login_ip, "user": box.user, "key": str(box.key),
        "known_hosts": str(box.known_hosts), "workdir": str(tmp / "shared"),
        "python": sys.executable, "partition": "gpu",
    }  # fmt: skip
    return SlurmProvider(ProviderConfig(name="slurm", options=options))


def _slurm_cleanup(provider: Provider) -> None:
    if _SLURM_BOXES:
        _SLURM_BOXES[-1].cancel_all()


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
    "aws": ProviderCase(
        name="aws",
        build=_aws_build,
        store_uri=lambda tmp: f"s3://cloudtrain-test-{uuid.uuid4().hex[:12]}/pfx",
        unavailable=lambda: None if moto_available() else "moto server mode is not installed",
        fixtures=("moto_server", "moto_public_images"),
    ),
    "gcp": ProviderCase(
        name="gcp",
        build=_gcp_build,
        store_uri=lambda tmp: f"gs://cloudtrain-test-{uuid.uuid4().hex[:12]}/pfx",
        fixtures=("gcp_cloud",),  # the GCE fake and the GCS emulator, env pointed at both
    ),
    "azure": ProviderCase(
        name="azure",
        build=_azure_build,
        store_uri=lambda tmp: f"az://devstoreaccount1/ct-test-{uuid.uuid4().hex[:12]}/pfx",
        fixtures=("azure_cloud",),  # the ARM fake and Azurite, env pointed at both
        put_headers=("x-ms-blob-type: BlockBlob",),  # Put Blob needs it (as on Azure)
    ),
    "slurm": ProviderCase(
        name="slurm",
        build=_slurm_build,
        store_uri=lambda tmp: f"slurm://{tmp / 'bucket'}",
        force_cleanup=_slurm_cleanup,
        fixtures=("slurm_box",),  # a real Slurm: login host, controller, three compute hosts
    ),
}


TEST_ONLY = ("memory",)  # providers the contract covers that are not registered (test doubles)
CONTRACT = tuple(sorted({*names(), *TEST_ONLY}))  # what the `provider` fixture runs over


def case_for(name: str) -> ProviderCase:
    """The ProviderCase of `name`; FAILS the test (never skips) for a registered provider
    without one, or a case of a provider that is neither registered nor test-only."""
    case = CASES.get(name)
    if case is None:
        pytest.fail(
            f"provider {name!r} is registered (cloudtrain.providers.names()) but has no "
            "ProviderCase in tests/providers/conftest.py: add one (providers/README.md)"
        )
    stray = sorted(set(CASES) - set(CONTRACT))
    if stray:
        pytest.fail(f"ProviderCase(s) {stray} name no registered or test-only provider")
    return case


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

    @property
    def compute(self) -> Compute:
        """The provider's compute; skips the test if the case's compute is not available yet."""
        reason = self.case.compute_unavailable()
        if reason:
            pytest.skip(f"{self.case.name}: {reason}")
        return self.provider.compute

    def run_id(self) -> str:
        """A fresh run id, torn down after the test."""
        run_id = f"ct{uuid.uuid4().hex[:10]}"
        self.run_ids.append(run_id)
        return run_id

    def teardown(self) -> None:
        errors: list[BaseException] = []
        if self.run_ids and self.case.compute_unavailable() is None:
            self._teardown_runs(self.provider.compute, errors)
        self.case.force_cleanup(self.provider)
        if errors:
            raise errors[0]

    def _teardown_runs(self, compute: Compute, errors: list[BaseException]) -> None:
        for run_id in self.run_ids:
            try:
                compute.delete_nodes(run_id)
                compute.delete_resources(compute.list_resources(run_id))
            except Exception as exc:  # keep cleaning the other runs, then report
                errors.append(exc)


@pytest.fixture(params=CONTRACT, ids=str)
def provider(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Harness]:
    """Each registered provider and each test-only one (`CONTRACT`), isolated in `tmp_path`,
    with every run it made torn down."""
    case = case_for(request.param)
    reason = case.unavailable()
    if reason:
        pytest.skip(f"{case.name}: {reason}")
    for name in case.fixtures:
        request.getfixturevalue(name)
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path / "home"))
    harness = Harness(case, case.build(tmp_path), case.store_uri(tmp_path))
    try:
        yield harness
    finally:
        harness.teardown()
