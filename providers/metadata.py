"""What every cloud's node-side preemption probe shares: the notice it returns, the one-request
HTTP helper for link-local metadata services, and the time parsers.

A probe (`ProviderInfo.preemption`, e.g. `cloudtrain.providers.aws.preemption:Ec2Probe`) is built
as `factory(vm_name, clock)` and has `base_url` (its cloud's metadata address) and
`check(request) -> Notice | None`, where `request(method, path, headers)` is `MetadataHttp.request`
bound to the watcher's address (jobs/preemption.py paces the checks and counts the
failures; a probe only asks and reads the answer).

Standard library only, Python 3.10: this runs on freshly booted nodes before anything else is
installed. Requests never go through a proxy (metadata services are link-local).
"""

from __future__ import annotations

import contextlib
import email.utils
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Protocol

MAX_BODY = 1 << 20
MAX_DETAIL = 300

# request(method, path, headers) -> (HTTP status, body)
Request = Callable[[str, str, dict[str, str]], tuple[int, bytes]]


@dataclass(frozen=True)
class Notice:
    """The cloud's notice that this VM is about to be reclaimed. Immutable."""

    cloud: str  # the provider's name (ProviderInfo.name)
    action: str  # e.g. "terminate", "stop", "hibernate", "preempt"
    deadline: float  # epoch seconds when the VM goes away (best estimate)
    detail: str  # one line for logs, no secrets


class Unreachable(Exception):
    """No metadata service could be connected to (refused, no route, unknown host, timeout)."""


class Unanswered(Exception):
    """A service is there, but its answer is not one the probe understands (neutral)."""


class Probe(Protocol):
    """One cloud's preemption check (see the module docstring)."""

    base_url: str  # the cloud's metadata service, e.g. "http://169.254.169.254"

    def check(self, request: Request) -> Notice | None:
        """One check: a Notice, or None when there is none. Raises Unreachable (from
        `request`), Unanswered, or anything else for an inconclusive answer."""


class MetadataHttp:
    """Single requests to a metadata service, never through a proxy. Thread-safe."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        # No proxies, whatever the environment says: the services are link-local.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def request(
        self, base_url: str, method: str, path: str, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        """One request; returns (status, body) for any HTTP answer, including errors. Blocks
        up to `timeout_s`. Raises Unreachable when nothing could be connected to; TimeoutError
        and others otherwise."""
        data = b"" if method in ("PUT", "POST") else None
        req = urllib.request.Request(base_url + path, data, headers, method=method)
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                return int(resp.status), resp.read(MAX_BODY)
        except urllib.error.HTTPError as err:
            with contextlib.closing(err):
                return int(err.code), b""
        except urllib.error.URLError as err:  # raised only before a request was sent
            raise Unreachable(str(err.reason)) from None


def one_line(text: str) -> str:
    """`text` on one line, at most MAX_DETAIL characters. Pure."""
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_DETAIL else flat[: MAX_DETAIL - 3] + "..."


def iso_to_epoch(value: str) -> float | None:
    """`2017-09-18T08:22:00Z` -> epoch seconds (naive times are UTC); None if unreadable."""
    try:
        text = value.strip()
        # Python 3.10's fromisoformat takes no "Z" (3.11's does): spell it as an offset
        moment = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except (ValueError, AttributeError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def http_date_to_epoch(value: str) -> float | None:
    """`Mon, 19 Sep 2016 18:29:47 GMT` -> epoch seconds; None if empty or unreadable."""
    if not value or not value.strip():
        return None
    try:
        moment = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()
