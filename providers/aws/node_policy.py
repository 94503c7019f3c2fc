"""What one node's role may do in the bucket: its one inline policy (`s3_policy`), pure.

Reads of the run's prefix and the listing of that prefix; writes of the node's own keys only
(`jobs/node_rights.py`, the chief's extra ones for the chief); explicit Deny statements take
the run's key (`control/key`) away altogether and every write of the controller's documents
(issue 29: the nodes run the user's code). `identity.py` puts it on the node's role.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from typing import Any

from cloudtrain.core.errors import ProviderError
from cloudtrain.jobs import node_rights, protocol
from cloudtrain.jobs.node_rights import KeyRule


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


# What a node writes of its own keys. A multipart upload's create, parts and completion are
# s3:PutObject, but resuming one lists its parts (ListParts: s3:ListMultipartUploadParts) and
# replacing a stale one aborts it (s3:AbortMultipartUpload): docs.aws.amazon.com/AmazonS3/latest/
# userguide/mpuoverview.html#mpuAndPermissions, and the Service Authorization Reference's S3
# actions (providers/aws/s3_transfers.py makes those calls).
NODE_WRITE_ALLOWED = (
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


def _object_arns(bucket: str, root: str, rules: Iterable[KeyRule]) -> list[str]:
    """Each rule below the store's root as an object ARN pattern (`*` crosses `/`). Pure."""
    return [f"arn:aws:s3:::{bucket}/{rule.under(root).wildcard()}" for rule in rules]


def s3_policy(store_uri: str, run_id: str, node: str, *, chief: bool) -> dict[str, Any]:
    """Node `node`'s inline policy: it reads every object under the run's prefix and lists that
    prefix; it writes and deletes only its own keys and, when `chief`, the chief's
    (`node_rights.node_writes`); never the run's key nor the controller's documents. Pure;
    raises ProviderError for a non-s3:// store URI.

    The Deny statements repeat what the Allows already leave out (belt and braces): an
    explicit deny overrides any allow (IAM User Guide, docs.aws.amazon.com/IAM/latest/
    UserGuide/reference_policies_evaluation-logic.html), and `*` in an object ARN matches any
    run of characters, `/` included (reference_policies_elements_resource.html), which is the
    `KeyRule.wildcard()` shape. ListBucket's `s3:prefix` condition: Service Authorization
    Reference, "Actions, resources, and condition keys for Amazon S3" (docs.aws.amazon.com/
    service-authorization/latest/reference/list_amazons3.html)."""
    bucket, prefix = parse_s3_uri(store_uri)
    run_prefix = f"{prefix}{protocol.run_prefix(run_id)}"
    writes = node_rights.node_writes(run_id, node, chief=chief)
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ReadRunObjects",
                "Effect": "Allow",
                "Action": "s3:GetObject",
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
                "Sid": "WriteOwnKeys",
                "Effect": "Allow",
                "Action": list(NODE_WRITE_ALLOWED),
                "Resource": _object_arns(bucket, prefix, writes),
            },
            {
                "Sid": "NoRunKey",
                "Effect": "Deny",
                "Action": "s3:*",
                "Resource": f"arn:aws:s3:::{bucket}/{run_prefix}{protocol.KEY_NAME}",
            },
            {
                "Sid": "NoControllerWrites",
                "Effect": "Deny",
                "Action": list(NODE_WRITE_ACTIONS),
                "Resource": _object_arns(bucket, prefix, node_rights.controller_rules(run_id)),
            },
        ],
    }
