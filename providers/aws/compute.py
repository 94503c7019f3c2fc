"""EC2 nodes for cloudtrain: `AwsCompute(region)`, the AWS side of the `Compute` interface.

A node is one EC2 instance, tagged `cloudtrain:run`, `cloudtrain:role`, `cloudtrain:index` and
`Name` (the node name), as is its root volume. The tags are the source of truth: `list_nodes` asks
EC2, never local state. Each run also owns a security group (`network`) and an IAM role with its
instance profile per node id of the run (`identity`: `cloudtrain-<run_id>-<node>`, a replacement
reuses its node's), the group named `cloudtrain-<run_id>`.

Idempotency of `create_node` has two layers: a live instance with the node's name is returned as
is, and `run_instances` carries a ClientToken derived from the name and the launch parameters
(startup script included), so a retried call never makes a second VM while a re-create after a
loss (new presigned URLs in the script) makes a new one. Instances shut themselves down at the
run's deadline; with InstanceInitiatedShutdownBehavior=terminate that deletes them.
"""

from __future__ import annotations

import hashlib
import threading
import time
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from cloudtrain.core.crashpoints import crash_point
from cloudtrain.core.errors import NotFound, ProviderError, TransientError
from cloudtrain.providers.aws import controller_identity, identity, network, node_policy
from cloudtrain.providers.aws.bodies import (
    CONTROLLER_ROLE,
    client_token,
    launch_params,
    node_state,
    node_tags,
    to_node,
)
from cloudtrain.providers.aws.clients import client
from cloudtrain.providers.aws.errors import aws_errors, error_code
from cloudtrain.providers.aws.identity import (
    KIND_CONTROLLER_PROFILE,
    KIND_CONTROLLER_ROLE,
    KIND_PROFILE,
    KIND_ROLE,
    controller_name,
    node_name,
)
from cloudtrain.providers.aws.images import image_for, resolve_ami
from cloudtrain.providers.aws.network import (
    KIND_GROUP,
    TAG_RUN,
    call,
    resource_name,
)
from cloudtrain.providers.aws.zones import zone_ids, zone_name
from cloudtrain.providers.base import (
    Compute,
    Node,
    NodeRequest,
    ProviderConfig,
    Resource,
    RunInfo,
    StartupBlocks,
    Tagged,
)
from cloudtrain.providers.ownership import Refusals
from cloudtrain.providers.startup_snippets import (
    METADATA_CURL,
    node_address,
    shutdown_at_deadline,
)

LISTED_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
TERMINATE_POLL_S = 1.0
TERMINATE_TIMEOUT_S = 600.0
TERMINATE_AGAIN_EVERY = 30  # polls between repeated terminate calls for stragglers
VENV_PYTHON = "/opt/cloudtrain/venv/bin/python"

# the node's private address: IMDSv2 (a session token first), EC2 User Guide "Instance metadata
# categories": local-ipv4
_METADATA = node_address(
    f'{METADATA_CURL} --retry-connrefused -H "X-aws-ec2-metadata-token: $imds_token" '
    "http://169.254.169.254/latest/meta-data/local-ipv4",
    "local-ipv4",
    prelude="""\
  imds_token="$(curl -fsS --connect-timeout 2 --max-time 10 --retry 5 --retry-delay 1 \\
    --retry-max-time 60 --retry-connrefused -X PUT \\
    http://169.254.169.254/latest/api/token \\
    -H "X-aws-ec2-metadata-token-ttl-seconds: 300")" ||
    fail "metadata: no IMDSv2 token from 169.254.169.254"
""",
)

_SELF_SHUTDOWN = shutdown_at_deadline(
    "InstanceInitiatedShutdownBehavior=terminate: this shutdown deletes the instance"
)


# The node's role credentials come from EC2's metadata service, which throttles per instance
# (docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html, "Query
# throttling": retry with backoff) and which botocore asks once, for 1 s, by default
# (AWS_METADATA_SERVICE_NUM_ATTEMPTS and _TIMEOUT, both 1: docs.aws.amazon.com/sdkref/latest/
# guide/feature-ec2-instance-metadata.html): one slow answer left the agent with no credentials
# and failed the run. 5 attempts of up to 3 s each.
IMDS_PATIENCE = {"AWS_METADATA_SERVICE_NUM_ATTEMPTS": "5", "AWS_METADATA_SERVICE_TIMEOUT": "3"}


