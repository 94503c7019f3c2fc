"""The node-side spot-interruption probe of an EC2 VM (`INFO.preemption`).

IMDSv2: `PUT /latest/api/token`, then `GET /latest/meta-data/spot/instance-action` (404 until a
notice; then `{"action": "terminate"|"stop"|"hibernate", "time": ISO-8601}`).
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html

Standard library only, Python 3.10 (it runs on the node before anything is installed). Nothing
here logs or returns the IMDSv2 token.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from cloudtrain.providers.metadata import Notice, Request, Unanswered, iso_to_epoch, one_line

BASE_URL = "http://169.254.169.254"  # the instance metadata service (link-local)
EC2_TOKEN_PATH = "/latest/api/token"
EC2_ACTION_PATH = "/latest/meta-data/spot/instance-action"
EC2_TOKEN_TTL_S = 21600  # the maximum IMDSv2 allows (6 h)
EC2_TOKEN_REFRESH_S = 300  # fetch a new token this long before the old one expires
EC2_NOTICE_S = 120.0  # "two minutes": used when the notice's time cannot be read


class Ec2Probe:
    """Asks IMDSv2 for this VM's spot interruption notice. Not thread-safe on its own: the
    watcher serializes its checks."""

    base_url = BASE_URL

    def __init__(self, vm_name: str, clock: Callable[[], float] = time.monotonic) -> None:
        """`clock` (monotonic seconds) times the token's refresh. `vm_name` is unused: the
        service answers for this VM only."""
        self._clock = clock
        self._token: str | None = None
        self._token_at = 0.0

    def __repr__(self) -> str:
        return "Ec2Probe()"  # never the token

    def _ec2_token(self, request: Request) -> str:
        """The cached IMDSv2 token, fetched again when it is near its expiry."""
        now = self._clock()
        if self._token is None or now - self._token_at >= EC2_TOKEN_TTL_S - EC2_TOKEN_REFRESH_S:
            headers = {"X-aws-ec2-metadata-token-ttl-seconds": str(EC2_TOKEN_TTL_S)}
            status, body = request("PUT", EC2_TOKEN_PATH, headers)
            token = body.decode(errors="replace").strip()
            if status != 200 or not token:
                raise Unanswered(f"token request answered HTTP {status}")
            self._token, self._token_at = token, now
        return self._token

    def check(self, request: Request) -> Notice | None:
        """One check (two to four requests): the Notice, or None (404: no notice yet)."""
        status, body = 0, b""
        for _ in range(2):  # a 401 means an expired or revoked token: fetch one and ask again
            headers = {"X-aws-ec2-metadata-token": self._ec2_token(request)}
            status, body = request("GET", EC2_ACTION_PATH, headers)
            if status != 401:
                break
            self._token = None
        if status == 404:
            return None
        if status != 200:
            raise Unanswered(f"instance-action answered HTTP {status}")
        now = time.time()
        try:
            doc: Any = json.loads(body)
        except ValueError:
            doc = {}
        if not isinstance(doc, dict):
            doc = {}
        action = str(doc.get("action") or "terminate").lower()
        when = str(doc.get("time") or "")
        deadline = iso_to_epoch(when) if when else None
        if deadline is None:
            deadline = now + EC2_NOTICE_S
        if action == "hibernate":  # no two-minute warning: hibernation begins at once
            deadline = min(deadline, now)
        return Notice(
            "aws", action, deadline, one_line(f"EC2 spot interruption: {action} at {when or '?'}")
        )
