"""moto in server mode for tests: one in-process HTTP server per session, reset before each test.

    from tests.fakes.moto_server import moto_server, moto_server_session  # noqa: F401

makes the `moto_server` fixture available in a test module or conftest. For the duration of a
test it points every boto3 client of the test process (and of subprocesses that inherit its
environment, e.g. nodes run by a boot harness) at the server: AWS_ENDPOINT_URL, dummy
credentials, AWS_DEFAULT_REGION=us-east-1, no profile or config files, no instance metadata. The
cached boto3 sessions and account id of `cloudtrain.providers.aws.clients` are cleared around
each test, so no client outlives its environment. Without moto installed the fixture skips.

moto lacks AWS's public SSM parameters (the AMI ids of the Deep Learning and Ubuntu images) and
refuses `put_parameter` under `/aws/`: `seed_ssm_parameter` writes one through moto's backend, and
the `moto_public_images` fixture seeds the image parameters cloudtrain resolves.

S3 decides a conditional PutObject (If-Match / If-None-Match: *) atomically; moto 5.2 checks the
condition and then writes, unlocked, in the server's request threads, so two racing writers can
both win (and a GET racing an overwrite can crash on the replaced object's closed buffer).
`start_moto` therefore serializes moto's object-level requests (`install_atomic_s3_objects`).

S3 enforces identity policies; moto does not. `start_moto` puts tests/fakes/s3_authorizer.py's
`S3Authorizer` in front of moto's application: an S3 request signed with credentials from
moto's STS AssumeRole (a node's, from its metadata service) is authenticated and authorized
against its role's policies, refused with S3's 403 AccessDenied; the box's own dummy key passes
unchanged. `MotoServer.authorizer.refused` lists the refusals.

AWS accounts are stingy; moto's is not. Before both, `start_moto` puts tests/fakes/aws_front.py's
`AccountFront`: EC2's vCPU quotas (Service Quotas, VcpuLimitExceeded), sold-out zones
(InsufficientInstanceCapacity), and callers whose rights are checked (IAM users made in moto, the
box's key narrowed by `deny`), with IAM's policy simulator answering from the same policies.
`MotoServer.account` (tests/fakes/aws_account.py) sets them; untouched, every run fits.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

HOST = "127.0.0.1"
_S3_OBJECT_LOCK = threading.RLock()
# AWS's public AMI parameters, written here from AWS's sources, not from cloudtrain's code (a
# name the adapter gets wrong must then fail as it would on AWS, with ParameterNotFound):
# - DLAMI: /aws/service/deeplearning/ami/<arch>/<DLAMI name minus "Deep", "Learning", "AMI">/
#   latest/ami-id (docs.aws.amazon.com/dlami/latest/devguide/find-dlami-id.html), for "Deep
#   Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04|24.04)" (DLAMI release notes);
# - Ubuntu: Canonical's /aws/service/canonical/ubuntu/server/<release>/stable/current/...
PUBLIC_IMAGE_PARAMS = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id",
    "/aws/service/canonical/ubuntu/server/22.04/stable/current/amd64/hvm/ebs-gp2/ami-id",
    "/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id",
)
NO_FILE = "/nonexistent/cloudtrain-tests/aws"  # botocore skips missing config/credential files
TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": f"{NO_FILE}/config",
    "AWS_SHARED_CREDENTIALS_FILE": f"{NO_FILE}/credentials",
    "AWS_EC2_METADATA_DISABLED": "true",
}
# Anything that could take precedence over AWS_ENDPOINT_URL or the dummy credentials.
CLEARED_ENV = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_REGION",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


@dataclass
class MotoServer:
    """A running moto server on a free loopback port."""

    server: Any  # moto.server.ThreadedMotoServer
    url: str
    authorizer: Any = None  # tests.fakes.s3_authorizer.S3Authorizer
    account: Any = None  # tests.fakes.aws_account.AwsAccount

    def reset(self) -> None:
        """Forget every resource of every service (POST /moto-api/reset), and the authorizer's
        refusals. Blocks."""
        if self.authorizer is not None:
            self.authorizer.refused.clear()
        if self.account is not None:
            self.account.reset()
        req = urllib.request.Request(f"{self.url}/moto-api/reset", method="POST", data=b"")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        # a bound, not a speed check: in CI24 the suite's busiest minutes held a reset past 10 s
        with opener.open(req, timeout=60) as resp:
            resp.read()

    def stop(self) -> None:
        """Shut the server down and join its thread. Idempotent."""
        if self.server is not None:
            self.server.stop()
            self.server = None


def moto_available() -> bool:
    """Whether moto's server mode (moto + flask) is importable."""
    return all(importlib.util.find_spec(m) is not None for m in ("moto", "flask", "boto3"))


def install_atomic_s3_objects() -> None:
    """Serialize moto's object-level S3 requests (GET, PUT, DELETE, POST of a key), in this
    process: each request's condition check and its write become one step, as on S3. Bodies
    are read before the lock. Idempotent."""
    from moto.s3.responses import S3Response

    handle = S3Response._key_response
    if getattr(handle, "ct_locked", False):
        return

    def locked(self: Any, request: Any, full_url: str) -> Any:
        with _S3_OBJECT_LOCK:
            return handle(self, request, full_url)

    locked.ct_locked = True  # type: ignore[attr-defined]
    S3Response._key_response = locked  # type: ignore[method-assign]


