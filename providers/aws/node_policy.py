"""What the run's node role may do in the bucket: its one inline policy (`s3_policy`), pure.

Objects under the run's prefix and the listing of that prefix, nothing else; inside the prefix,
explicit Deny statements take the run's key (`control/key`) away altogether and every write of
the controller's documents (issue 29: the nodes run the user's code). `identity.py` puts it on
the role.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from cloudtrain.errors import ProviderError
from cloudtrain.jobs import protocol


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, key prefix ending in '/' or '') of an s3:// URI. Raises ProviderError. Pure."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ProviderError(
            f"the AWS provider needs an s3:// store URI, not {uri!r}",
            hint="set checkpoint: s3://BUCKET/PREFIX in job.yaml, or leave it out",
        )
    prefix = parsed.path.strip("/")
    return parsed.netloc, f"{prefix}/" if prefix else ""


# What a node does to its run's objects. A multipart upload's create, parts and completion are
# s3:PutObject, but resuming one lists its parts (ListParts: s3:ListMultipartUploadParts) and
# replacing a stale one aborts it (s3:AbortMultipartUpload): docs.aws.amazon.com/AmazonS3/latest/
# userguide/mpuoverview.html#mpuAndPermissions, and the Service Authorization Reference's S3
# actions (providers/aws/s3_transfers.py makes those calls).
NODE_OBJECT_ACTIONS = (
    "s3:GetObject",
    "s3:PutObject",
    "s3:DeleteObject",
    "s3:ListMultipartUploadParts",
    "s3:AbortMultipartUpload",
)


# What the nodes may not do to the controller's documents: every action that creates, replaces,
# tags or deletes an object or a part of its upload (`s3:PutObject*` covers PutObjectAcl,
# -Tagging, -Retention, -LegalHold; `s3:DeleteObject*` DeleteObjectVersion and the tagging
# deletes: the Service Authorization Reference's S3 actions, docs.aws.amazon.com/service-
# authorization/latest/reference/list_amazons3.html). Reading them stays allowed: the agent
# reads cluster.json, control/stop and control/lease (the chief's orphan check).
NODE_WRITE_ACTIONS = (
    "s3:PutObject*",
    "s3:DeleteObject*",
    "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts",
)


def controller_documents(run_id: str) -> list[str]:
    """The keys and key patterns (a trailing `*`: a folder) under the run's prefix that only a
    controller writes: the lease, stop, yield, launch document, cluster.json, the journal and
    the bundle (jobs/protocol.py's table; the run's key is `protocol.KEY_NAME`). Pure."""
    return [
        protocol.lease_key(run_id),
        protocol.stop_key(run_id),
        protocol.yield_key(run_id),
        protocol.launch_key(run_id),
        protocol.cluster_key(run_id),
        f"{protocol.journal_prefix(run_id)}*",
        f"{protocol.bundle_prefix(run_id)}*",
    ]


def s3_policy(store_uri: str, run_id: str) -> dict[str, Any]:
    """The inline policy: objects under the run's prefix only, listing of that prefix only; none
    of the run's key, no writes to the controller's documents (`controller_documents`). Pure.

    The Deny statements win over the Allow whatever else grants it: an explicit deny overrides
    any allow (IAM User Guide, docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_
    evaluation-logic.html and reference_policies_evaluation-logic_AccessPolicyLanguage_
    Interplay.html), and `*` in an object ARN matches across `/` (reference_policies_elements_
    resource.html). The rules are per run, not per node: any node may still write another
    node's status, heartbeat or logs, which needs one role per node (out of this slice)."""
    bucket, prefix = parse_s3_uri(store_uri)
    run_prefix = f"{prefix}{protocol.run_prefix(run_id)}"
    objects = f"arn:aws:s3:::{bucket}/{prefix}"
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "RunObjects",
                "Effect": "Allow",
                "Action": list(NODE_OBJECT_ACTIONS),
                "Resource": f"arn:aws:s3:::{bucket}/{run_prefix}*",
            },
            {
                "Sid": "ListRunPrefix",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": f"arn:aws:s3:::{bucket}",
                "Condition": {"StringLike": {"s3:prefix": f"{run_prefix}*"}},
            },
            {
                "Sid": "NoRunKey",
                "Effect": "Deny",
                "Action": "s3:*",
                "Resource": f"{objects}{protocol.run_prefix(run_id)}{protocol.KEY_NAME}",
            },
            {
                "Sid": "NoControllerWrites",
                "Effect": "Deny",
                "Action": list(NODE_WRITE_ACTIONS),
                "Resource": [f"{objects}{key}" for key in controller_documents(run_id)],
            },
        ],
    }