def _profile_not_ready(exc: ClientError) -> bool:
    """An instance profile IAM has made but EC2 does not see yet (eventual consistency)."""
    message = str(exc.response.get("Error", {}).get("Message", "")).lower()
    return error_code(exc) == "InvalidParameterValue" and (
        "iaminstanceprofile" in message or "instance profile" in message
    )


class AwsCompute(Compute):
    """EC2 instances, one security group and one IAM role + instance profile per run, in one
    region. Thread-safe: the base class fans `create_node` out over a thread pool."""

    provider_name = "aws"
    # every instance is launched with InstanceInitiatedShutdownBehavior=terminate (bodies.py;
    # EC2 API reference, RunInstances): a power-off from inside deletes it
    deletes_on_power_off = True

    def __init__(self, region: str, config: ProviderConfig | None = None) -> None:
        self.region = region
        # the options (ssh_cidr); none: the deprecated variables
        self.config = config or ProviderConfig(name="aws")
        self._lock = threading.Lock()
        self._clients: dict[str, Any] = {}
        self._groups: dict[str, str] = {}  # run_id -> security group id

    # -- clients ---------------------------------------------------------------------------

    def _client(self, service: str) -> Any:
        with self._lock:  # creating clients is not thread-safe; using them is
            if service not in self._clients:
                self._clients[service] = client(service, self.region)
            return self._clients[service]

    @property
    def ec2(self) -> Any:
        """The EC2 client (created on first use)."""
        return self._client("ec2")

    @property
    def iam(self) -> Any:
        """The IAM client (created on first use)."""
        return self._client("iam")

    @property
    def ssm(self) -> Any:
        """The SSM client (created on first use), for public AMI parameters."""
        return self._client("ssm")

    # -- network and identity --------------------------------------------------------------

    def planned_network(self, run: RunInfo) -> list[Resource]:
        """The security group, and each node's IAM role and instance profile (`run.nodes`),
        that `ensure_network` makes. Pure."""
        group = Resource("aws", KIND_GROUP, resource_name(run.run_id), self.region, run.run_id)
        return [group] + [
            Resource("aws", kind, node_name(run.run_id, node), self.region, run.run_id)
            for node in run.nodes
            for kind in (KIND_ROLE, KIND_PROFILE)
        ]

    def ensure_network(self, run: RunInfo) -> list[Resource]:
        """The run's security group (port range from itself only, SSH from the `ssh_cidr` option
        if asked), and for each node id of `run.nodes` its IAM role, limited to the node's own
        keys in the run's S3 prefix, and the role's instance profile. Idempotent; blocks until
        created (IAM may still take seconds to reach EC2: `create_node` retries that). Raises
        ProviderError for a run without nodes or a non-s3:// store, before any create."""
        cidr = self.config.option("ssh_cidr")
        network.ingress_rules("sg-0", run, cidr)  # a bad port range or SSH CIDR fails before any
        node_policy.parse_s3_uri(run.store_uri)  # create, as does a non-s3:// store
        made = identity.ensure_identities(self.iam, run.run_id, run.store_uri, run.nodes)
        group_id = network.ensure_security_group(self.ec2, self.region, run, cidr)
        with self._lock:
            self._groups[run.run_id] = group_id
        group = resource_name(run.run_id)
        out = [Resource("aws", KIND_GROUP, group, self.region, run.run_id, group_id)]
        for node in run.nodes:
            name = node_name(run.run_id, node)
            role_arn, profile_arn = made[node]
            out.append(Resource("aws", KIND_ROLE, name, self.region, run.run_id, role_arn))
            out.append(Resource("aws", KIND_PROFILE, name, self.region, run.run_id, profile_arn))
        return out

    def planned_controller_identity(self, run: RunInfo) -> list[Resource]:
        """The controller node's IAM role and instance profile (`cloudtrain-<run>-controller`,
        kinds controller-role and controller-instance-profile). Pure."""
        name = controller_name(run.run_id)
        return [
            Resource("aws", kind, name, self.region, run.run_id)
            for kind in (KIND_CONTROLLER_ROLE, KIND_CONTROLLER_PROFILE)
        ]

    def ensure_controller_identity(self, run: RunInfo) -> list[Resource]:
        """The controller node's role, scoped to this run (controller_identity.py), and its
        instance profile. Needs `ensure_network` first (the node roles it may pass). Idempotent;
        blocks until created (EC2 may not see the profile for seconds: `create_node` retries)."""
        role, profile = controller_identity.ensure_controller_identity(
            self.iam, run.run_id, run.store_uri, self.region, run.nodes
        )
        name = controller_name(run.run_id)
        return [
            Resource("aws", KIND_CONTROLLER_ROLE, name, self.region, run.run_id, role),
            Resource("aws", KIND_CONTROLLER_PROFILE, name, self.region, run.run_id, profile),
        ]

    def _group_id(self, run_id: str) -> str:
        with self._lock:
            cached = self._groups.get(run_id)
        if cached:
            return cached
        found = network.security_group_id(self.ec2, run_id)
        if found is None:
            raise ProviderError(
                f"run {run_id} has no security group {resource_name(run_id)}",
                hint="ensure_network must run before create_node",
            )
        with self._lock:
            self._groups[run_id] = found
        return found

    def list_resources(self, run_id: str) -> list[Resource]:
        """The run's security groups (by tag), its nodes' roles and instance profiles (by the
        run's IAM path) and its controller node's (by name); `delete_resources` checks their
        tags. Blocks."""
        return network.group_resources(self.ec2, self.region, run_id) + (
            identity.identity_resources(self.iam, self.region, run_id)
        )

    def delete_resources(self, resources: list[Resource]) -> None:
        """Delete instance profiles (roles removed first), then roles (policies first), then
        security groups. Idempotent: missing ones are fine; other kinds are ignored. Blocks; a
        group still in use raises TransientError after a bounded wait. Each is checked to be
        its run's first (name and tag, read from the cloud): NotTheRuns, after the others are
        deleted, names what was refused (cloudtrain/providers/ownership.py)."""
        refusals = Refusals()
        identity.delete_identity(self.iam, resources, refusals)
        for res in resources:
            if res.kind == network.KIND_GROUP:
                why = self._group_not_runs(res)
                if why is not None:
                    refusals.refuse(res, why)
                    continue
                network.delete_group_resource(self.ec2, res)
                with self._lock:
                    self._groups.pop(res.run_id, None)
        refusals.check()

    def _group_not_runs(self, res: Resource) -> str | None:
        """Why the security group `res` is not its run's, or None when it is (or is gone): its
        name must be `cloudtrain-<run>` and, for a recorded cloud id, the group must carry the
        run's tag (a forged record may name any group's id). Blocks for one describe."""
        if not res.run_id or res.id != network.resource_name(res.run_id):
            return f"not the run's name ({network.resource_name(res.run_id)!r} expected)"
        if not res.cloud_id:
            return None  # deleted by name and the run's tag only (delete_group_resource)
        try:
            with aws_errors(f"read security group {res.cloud_id}"):
                found = self.ec2.describe_security_groups(GroupIds=[res.cloud_id])
        except NotFound:
            return None
        for group in found.get("SecurityGroups", []):
            tagged = network.tag_dict(group.get("Tags")).get(network.TAG_RUN)
            if tagged != res.run_id or group.get("GroupName") != res.id:
                return f"group {res.cloud_id} is {group.get('GroupName')!r}, tagged {tagged!r}"
        return None

    # -- images ----------------------------------------------------------------------------

    def resolve_image(self, request: NodeRequest) -> str:
        """The AMI id a node boots: `images.image_for` picks the image, its public SSM parameter
        names the AMI (cached per process). Blocks once. Raises ProviderError for an unknown
        image name, or naming the parameter when the region lacks it."""
        if request.role == CONTROLLER_ROLE:  # the controller: the default CPU image, always
            image = image_for(request.instance_type, False, None)
        else:
            image = image_for(request.instance_type, request.accelerator_count > 0, request.image)
        return resolve_ami(self.ssm, self.region, image)

    # -- nodes -----------------------------------------------------------------------------

    def _describe(self, filters: list[dict[str, Any]], what: str) -> list[dict[str, Any]]:
        with aws_errors(what):
            pages = self.ec2.get_paginator("describe_instances").paginate(Filters=filters)
            return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]

    def _nodes(self, run_id: str, name: str | None = None) -> list[Node]:
        filters = [
            {"Name": f"tag:{TAG_RUN}", "Values": [run_id]},
            {"Name": "instance-state-name", "Values": LISTED_STATES},
        ]
        if name is not None:
            filters.append({"Name": "tag:Name", "Values": [name]})
        nodes = [
            n for i in self._describe(filters, f"list nodes of run {run_id}") if (n := to_node(i))
        ]
        # a name may have a dying instance and its replacement: the live one comes last, so
        # `{n.name: n for n in nodes}` keeps it
        return sorted(nodes, key=lambda n: (n.name, n.alive))

    def list_nodes(self, run_id: str) -> list[Node]:
        """The run's instances by tag, terminated ones excluded (shutting-down ones are listed
        as terminated or preempted, stopped ones as stopped). Blocks."""
        return self._nodes(run_id)

    def inventory(self) -> list[Tagged]:
        """Every instance in this region tagged `cloudtrain:run` and not terminated (with its
        LaunchTime), every security group so tagged, and the account's cloudtrain IAM roles and
        instance profiles (global: region None, with their CreateDate), of every run. Blocks;
        read-only."""
        filters = [
            {"Name": "tag-key", "Values": [TAG_RUN]},
            {"Name": "instance-state-name", "Values": LISTED_STATES},
        ]
        out: list[Tagged] = []
        for inst in self._describe(filters, f"list cloudtrain's instances in {self.region}"):
            node = to_node(inst)
            if node is None:
                continue
            launched = inst.get("LaunchTime")
            out.append(
                Tagged(
                    node.run_id,
                    "node",
                    node.name,
                    launched.timestamp() if isinstance(launched, datetime) else None,
                    node.instance_type,
                    self.region,
                )
            )
        out += network.tagged_groups(self.ec2, self.region)
        return out + identity.tagged_identities(self.iam)

    def prepare_nodes(self, run: RunInfo, requests: list[NodeRequest]) -> None:
        """Resolve what all requests share (zone names, AMIs, the group id) once, into the
        caches `create_node` reads, before `create_nodes` fans out. Not retried here (the retry
        layer, providers/retrying.py, retries this call as a whole). Idempotent; blocks."""
        for wanted in {r.zone or run.zone for r in requests}:
            zone_name(self.region, wanted)
        for r in requests:
            self.resolve_image(r)
        self._group_id(run.run_id)

    def create_node(self, run: RunInfo, request: NodeRequest) -> Node:
        """Launch one instance (one `run_instances` call), unless a live one with the node's name
        exists: then that one is returned. Idempotent per name (and the ClientToken makes a
        retried call return the same instance). Does not wait for boot. Raises NoCapacityError
        (with the zone), QuotaError (naming the quota), TransientError while IAM propagates."""
        live = [n for n in self._nodes(run.run_id, request.name) if n.alive]
        if live:
            return live[-1]
        wanted = request.zone or run.zone  # the catalog's naming: a zone ID or a zone name
        zone = zone_name(self.region, wanted)
        image = self.resolve_image(request)
        group_id = self._group_id(run.run_id)
        tags = node_tags(run.run_id, request)
        params = launch_params(run.run_id, request, image, group_id, zone, tags)
        fingerprint = {k: v for k, v in params.items() if k != "UserData"}
        fingerprint["script"] = hashlib.sha256(request.startup_script.encode()).hexdigest()
        params["ClientToken"] = client_token(request.name, fingerprint)
        where = zone if zone == wanted else f"{zone} ({wanted})"
        what = f"create instance {request.name} ({request.instance_type}) in {where or self.region}"
        instance = self._launch(params, what, wanted)
        if node_state(instance) not in ("pending", "running"):
            # the token matched an earlier launch whose instance is gone: launch afresh
            params["ClientToken"] = client_token(request.name, {**fingerprint, "t": time.time_ns()})
            instance = self._launch(params, what, wanted)
        node = to_node({**instance, "Tags": tags})
        assert node is not None  # the tags above name a node
        return node

    def _launch(self, params: dict[str, Any], what: str, zone: str | None) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            try:
                return self.ec2.run_instances(**params)["Instances"][0]  # type: ignore[no-any-return]
            except ClientError as exc:
                if _profile_not_ready(exc):
                    raise TransientError(
                        f"{what}: the instance profile is not visible to EC2 yet"
                    ) from exc
                raise

        with aws_errors(what, zone=zone):
            return run()

    def delete_node(self, node: Node) -> None:
        """Terminate one instance and wait until it is terminated. Idempotent; blocks."""
        self.delete_listed([node])

    def delete_listed(self, nodes: list[Node]) -> None:
        """Terminate every listed instance in one call (stopped ones too), then wait until all
        are terminated (polling every second, at most TERMINATE_TIMEOUT_S). Idempotent: gone
        instances are fine. A transient error propagates: the retry layer (providers/retrying.py)
        retries this whole call, which terminates again and waits afresh. Blocks."""
        ids = sorted({n.cloud_id for n in nodes if n.cloud_id})
        for node in nodes:
            if not node.cloud_id:  # not from a listing: find it by name
                ids.extend(n.cloud_id for n in self._nodes(node.run_id, node.name) if n.cloud_id)
        ids = sorted(set(ids))
        if not ids:
            return
        self._terminate(ids)
        crash_point("teardown-half")  # the terminations are requested, not yet confirmed
        deadline = time.monotonic() + TERMINATE_TIMEOUT_S
        polls = 0
        # Not a retry of the delete: EC2 is eventually consistent, and an accepted terminate
        # leaves the instance `shutting-down` for a while (minutes for a GPU instance). We poll
        # until every instance reports `terminated`, so `delete_node` returns only once it is.
        while True:
            states = self._states(ids)
            left = {i: s for i, s in states.items() if s != "terminated"}
            if not left:
                return
            if time.monotonic() >= deadline:
                raise ProviderError(
                    f"instances still not terminated after {TERMINATE_TIMEOUT_S:.0f}s: "
                    + ", ".join(f"{i} ({s})" for i, s in sorted(left.items())),
                    hint="run `cloudtrain down RUN` again",
                )
            polls += 1
            if polls % TERMINATE_AGAIN_EVERY == 0:
                # part of the same wait: an instance still `pending`/`running` long after its
                # terminate was accepted (a terminate that raced its launch) is asked again
                stragglers = sorted(i for i, s in left.items() if s != "shutting-down")
                if stragglers:
                    self._terminate(stragglers)
            time.sleep(TERMINATE_POLL_S)

    def _states(self, ids: list[str]) -> dict[str, str]:
        """Instance id -> EC2 state name; ids EC2 no longer knows are absent. Blocks."""
        out: dict[str, str] = {}
        for start in range(0, len(ids), 200):
            chunk = ids[start : start + 200]
            filters = [{"Name": "instance-id", "Values": chunk}]
            for inst in self._describe(filters, f"describe {len(chunk)} instance(s)"):
                out[inst["InstanceId"]] = inst["State"]["Name"]
        return out

    def _terminate(self, ids: list[str]) -> None:
        """terminate_instances in chunks; an unknown id is fine (then each is tried alone)."""
        gone = {"InvalidInstanceID.NotFound"}
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            what = f"terminate instances {', '.join(chunk[:3])}{'...' if len(chunk) > 3 else ''}"
            done = call(
                what, lambda chunk=chunk: self.ec2.terminate_instances(InstanceIds=chunk), ok=gone
            )
            if done is None and len(chunk) > 1:  # one unknown id fails the whole call
                for one in chunk:
                    call(
                        f"terminate instance {one}",
                        lambda one=one: self.ec2.terminate_instances(InstanceIds=[one]),
                        ok=gone,
                    )

    def console_output(self, node: Node) -> str:
        """The instance's latest serial console output ('' if none or the instance is gone).
        Best effort; blocks."""
        if not node.cloud_id:
            return ""
        iid = node.cloud_id
        what = f"read the console of {node.name} ({iid})"
        # `Latest` (the live buffer) exists on Nitro instances only; older ones refuse it
        answer = call(
            what,
            lambda: self.ec2.get_console_output(InstanceId=iid, Latest=True),
            ok={"InvalidInstanceID.NotFound", "UnsupportedOperation", "InvalidParameterValue"},
        ) or call(
            what,
            lambda: self.ec2.get_console_output(InstanceId=iid),
            ok={"InvalidInstanceID.NotFound"},
        )
        output = (answer or {}).get("Output") or ""
        if isinstance(output, bytes):
            output = output.decode(errors="replace")
        return str(output)

    def zones(self) -> list[str]:
        """The region's available zone IDs (the catalog's naming), for capacity failover."""
        return zone_ids(self.region)

    def startup_blocks(self, run: RunInfo, request: NodeRequest) -> StartupBlocks:
        """A venv Python (created by the script if the stack is missing), the address from
        IMDSv2 (unless CLOUDTRAIN_NODE_HOST is set), a `shutdown -h` at the deadline (which
        terminates the instance), and power-off when the agent exits; the agent's botocore
        patient with the metadata service its credentials come from (IMDS_PATIENCE). Pure."""
        return StartupBlocks(
            python=VENV_PYTHON,
            metadata=_METADATA,
            self_shutdown=_SELF_SHUTDOWN,
            env={"AWS_DEFAULT_REGION": self.region, **IMDS_PATIENCE},
            install_stack=True,
            power_off="shutdown -h now",
        )
