"""A node's agent takes its role's credentials from EC2's metadata service through botocore,
whose default is one attempt with a 1 s timeout (AWS_METADATA_SERVICE_NUM_ATTEMPTS and
AWS_METADATA_SERVICE_TIMEOUT, both 1: docs.aws.amazon.com/sdkref/latest/guide/
feature-ec2-instance-metadata.html). One slow or throttled answer then left the agent with no
credentials at all, and the node failed the run (CI: a replacement worker's first bucket read,
"no AWS credentials found"). The environment the AWS adapter gives the agent waits longer."""

from __future__ import annotations

from typing import Any

import pytest

from cloudtrain.providers.aws.compute import AwsCompute
from cloudtrain.providers.base import NodeRequest, RunInfo
from tests.fakes.imds_credentials_aws import node_s3
from tests.fakes.moto_server import moto_server, moto_server_session
from tests.fakes.test_aws_store_refuses_nodes import REGION, RUN, box

__all__ = ["box", "moto_server", "moto_server_session"]  # fixtures, for pytest
SLOW_S = 1.5  # each answer of the metadata service, past botocore's 1 s default


def _agent_env() -> dict[str, str]:
    info = RunInfo(RUN, REGION, None, (2222, 2232), nodes=("worker-0",))
    request = NodeRequest(RUN, "worker", 0, "g4dn.xlarge", "#!/bin/bash\n", zone=None)
    return dict(AwsCompute(REGION).startup_blocks(info, request).env)


def _credentials(box: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    return node_s3(box["imds"].url, box["instance"], monkeypatch, REGION)[1]


def test_a_slow_metadata_service_still_gives_the_agent_its_roles_credentials(
    box: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in _agent_env().items():
        monkeypatch.setenv(name, value)
    box["imds"].delay_s = SLOW_S
    creds = _credentials(box, monkeypatch)
    assert creds is not None and creds.method == "iam-role"


def test_botocores_default_gives_up_on_the_same_service(
    box: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # what the agent had before: the same service, botocore's defaults
    for name in ("AWS_METADATA_SERVICE_NUM_ATTEMPTS", "AWS_METADATA_SERVICE_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    box["imds"].delay_s = SLOW_S
    assert _credentials(box, monkeypatch) is None
