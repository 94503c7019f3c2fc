"""Issue 29 on the AWS box: a node's own credentials are refused, by the store itself, when
writing `control/stop`, `control/lease`, a journal entry under `ledger/` or another node's
status, and accepted for its own status.

The run is the real `cloudtrain run --detach --no-controller --provider aws` of a ticking
two-worker job on test_aws_in_a_box's box: each node VM takes its node role's credentials from
the box's metadata service (tests/fakes/imds_credentials_aws.py) and moto's S3 enforces the
role's policy (tests/fakes/s3_authorizer.py). The test takes worker-1's credentials exactly as
the node VM's boto3 does (botocore's default chain with the VM's environment, `node_env`).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError

from cloudtrain.jobs import protocol
from cloudtrain.state.journal import entry_key
from tests.e2e.test_aws_in_a_box import BUCKET, REGION, AwsBox, aws
from tests.fakes.imds_credentials_aws import node_s3

pytestmark = pytest.mark.e2e
__all__ = ["aws"]  # the fixture, for pytest


def _instance_of(box: AwsBox, run_id: str, node: str) -> dict[str, Any]:
    (inst,) = [
        i
        for i in box.instances()
        if i["State"]["Name"] == "running"
        and {"Key": "Name", "Value": f"ct-{run_id}-{node}"} in i.get("Tags", [])
    ]
    return inst


def _refused(call: Any) -> tuple[int, str]:
    with pytest.raises(ClientError) as info:
        call()
    return info.value.response["ResponseMetadata"]["HTTPStatusCode"], info.value.response["Error"][
        "Code"
    ]


def _assumed_roles() -> dict[str, str]:
    """Instance id (the session name) -> role name, of every AssumeRole moto's STS served."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.sts.models import sts_backends

    return {
        r.session_name: r.role_arn.rsplit("/", 1)[1]
        for r in sts_backends[DEFAULT_ACCOUNT_ID]["aws"].assumed_roles
    }


def test_a_nodes_credentials_are_refused_the_controllers_keys_and_a_peers(
    aws: AwsBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = aws.ct.tick_job("refused", epochs=120, seconds=0.5)
    proc = aws.run(
        "run", "--detach", "--no-controller", "--provider", "aws", "--region", REGION, str(job)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    (run_id,) = aws.ct.run_ids()
    aws.wait_for_node_line("worker-1", r"epoch 2/")  # the node runs, under its own role
    own = protocol.status_key(run_id, "worker-1")
    deadline = time.time() + 60
    while own not in aws.keys(protocol.run_prefix(run_id)) and time.time() < deadline:
        time.sleep(0.5)
    victim = _instance_of(aws, run_id, "worker-1")
    # the nodes wrote through their own roles' credentials (taken from the metadata service)
    assumed = _assumed_roles()
    for node in ("worker-0", "worker-1"):
        iid = _instance_of(aws, run_id, node)["InstanceId"]
        assert assumed.get(iid) == f"cloudtrain-{run_id}-{node}", (node, assumed)
    assert aws.imds is not None
    s3, creds = node_s3(aws.imds.url, victim["InstanceId"], monkeypatch, REGION)
    assert creds.method == "iam-role"
    # its own status: accepted (written back as it is)
    body = s3.get_object(Bucket=BUCKET, Key=own)["Body"].read()
    s3.put_object(Bucket=BUCKET, Key=own, Body=body)
    # the controller's documents and a peer's status: refused by the store
    forged = json.dumps({"forged": True}).encode()
    for key in (
        protocol.stop_key(run_id),
        protocol.lease_key(run_id),
        protocol.journal_prefix(run_id) + entry_key(time.time_ns(), 1, "node"),
        protocol.status_key(run_id, "worker-0"),
    ):
        put = lambda k=key: s3.put_object(Bucket=BUCKET, Key=k, Body=forged)  # noqa: E731
        assert _refused(put) == (403, "AccessDenied"), key
        assert _refused(lambda k=key: s3.delete_object(Bucket=BUCKET, Key=k))[0] == 403, key
    assert protocol.stop_key(run_id) not in aws.keys(protocol.run_prefix(run_id))
    down = aws.run("down", run_id)
    assert down.returncode == 0, down.stdout + down.stderr
    aws.assert_nothing_left(run_id)
