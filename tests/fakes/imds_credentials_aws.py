"""EC2's instance-profile credentials on the box's metadata service (metadata_server.py): a node
VM's boto3 takes its own role's temporary credentials from there, as on EC2.

    creds = Ec2RoleCredentials(moto_url)
    creds.install(metadata_server)         # the VMs' metadata service
    Vm(..., env=node_env(metadata_server.url, instance_id))

The routes, as the EC2 User Guide states them ("Instance metadata categories",
docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-categories.html, and "IAM roles
for Amazon EC2", iam-roles-for-amazon-ec2.html#instance-metadata-security-credentials), IMDSv2
only (a GET without a valid session token gets 401, as the server's other EC2 paths):

- `GET /latest/meta-data/iam/security-credentials/` answers the name of the role in the
  instance's profile (404 when the instance has none);
- `GET /latest/meta-data/iam/security-credentials/<role>` answers JSON `Code` "Success",
  `LastUpdated`, `Type` "AWS-HMAC", `AccessKeyId`, `SecretAccessKey`, `Token`, `Expiration`,
  from moto STS's AssumeRole of that role (another name: 404);
- `GET /latest/meta-data/iam/info` answers `Code`, `LastUpdated`, `InstanceProfileArn`,
  `InstanceProfileId`.

The instance is the asker of the `/vm/<id>` path the harness hands each VM; its profile and role
are read from moto's EC2 and IAM at each request, so a VM's credentials follow its instance.
Credentials are reused until 20 minutes before they expire (EC2 rotates them ahead of expiry;
botocore refreshes 15 minutes ahead), then a new AssumeRole makes fresh ones.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from typing import Any

from tests.fakes.metadata_server import Answer, MetadataServer

CREDENTIALS_PATH = "/latest/meta-data/iam/security-credentials/"
INFO_PATH = "/latest/meta-data/iam/info"
DURATION_S = 3600
RENEW_BEFORE_S = 1200
# what a node VM's environment loses: the box's full-rights key, and the switch that keeps
# botocore off the metadata service (tests/fakes/moto_server.TEST_ENV)
DROPPED = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_EC2_METADATA_DISABLED",
)


def node_env(metadata_url: str, instance_id: str) -> dict[str, str | None]:
    """`Vm.env` of a node VM: no box credentials; botocore's instance-metadata provider asks
    the VM's own view of the metadata service (`<url>/vm/<id>/`: botocore appends
    `latest/api/token` and `latest/meta-data/iam/...` to AWS_EC2_METADATA_SERVICE_ENDPOINT,
    as it does to http://169.254.169.254/ on EC2). Pure."""
    env: dict[str, str | None] = dict.fromkeys(DROPPED)
    env["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = f"{metadata_url}/vm/{instance_id}/"
    return env


def node_s3(metadata_url: str, instance_id: str, monkeypatch: Any, region: str) -> tuple[Any, Any]:
    """(S3 client, botocore credentials) of a test, taken as the node VM's boto3 takes them:
    botocore's default chain in the VM's environment (`node_env`, set with `monkeypatch`, a
    pytest.MonkeyPatch), hence from the metadata service. Blocks for the metadata requests."""
    import boto3
    import botocore.session

    for name, value in node_env(metadata_url, instance_id).items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    session = botocore.session.Session()
    creds = session.get_credentials()
    client = boto3.session.Session(botocore_session=session).client("s3", region_name=region)
    return client, creds


def _iso(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Ec2RoleCredentials:
    """The identity routes of EC2's metadata service for the instances of a moto server.
    Thread-safe."""

    def __init__(self, endpoint_url: str, region: str = "us-east-1") -> None:
        import boto3

        # the box's own (account owner's) dummy key: the metadata service is the cloud's side
        session = boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name=region
        )
        self.ec2, self.iam, self.sts = (
            session.client(name, endpoint_url=endpoint_url) for name in ("ec2", "iam", "sts")
        )
        self._lock = threading.Lock()
        self._issued: dict[tuple[str, str], tuple[float, dict[str, str]]] = {}
        self._server: MetadataServer | None = None

    def install(self, server: MetadataServer) -> None:
        """Register the routes on `server` (its EC2 tokens are the ones checked)."""
        self._server = server
        server.add_route("/latest/meta-data/iam/", self.handle)

    def handle(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        headers: dict[str, str],
        asker: str,
        client: str,
    ) -> Answer | None:
        """One request of the routes (the module docstring); None: not one of them."""
        if method != "GET" or self._server is None:
            return None  # the server's EC2 handler answers 405
        if not self._server.ec2_token_valid(headers.get("x-aws-ec2-metadata-token", "")):
            return 401, {}, b"Unauthorized"
        profile = self._profile(asker)
        if profile is None or not profile.get("Roles"):
            return _not_found()
        role = profile["Roles"][0]
        if path == INFO_PATH:
            info = {
                "Code": "Success",
                "LastUpdated": _iso(datetime.now(timezone.utc)),
                "InstanceProfileArn": profile["Arn"],
                "InstanceProfileId": profile["InstanceProfileId"],
            }
            return 200, {"Content-Type": "text/plain"}, json.dumps(info, indent=2).encode()
        if path == CREDENTIALS_PATH:
            return 200, {"Content-Type": "text/plain"}, str(role["RoleName"]).encode()
        if path == CREDENTIALS_PATH + role["RoleName"]:
            body = self._credentials(asker, role["Arn"])
            return 200, {"Content-Type": "text/plain"}, json.dumps(body, indent=2).encode()
        return _not_found()

    def _profile(self, instance_id: str) -> dict[str, Any] | None:
        """The instance profile of `instance_id` as IAM holds it, or None."""
        if not instance_id:
            return None
        try:
            found = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        except self.ec2.exceptions.ClientError:
            return None
        instances = [i for r in found for i in r["Instances"]]
        arn = instances[0].get("IamInstanceProfile", {}).get("Arn") if instances else None
        if not arn:
            return None
        try:
            got = self.iam.get_instance_profile(InstanceProfileName=arn.rsplit("/", 1)[1])
        except self.iam.exceptions.NoSuchEntityException:
            return None
        return dict(got["InstanceProfile"])

    def _credentials(self, instance_id: str, role_arn: str) -> dict[str, str]:
        with self._lock:
            held = self._issued.get((instance_id, role_arn))
            if held is not None and held[0] - RENEW_BEFORE_S > time.time():
                return held[1]
        got = self.sts.assume_role(
            RoleArn=role_arn, RoleSessionName=instance_id, DurationSeconds=DURATION_S
        )["Credentials"]
        expires = got["Expiration"]
        body = {
            "Code": "Success",
            "LastUpdated": _iso(datetime.now(timezone.utc)),
            "Type": "AWS-HMAC",
            "AccessKeyId": got["AccessKeyId"],
            "SecretAccessKey": got["SecretAccessKey"],
            "Token": got["SessionToken"],
            "Expiration": _iso(expires),
        }
        with self._lock:
            self._issued[(instance_id, role_arn)] = (expires.timestamp(), body)
        return body


def _not_found() -> Answer:
    return 404, {"Content-Type": "text/html"}, b"<title>404 - Not Found</title>"
