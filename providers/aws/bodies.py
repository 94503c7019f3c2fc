"""EC2 request bodies and their reading back: the `run_instances` parameters of a node, its
tags, its UserData and ClientToken, and a described instance -> Node. Pure; the calls are in
`compute` (AwsCompute).

EC2 limits named here: raw UserData of at most 16 KiB, so larger scripts are gzipped (cloud-init
unpacks them: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/user-data.html), and a
ClientToken of at most 64 ASCII characters
(https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-idempotency.html).
"""

from __future__ import annotations

import gzip
import hashlib
import json
from typing import Any

from cloudtrain.core.errors import ProviderError
from cloudtrain.jobs.protocol import node_id
from cloudtrain.providers.aws import network
from cloudtrain.providers.aws.identity import controller_name, node_name
from cloudtrain.providers.aws.network import TAG_INDEX, TAG_ROLE, TAG_RUN
from cloudtrain.providers.base import Node, NodeRequest, NodeState, parse_node_name

USER_DATA_GZIP_OVER = 14 * 1024  # larger scripts are gzipped (cloud-init unpacks them)
USER_DATA_MAX = 16 * 1024  # EC2's limit on raw user data
SPOT_INTERRUPTION = "Server.SpotInstanceTermination"
CONTROLLER_ROLE = "controller"  # the run's controller node (issue 17)


def user_data(script: str) -> bytes | str:
    """The UserData for a startup script: as is, or gzipped (deterministically) when larger
    than 14 KiB. boto3 base64-encodes it itself. Raises ProviderError past EC2's 16 KiB. Pure."""
    raw = script.encode()
    if len(raw) <= USER_DATA_GZIP_OVER:
        return script
    packed = gzip.compress(raw, compresslevel=9, mtime=0)
    if len(packed) > USER_DATA_MAX:
        raise ProviderError(
            f"the startup script is {len(packed)} bytes gzipped; EC2 allows {USER_DATA_MAX}",
            hint="keep job env values short; large files belong in the bundle",
        )
    return packed


def client_token(name: str, fingerprint: dict[str, Any]) -> str:
    """The ClientToken of a launch: the node name plus a hash of its parameters (startup script
    included), at most 64 characters. The same launch retried gets the same token. Pure."""
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]
    return f"{name[:47]}-{digest}"


def node_state(instance: dict[str, Any]) -> NodeState:
    """EC2 state -> NodeState; a spot instance AWS is taking back is 'preempted'."""
    name = str(instance.get("State", {}).get("Name", ""))
    if name in ("pending", "running"):
        return name  # type: ignore[return-value]
    if name in ("stopping", "stopped"):
        return "stopped"
    reason = str(instance.get("StateReason", {}).get("Code", ""))
    if instance.get("InstanceLifecycle") == "spot" and reason == SPOT_INTERRUPTION:
        return "preempted"
    return "terminated"


def to_node(instance: dict[str, Any]) -> Node | None:
    """A Node from a described instance, or None if its tags do not name a cloudtrain node."""
    tags = network.tag_dict(instance.get("Tags"))
    name = tags.get("Name", "")
    parsed = parse_node_name(name)
    if parsed is None or TAG_RUN not in tags:
        return None
    try:
        index = int(tags.get(TAG_INDEX, parsed[2]))
    except ValueError:
        index = parsed[2]
    return Node(
        name=name,
        run_id=tags[TAG_RUN],
        role=tags.get(TAG_ROLE, parsed[1]),
        index=index,
        state=node_state(instance),
        private_ip=instance.get("PrivateIpAddress"),
        public_ip=instance.get("PublicIpAddress"),
        spot=instance.get("InstanceLifecycle") == "spot",
        zone=instance.get("Placement", {}).get("AvailabilityZone"),
        instance_type=instance.get("InstanceType"),
        cloud_id=instance.get("InstanceId"),
    )


def node_tags(run_id: str, request: NodeRequest) -> list[dict[str, str]]:
    """The EC2 tags of a node and its root volume: the request's labels (never `aws:*`, which
    EC2 reserves), the run, role and index, and `Name`. Pure."""
    return network.tag_list(
        {
            **{k: v for k, v in request.labels.items() if not k.startswith("aws:")},
            TAG_RUN: run_id,
            TAG_ROLE: request.role,
            TAG_INDEX: str(request.index),
            "Name": request.name,
        }
    )


def launch_params(
    run_id: str,
    request: NodeRequest,
    image: str,
    group_id: str,
    zone: str | None,
    tags: list[dict[str, str]],
) -> dict[str, Any]:
    """The `run_instances` parameters of one node (no ClientToken: `client_token` derives it
    from these): IMDSv2 only, terminate on shutdown, a gp3 root volume deleted with the
    instance, its node's instance profile (`identity.node_name`, a replacement's too) and the
    run's security group, and spot as a one-time request
    when asked. The controller node (role `controller`) runs under the controller's instance
    profile (identity.controller_name), never the nodes', and is never spot. Pure; raises
    ProviderError for a startup script over EC2's UserData limit."""
    controller = request.role == CONTROLLER_ROLE
    params: dict[str, Any] = {
        "ImageId": image,
        "InstanceType": request.instance_type,
        "MinCount": 1,
        "MaxCount": 1,
        "UserData": user_data(request.startup_script),
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": tags},
            {"ResourceType": "volume", "Tags": tags},
        ],
        "InstanceInitiatedShutdownBehavior": "terminate",
        "MetadataOptions": {
            "HttpTokens": "required",
            "HttpEndpoint": "enabled",
            "HttpPutResponseHopLimit": 2,
        },
        "IamInstanceProfile": {
            "Name": controller_name(run_id)
            if controller
            else node_name(run_id, node_id(request.role, request.index))
        },
        "SecurityGroupIds": [group_id],
        "BlockDeviceMappings": [
            {
                "DeviceName": "/dev/sda1",
                "Ebs": {
                    "VolumeSize": request.disk_gb,
                    "VolumeType": "gp3",
                    "DeleteOnTermination": True,
                },
            }
        ],
    }
    if zone:
        params["Placement"] = {"AvailabilityZone": zone}
    if request.spot and not controller:
        params["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            },
        }
    return params
