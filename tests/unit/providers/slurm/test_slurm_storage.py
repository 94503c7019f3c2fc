"""providers/slurm/storage.py against a real Slurm (tests/fakes/slurm_box.py): the controller
reaches the bucket through the login host with the cluster's Python, a node sees the folder
itself, and both write by one set of rules: a conditional write is atomic against the other
side, a bounded read refuses what is larger (with the stamp that still lets it be replaced),
and a bad URI or a missing Python is one clear error."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.core.errors import NotFound, PreconditionFailed, ProviderError, TooLarge
from cloudtrain.providers.slurm.login import LoginHost
from cloudtrain.providers.slurm.storage import SlurmStore, folder_of, node_store, uri_of
from tests.fakes.slurm_box import SlurmBox, slurm_cluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmBox]:
    with slurm_cluster(tmp_path_factory, computes=1, gpus=0) as box:
        yield box


def login_of(box: SlurmBox) -> LoginHost:
    return LoginHost(box.login_ip, box.user, box.key, known_hosts=box.known_hosts)


def stores(box: SlurmBox, tmp_path: Path) -> tuple[SlurmStore, object]:
    uri = uri_of(str(tmp_path / "bucket"))
    controller = SlurmStore(uri, login_of(box), sys.executable)
    controller.ensure_bucket()
    return controller, node_store(uri)


def test_a_conditional_write_holds_against_the_nodes_writes(
    cluster: SlurmBox, tmp_path: Path
) -> None:
    controller, node = stores(cluster, tmp_path)
    first = controller.put_if("control/lease", b"controller 1", None)
    with pytest.raises(PreconditionFailed):
        controller.put_if("control/lease", b"controller again", None)  # it exists now
    # the node sees the controller's object and stamp, and takes it over with that stamp
    assert node.get_tagged("control/lease") == (b"controller 1", first)  # type: ignore[attr-defined]
    taken = node.put_if("control/lease", b"node", first)  # type: ignore[attr-defined]
    assert controller.get_tagged("control/lease") == (b"node", taken)
    with pytest.raises(PreconditionFailed):  # the controller's stamp is stale now
        controller.put_if("control/lease", b"controller 2", first)
    assert controller.put_if("control/lease", b"controller 2", taken) != taken
    assert controller.get("control/lease") == b"controller 2"
    assert controller.get_tagged("nothing/here") is None


def test_a_bounded_read_refuses_more_and_keeps_the_stamp(cluster: SlurmBox, tmp_path: Path) -> None:
    controller, node = stores(cluster, tmp_path)
    node.put("big", b"x" * 5000)  # type: ignore[attr-defined]
    assert controller.get("big", max_bytes=5000) == b"x" * 5000
    with pytest.raises(TooLarge):
        controller.get("big", max_bytes=4999)
    with pytest.raises(TooLarge) as caught:
        controller.get_tagged("big", max_bytes=100)
    stamp = caught.value.tag
    assert stamp is not None and stamp == node.get_tagged("big")[1]  # type: ignore[attr-defined]
    controller.put_if("big", b"small", stamp)  # a forged huge object can still be replaced
    assert node.get("big") == b"small"  # type: ignore[attr-defined]
    with pytest.raises(NotFound):
        controller.get("missing")


def test_a_symlink_in_the_bucket_is_no_object(cluster: SlurmBox, tmp_path: Path) -> None:
    controller, _ = stores(cluster, tmp_path)
    secret = tmp_path / "outside"
    secret.write_text("not the run's")
    (tmp_path / "bucket" / "link").symlink_to(secret)  # what a node's user code could plant
    with pytest.raises(NotFound):
        controller.get("link")
    assert [o.key for o in controller.list("")] == []


def test_bad_uris_and_a_missing_python_are_one_clear_error(
    cluster: SlurmBox, tmp_path: Path
) -> None:
    for bad in ("slurm://host/x", "slurm:///a/../b", "file:///x", "slurm:///x?y", "slurm://"):
        with pytest.raises(ProviderError, match="slurm:///PATH"):
            folder_of(bad)
    assert folder_of(uri_of("/scratch/ann/my bucket/")) == "/scratch/ann/my bucket"
    store = SlurmStore(uri_of(str(tmp_path / "b")), login_of(cluster), "python3.99")
    with pytest.raises(ProviderError) as caught:
        store.ensure_bucket()
    assert "`python3.99` is not on the login host's PATH" in str(caught.value)
