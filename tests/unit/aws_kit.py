"""The shared kit of AwsCompute's unit tests against moto, in process (test_aws_compute.py,
test_aws_nodes.py): constants, helpers and the `aws` and `ct` fixtures. Not itself a test module:
the tests import what they use by name, the fixtures included (`aws` too, which `ct` requests).

`aws` runs each test inside `moto.mock_aws()` with throwaway credentials, the session caches
cleared, and the two public AMI SSM parameters seeded through moto's backend (moto refuses
`put_parameter` under `/aws/`). What moto does not do is simulated on the client: `hook`
registers a botocore event handler (errors raised from a `before-call` hook, DescribeInstances
answers rewritten in an `after-call` one) and `counter` records every call's parameters.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("boto3")
moto = pytest.importorskip("moto")

from botocore.exceptions import ClientError  # noqa: E402

from cloudtrain.core import retry  # noqa: E402
from cloudtrain.providers.aws import compute as compute_mod  # noqa: E402
from cloudtrain.providers.aws import images, network, zones  # noqa: E402
from cloudtrain.providers.aws.compute import AwsCompute  # noqa: E402
from cloudtrain.providers.base import NodeRequest, RunInfo  # noqa: E402

REGION = "us-east-1"
GPU_AMI = "ami-0a1b2c3d4e5f60001"
CPU_AMI = "ami-0a1b2c3d4e5f60002"
STORE = "s3://ct-test-bucket/team/a"
RUN = "r1"
GPU_IMAGE_PARAM = images.DLAMI_2204.ref
CPU_IMAGE_PARAM = images.UBUNTU_2204.ref


def _clear_caches() -> None:
    # the clients module keeps the cached clients:
    session_module = importlib.import_module("cloudtrain.providers.aws.clients")
    session_module.clear_clients()
    zones._zones.cache_clear()
    images.clear_image_cache()


def _seed_ssm(params: dict[str, str]) -> None:
    """Put parameters moto refuses through its API (`/aws/...`) into its backend directly."""
    from tests.fakes.moto_server import seed_ssm_parameter

    for name, value in params.items():
        seed_ssm_parameter(name, value, REGION)


@contextlib.contextmanager
def moto_world(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """moto in process, testing credentials, no endpoint overrides, caches cleared, the public
    AMI parameters seeded; undone on exit (what `monkeypatch` set, undone by its owner). For a
    fixture of any scope: `aws` below is one per test."""
    for key in list(os.environ):
        if key.startswith(("AWS_ENDPOINT_URL", "AWS_PROFILE")):
            monkeypatch.delenv(key)
    creds = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
    }
    for key, value in creds.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv(network.SSH_CIDR_ENV, raising=False)
    monkeypatch.setattr(retry, "BACKOFF_INITIAL_S", 0.001)
    monkeypatch.setattr(retry, "BACKOFF_MAX_S", 0.01)
    monkeypatch.setattr(compute_mod, "TERMINATE_POLL_S", 0.0)
    _clear_caches()
    try:
        with moto.mock_aws():
            _seed_ssm({GPU_IMAGE_PARAM: GPU_AMI, CPU_IMAGE_PARAM: CPU_AMI})
            yield
    finally:
        _clear_caches()


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """moto in process, testing credentials, no endpoint overrides, caches cleared."""
    with moto_world(monkeypatch, tmp_path):
        yield


@pytest.fixture
def ct(aws: None) -> AwsCompute:
    return AwsCompute(REGION)


# the run's nodes: every node a test here creates has its role (the adapter's ensure_network)
NODE_IDS = ("chief-0", "ps-0", "ps-1", "worker-0", "worker-1", "worker-2")
TWO_WORKERS = ("worker-0", "worker-1")  # a run whose chief is worker-0


def run_info(
    ssh: bool = False,
    zone: str | None = None,
    run_id: str = RUN,
    nodes: tuple[str, ...] = NODE_IDS,
) -> RunInfo:
    return RunInfo(run_id, REGION, zone, (2222, 2232), ssh=ssh, store_uri=STORE, nodes=nodes)


def request(
    role: str = "worker",
    index: int = 0,
    *,
    script: str = "#!/bin/bash\necho hello\n",
    gpus: int = 1,
    run_id: str = RUN,
    **kw: Any,
) -> NodeRequest:
    kw.setdefault("instance_type", "g5.xlarge" if gpus else "m5.large")
    return NodeRequest(
        run_id=run_id,
        role=role,
        index=index,
        startup_script=script,
        accelerator="A10G" if gpus else None,
        accelerator_count=gpus,
        **kw,
    )


def describe(ct: AwsCompute, instance_id: str) -> dict[str, Any]:
    answer = ct.ec2.describe_instances(InstanceIds=[instance_id])
    return answer["Reservations"][0]["Instances"][0]  # type: ignore[no-any-return]


def client_error(code: str, message: str = "simulated", status: int = 400) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "RunInstances",
    )


def hook(client: Any, event: str, fn: Callable[..., Any]) -> Callable[[], None]:
    """Register `fn` on the client's events; returns the unregister function."""
    client.meta.events.register(event, fn)
    return lambda: client.meta.events.unregister(event, fn)


def counter(client: Any, operation: str) -> list[dict[str, Any]]:
    """Every call's API parameters of `operation` on `client` (captured before serialization)."""
    calls: list[dict[str, Any]] = []
    service = client.meta.service_model.service_id.hyphenize()
    hook(
        client,
        f"before-parameter-build.{service}.{operation}",
        lambda params, **_: calls.append(dict(params)),
    )
    return calls


def ingress(ct: AwsCompute, group_id: str) -> list[dict[str, Any]]:
    groups = ct.ec2.describe_security_groups(GroupIds=[group_id])["SecurityGroups"]
    return groups[0]["IpPermissions"]  # type: ignore[no-any-return]


def policy_doc(raw: Any) -> dict[str, Any]:
    if isinstance(raw, str):
        return json.loads(urllib.parse.unquote(raw))  # type: ignore[no-any-return]
    return raw  # type: ignore[no-any-return]
