"""providers/slurm/stack.py against a real Slurm box's login host: the node stack is one venv per
pin set on the shared filesystem, built once (a second run finds it, two at once make one),
holding its own copy of the run's cloudtrain wheel over the cluster's Python; a pin set that
cannot be installed (the box has no package index) fails with pip's words and leaves nothing.

The cluster's Python is this interpreter (it has the pinned TensorFlow: the site-module case);
the wheel is the one a real bundle holds (tests/fakes/bootstrap_shims.py make_bundle)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.base import NodeStack
from cloudtrain.providers.slurm.login import LoginHost
from cloudtrain.providers.slurm.stack import STACK_DIR, ensure_stack, stack_tag, wheel_of
from cloudtrain.run.bundle import Bundle
from cloudtrain.run.startup import TF_KERAS_VERSION, TF_VERSION
from tests.fakes.bootstrap_shims import make_bundle
from tests.fakes.slurm_box import SlurmBox, slurm_cluster

pytestmark = pytest.mark.timeout(300)
PINS = (f"tensorflow[and-cuda]=={TF_VERSION}", f"tf-keras=={TF_KERAS_VERSION}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmBox]:
    with slurm_cluster(tmp_path_factory) as box:
        yield box


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return make_bundle(tmp_path_factory.mktemp("bundle"))


@pytest.fixture
def login(cluster: SlurmBox) -> LoginHost:
    return LoginHost(cluster.login_ip, cluster.user, cluster.key, known_hosts=cluster.known_hosts)


def node_stack(bundle: Bundle, pins: tuple[str, ...] = PINS, extra: str = "") -> NodeStack:
    return NodeStack(pins, str(bundle.path), bundle.wheel_name, extra)


def entries(workdir: Path) -> list[str]:
    return sorted(p.name for p in (workdir / STACK_DIR).iterdir())


def test_built_once_then_found_by_every_later_run(
    cluster: SlurmBox, login: LoginHost, bundle: Bundle, tmp_path: Path
) -> None:
    workdir = tmp_path / "shared"
    python = ensure_stack(login, str(workdir), sys.executable, node_stack(bundle))
    tag = stack_tag(sys.executable, PINS, wheel_of(node_stack(bundle)))
    assert python == f"{workdir}/{STACK_DIR}/{tag}/bin/python"
    assert entries(workdir) == [tag], "one venv, no build folder left"
    complete = workdir / STACK_DIR / tag / ".complete"
    made = complete.stat().st_mtime_ns
    # what the nodes run: the venv's own cloudtrain (the wheel, not this checkout) over the
    # cluster's TensorFlow
    facts = cluster.ssh(
        python,
        "-c",
        "import cloudtrain, tensorflow as tf; print(cloudtrain.__file__, tf.__version__)",
    ).split()
    assert facts[0].startswith(f"{workdir}/{STACK_DIR}/{tag}/lib/"), facts
    assert facts[1] == TF_VERSION
    # a later run: the same venv, untouched
    assert ensure_stack(login, str(workdir), sys.executable, node_stack(bundle)) == python
    assert complete.stat().st_mtime_ns == made
    assert entries(workdir) == [tag]


def test_two_runs_building_at_once_make_one_venv(
    login: LoginHost, bundle: Bundle, tmp_path: Path
) -> None:
    workdir = tmp_path / "shared"
    answers: list[str] = []
    errors: list[BaseException] = []

    def build() -> None:
        try:
            answers.append(ensure_stack(login, str(workdir), sys.executable, node_stack(bundle)))
        except BaseException as exc:  # shown by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    assert not errors, errors
    assert len(answers) == 2 and answers[0] == answers[1]
    assert len(entries(workdir)) == 1, entries(workdir)


def test_another_pin_set_is_another_venv(login: LoginHost, bundle: Bundle, tmp_path: Path) -> None:
    workdir = tmp_path / "shared"
    gpu = ensure_stack(login, str(workdir), sys.executable, node_stack(bundle))
    cpu_pins = (f"tensorflow=={TF_VERSION}", f"tf-keras=={TF_KERAS_VERSION}")
    cpu = ensure_stack(login, str(workdir), sys.executable, node_stack(bundle, cpu_pins))
    assert gpu != cpu
    assert len(entries(workdir)) == 2


def test_a_bucket_in_s3_is_another_venv_whose_nodes_open_it(
    cluster: SlurmBox, login: LoginHost, bundle: Bundle, tmp_path: Path
) -> None:
    workdir = tmp_path / "shared"
    plain = ensure_stack(login, str(workdir), sys.executable, node_stack(bundle))
    aws = ensure_stack(login, str(workdir), sys.executable, node_stack(bundle, extra="aws"))
    assert plain != aws and len(entries(workdir)) == 2
    # what a node does with an s3:// URI: the store by its scheme, boto3 loaded
    opened = cluster.ssh(
        "env", "AWS_DEFAULT_REGION=eu-west-1", aws, "-c",
        "from cloudtrain.providers import open_store; print(open_store('s3://bkt-1').uri)",
    )  # fmt: skip
    assert opened.strip().endswith("s3://bkt-1"), opened
    with pytest.raises(ProviderError, match="not a pip extra's name"):
        ensure_stack(login, str(workdir), sys.executable, node_stack(bundle, extra="aws] x"))
    assert len(entries(workdir)) == 2


def test_pins_the_cluster_cannot_install_fail_with_pips_words_and_leave_nothing(
    login: LoginHost, bundle: Bundle, tmp_path: Path
) -> None:
    workdir = tmp_path / "shared"
    pins = ("tensorflow==0.0.1",)  # not what this Python has: pip must fetch it, with no index
    with pytest.raises(ProviderError) as caught:
        ensure_stack(login, str(workdir), sys.executable, node_stack(bundle, pins))
    message = str(caught.value)
    assert "building the node stack (tensorflow==0.0.1)" in message
    assert "tensorflow==0.0.1" in message.split(")", 1)[1], message  # pip's own line
    assert entries(workdir) == [], "no venv and no build folder"


def test_a_python_the_cluster_lacks_is_named(
    login: LoginHost, bundle: Bundle, tmp_path: Path
) -> None:
    workdir = tmp_path / "shared"
    with pytest.raises(ProviderError, match=r"the cluster has no python2\.9"):
        ensure_stack(login, str(workdir), "python2.9", node_stack(bundle))
    assert entries(workdir) == []
