"""boto3 sessions and clients for cloudtrain: the standard credential chain, the spec's region,
and SDK-level retries kept short (cloudtrain's own policy in cloudtrain/core/retry.py decides).

boto3 honours AWS_ENDPOINT_URL (and AWS_ENDPOINT_URL_<SERVICE>) by itself: that is how the offline
tests point every client, on the controller and on the nodes, at moto.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from typing import Any

import boto3
from botocore.config import Config

_CONFIG = Config(retries={"mode": "standard", "max_attempts": 3}, max_pool_connections=64)


@lru_cache(maxsize=8)
def session(region: str | None) -> boto3.Session:
    """A session from the standard chain (env, profile, SSO, instance role). Cached per region."""
    return boto3.Session(region_name=region) if region else boto3.Session()


_clients: dict[tuple[str, str | None, Config | None], Any] = {}
_clients_lock = threading.Lock()


def client(service: str, region: str | None, config: Config | None = None) -> Any:
    """The client for `service` in `region` (cached). Clients are safe to share between
    threads; building them is not, hence the lock. `config` is merged over the defaults."""
    key = (service, region, config)
    with _clients_lock:
        if key not in _clients:
            merged = _CONFIG.merge(config) if config is not None else _CONFIG
            _clients[key] = session(region).client(service, config=merged)  # type: ignore[call-overload]
        return _clients[key]


def clear_clients() -> None:
    """Forget cached sessions and clients (tests that switch endpoints or credentials)."""
    with _clients_lock:
        _clients.clear()
    session.cache_clear()
    account_id.cache_clear()


@lru_cache(maxsize=8)
def account_id(region: str | None) -> str:
    """The caller's AWS account id (for the default bucket name). Raises CredentialsError."""
    from cloudtrain.providers.aws.errors import aws_errors

    with aws_errors("look up the AWS account (sts:GetCallerIdentity)"):
        return str(client("sts", region).get_caller_identity()["Account"])
