"""The node role's S3 policy grants every action the node-side S3 code calls for.

moto does not enforce IAM, so a node that calls an S3 API its role does not allow works in the
box and fails on AWS (AccessDenied). This reads the S3 calls providers/aws/storage.py and
s3_transfers.py make and maps each to the IAM action AWS checks for it (the Service
Authorization Reference's S3 actions; for multipart uploads docs.aws.amazon.com/AmazonS3/latest/
userguide/mpuoverview.html#mpuAndPermissions). A call not in the map fails the test until it is
mapped, so a new call cannot slip past the policy."""

from __future__ import annotations

import re
from pathlib import Path

from cloudtrain.providers.aws.identity import s3_policy

AWS = Path(__file__).resolve().parents[4] / "providers" / "aws"
SOURCES = ("storage.py", "s3_transfers.py")
# S3 API call -> the IAM action it needs, for the calls on the run's objects (the nodes' too)
OBJECT_CALLS = {
    "put_object": "s3:PutObject",
    "get_object": "s3:GetObject",
    "head_object": "s3:GetObject",
    "delete_object": "s3:DeleteObject",
    "delete_objects": "s3:DeleteObject",  # checked per key
    "create_multipart_upload": "s3:PutObject",
    "upload_part": "s3:PutObject",
    "complete_multipart_upload": "s3:PutObject",
    "list_parts": "s3:ListMultipartUploadParts",
    "abort_multipart_upload": "s3:AbortMultipartUpload",
    "list_objects_v2": "s3:ListBucket",
}
# calls on the bucket itself: the controller's, with the user's credentials (ensure_bucket and
# the presigner); no node makes them
BUCKET_CALLS = {
    "create_bucket",
    "head_bucket",
    "get_waiter",
    "put_public_access_block",
    "put_bucket_encryption",
    "get_bucket_lifecycle_configuration",
    "put_bucket_lifecycle_configuration",
}


def _s3_calls() -> set[str]:
    calls: set[str] = set()
    for name in SOURCES:
        text = (AWS / name).read_text()
        calls |= set(re.findall(r"_s3\.(\w+)\(", text)) - {"get_paginator"}
        calls |= set(re.findall(r"_s3\.get_paginator\(\"(\w+)\"\)", text))
    return calls


def test_every_s3_call_is_known() -> None:
    calls = _s3_calls()
    assert {"put_object", "list_parts", "abort_multipart_upload"} <= calls  # the scan works
    assert calls <= OBJECT_CALLS.keys() | BUCKET_CALLS, calls - OBJECT_CALLS.keys() - BUCKET_CALLS


def test_the_node_role_allows_every_object_call_on_its_run_prefix() -> None:
    doc = s3_policy("s3://b/team", "r9", "worker-1", chief=False)
    granted: dict[str, list[str]] = {}
    for statement in doc["Statement"]:
        if statement["Effect"] == "Deny":  # test_aws_node_bucket_rights.py checks them per key
            continue
        actions, resources = statement["Action"], statement["Resource"]
        for action in [actions] if isinstance(actions, str) else actions:
            granted[action] = [resources] if isinstance(resources, str) else resources
    for call in sorted(_s3_calls() & OBJECT_CALLS.keys()):
        action = OBJECT_CALLS[call]
        assert action in granted, f"{call} needs {action}, which the node role lacks"
        want = "arn:aws:s3:::b" if action == "s3:ListBucket" else "arn:aws:s3:::b/team/"
        assert all(r.startswith(want) for r in granted[action]), (call, granted[action])