def start_moto(host: str = HOST) -> MotoServer:
    """Start moto's threaded server on a free port of `host` (default 127.0.0.1; a netns bridge
    address serves the namespaces' VMs and the controller alike, tests/fakes/netns.py); ready
    when this returns. Stop it with `stop()`."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from moto.server import ThreadedMotoServer
    from werkzeug.serving import make_server

    from tests.fakes.aws_account import AwsAccount
    from tests.fakes.aws_front import AccountFront
    from tests.fakes.s3_authorizer import S3Authorizer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    install_atomic_s3_objects()
    authorizer = S3Authorizer(DomainDispatcherApplication(create_backend_app))
    account = AwsAccount()
    front = AccountFront(authorizer, account)

    class AuthorizedMotoServer(ThreadedMotoServer):  # moto's, with the fronts before it
        def _server_entry(self) -> None:
            self._server = make_server(self._ip_address, self._port, front, True)
            self._server_ready_event.set()
            self._server.serve_forever()

    server = AuthorizedMotoServer(ip_address=host, port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    return MotoServer(server=server, url=url, authorizer=authorizer, account=account)


def clear_aws_caches() -> None:
    """Drop the cached boto3 sessions and account id of cloudtrain's AWS adapter."""
    with contextlib.suppress(ImportError):
        mod = importlib.import_module("cloudtrain.providers.aws.clients")
        mod.clear_clients()


def use_moto(monkeypatch: pytest.MonkeyPatch, server: MotoServer) -> None:
    """Point this process's (and its children's) AWS SDK at `server`; undone by monkeypatch."""
    for name in CLEARED_ENV:
        monkeypatch.delenv(name, raising=False)
    for name in [n for n in os.environ if n.startswith("AWS_ENDPOINT_URL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)
    for name, value in TEST_ENV.items():
        monkeypatch.setenv(name, value)
    host = server.url.split("//", 1)[1].rsplit(":", 1)[0]
    for name in ("NO_PROXY", "no_proxy"):  # the server never through a proxy (boto3 and curl)
        current = os.environ.get(name, "")
        monkeypatch.setenv(name, f"{current},{host}" if current else host)


def seed_ssm_parameter(name: str, value: str, region: str = "us-east-1") -> None:
    """Create (or overwrite) an SSM String parameter in moto's default account, bypassing the
    API's refusal of names under `/aws/`. The server runs in this process, so it sees it."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.core.utils import utcnow
    from moto.ssm.models import Parameter, ssm_backends

    params = ssm_backends[DEFAULT_ACCOUNT_ID][region]._parameters
    versions = params[name]
    versions.append(
        Parameter(
            account_id=DEFAULT_ACCOUNT_ID,
            name=name,
            value=value,
            parameter_type="String",
            description=None,
            allowed_pattern=None,
            keyid=None,
            last_modified_date=utcnow(),
            version=len(versions) + 1,
            data_type="aws:ec2:image" if value.startswith("ami-") else "text",
        )
    )


def moto_amis(count: int) -> list[str]:
    """`count` distinct Linux AMI ids that moto knows in every region (describe_images finds
    them), Ubuntu's first."""
    from moto.ec2.models.amis import AMIS

    linux = [a for a in AMIS if "windows" not in str(a.get("name", "")).lower()]
    linux.sort(key=lambda a: not str(a.get("name", "")).lower().startswith("ubuntu"))
    return [str(a["ami_id"]) for a in linux[:count]]


def seed_public_images(regions: tuple[str, ...] = ("us-east-1",)) -> dict[str, str]:
    """Point each parameter of PUBLIC_IMAGE_PARAMS at an AMI of its own in `regions`, so the
    boot harness can tell the images apart; returns parameter -> AMI id."""
    images = dict(zip(PUBLIC_IMAGE_PARAMS, moto_amis(len(PUBLIC_IMAGE_PARAMS)), strict=True))
    for region in regions:
        for name, ami in images.items():
            seed_ssm_parameter(name, ami, region)
    return images


@pytest.fixture(scope="session")
def moto_server_session() -> Iterator[MotoServer]:
    """One moto server for the whole test session (skips if moto is not installed)."""
    if not moto_available():
        pytest.skip("moto server mode is not installed: pip install 'moto[ec2,s3,iam,ssm]' flask")
    server = start_moto()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def moto_server(
    moto_server_session: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[MotoServer]:
    """The session's moto server, empty, with this process's AWS environment pointed at it."""
    moto_server_session.reset()
    use_moto(monkeypatch, moto_server_session)
    clear_aws_caches()
    try:
        yield moto_server_session
    finally:
        clear_aws_caches()


@pytest.fixture
def moto_public_images(moto_server: MotoServer) -> dict[str, str]:
    """The moto server with AWS's public image parameters seeded; parameter -> AMI id."""
    return seed_public_images(("us-east-1", "us-west-2", "eu-west-1"))
