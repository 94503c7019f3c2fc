"""The AWS box's wait for a node's line in the bucket (tests/e2e/test_aws_in_a_box.py) starts
before the run's bucket exists: the run's ledger row comes first, then `provision` creates the
bucket. Listing a bucket that does not exist yet is "no line yet", not an error (the clean-clone
CI failed test_preemption's AWS termination test once on NoSuchBucket there)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fakes.moto_server import moto_server, moto_server_session

boto3 = pytest.importorskip("boto3")

from tests.e2e.test_aws_in_a_box import BUCKET, REGION, AwsBox  # noqa: E402

__all__ = ["moto_server", "moto_server_session"]  # fixtures used by this module

pytestmark = pytest.mark.usefixtures("moto_server")


class _OneRun:
    """The box's Env as far as the wait reads it: one run in the ledger, no output."""

    def run_ids(self) -> list[str]:
        return ["digits-multiworker-0a1b2c"]

    def output(self) -> str:
        return ""


def test_waiting_before_the_bucket_exists_is_waiting() -> None:
    s3: Any = boto3.client("s3", region_name=REGION)
    box = AwsBox(ct=_OneRun(), harness=None, ec2=None, s3=s3, iam=None)  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match="not in worker-1's logs in time"):
        box.wait_for_node_line("worker-1", "^epoch", timeout=1.0)
    s3.create_bucket(Bucket=BUCKET)  # the run's bucket, then worker-1's first chunk
    key = "cloudtrain/runs/digits-multiworker-0a1b2c/logs/worker-1/000001.log"
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"starting\nepoch 1/2 done\n")
    assert box.wait_for_node_line("worker-1", r"^epoch (\d)", timeout=10.0)[1] == "1"
