"""Preemption-notice pollers for the node agent: is the cloud about to take this spot VM back?

`PreemptionWatcher(cloud, vm_name).poll()` asks the cloud's instance metadata service, at most
once per `interval_s`, whether this VM has been given its interruption notice, and returns a
`Notice` (with the best estimate of when the VM goes away) once it has:

- aws: IMDSv2, `PUT /latest/api/token` then `GET /latest/meta-data/spot/instance-action`
  (404 until a notice; then `{"action": "terminate"|"stop"|"hibernate", "time": ISO-8601}`).
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html
- gcp: `GET /computeMetadata/v1/instance/preempted` (`TRUE`/`FALSE`; ~30 s once TRUE).
  https://cloud.google.com/compute/docs/instances/create-use-preemptible#detecting_if_an_instance_was_preempted
- azure: Scheduled Events, a `Preempt` or `Terminate` event whose `Resources` name this VM.
  https://learn.microsoft.com/azure/virtual-machines/linux/scheduled-events

Standard library only: this runs on freshly booted nodes before anything else is installed.
Requests never go through a proxy (metadata services are link-local). Nothing here logs or
returns the IMDSv2 token.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

log = logging.getLogger(__name__)

CLOUDS = ("aws", "gcp", "azure")
DEFAULT_BASE_URLS = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
}
METADATA_URL_ENV = "CLOUDTRAIN_METADATA_URL"
_SCHEMES = {"s3": "aws", "gs": "gcp", "az": "azure"}

EC2_TOKEN_PATH = "/latest/api/token"
EC2_ACTION_PATH = "/latest/meta-data/spot/instance-action"
EC2_TOKEN_TTL_S = 21600  # the maximum IMDSv2 allows (6 h)
EC2_TOKEN_REFRESH_S = 300  # fetch a new token this long before the old one expires
EC2_NOTICE_S = 120.0  # "two minutes": used when the notice's time cannot be read
GCE_PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
GCE_NOTICE_S = 30.0
AZURE_EVENTS_PATH = "/metadata/scheduledevents?api-version=2020-07-01"
AZURE_NOTICE_S = 30.0  # the minimum notice of a Preempt event, used when NotBefore is ""
AZURE_NOTICE_TYPES = frozenset({"preempt", "terminate"})
_MAX_BODY = 1 << 20
_MAX_DETAIL = 300


@dataclass(frozen=True)
class Notice:
    """The cloud's notice that this VM is about to be reclaimed. Immutable."""

    cloud: str  # "aws" | "gcp" | "azure"
    action: str  # e.g. "terminate", "stop", "hibernate", "preempt"
    deadline: float  # epoch seconds when the VM goes away (best estimate)
    detail: str  # one line for logs, no secrets


def cloud_of_store(store_uri: str) -> str | None:
    """The cloud whose metadata service to poll for a run's store URI: s3:// -> "aws",
    gs:// -> "gcp", az:// -> "azure", anything else (file://: the local provider) -> None.
    Pure function."""
    scheme, sep, _rest = store_uri.partition("://")
    return _SCHEMES.get(scheme.lower()) if sep else None


class _Unreachable(Exception):
    """No metadata service could be connected to (refused, no route, unknown host, timeout)."""


class _Unanswered(Exception):
    """A service is there, but its answer is not one this poller understands (neutral)."""


def _one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _MAX_DETAIL else flat[: _MAX_DETAIL - 3] + "..."


def _iso_to_epoch(value: str) -> float | None:
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


def _http_date_to_epoch(value: str) -> float | None:
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


class PreemptionWatcher:
    """Polls one cloud's metadata service for this VM's preemption notice.

    Thread-safe: calls are serialized by a lock. `poll()` blocks only when it makes a check,
    for at most a few `timeout_s` (one request, two to four on AWS).
    """

    def __init__(
        self,
        cloud: str | None,
        vm_name: str,
        *,
        base_url: str | None = None,
        interval_s: float = 5.0,
        timeout_s: float = 1.0,
        give_up_after: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`cloud` is "aws", "gcp", "azure" or None (a disabled watcher that never makes a
        request). `vm_name` is this VM's name, matched against Azure events' `Resources` (empty:
        any Preempt/Terminate event counts). `base_url` defaults to $CLOUDTRAIN_METADATA_URL,
        else the cloud's metadata address. `clock` (monotonic seconds) paces the checks and the
        EC2 token's refresh. Raises ValueError for an unknown cloud or a bad setting."""
        if cloud is not None and cloud not in CLOUDS:
            raise ValueError(f"unknown cloud {cloud!r}; expected one of {', '.join(CLOUDS)}")
        if interval_s < 0 or timeout_s <= 0 or give_up_after < 1:
            raise ValueError("interval_s >= 0, timeout_s > 0 and give_up_after >= 1 are required")
        self.cloud, self.vm_name = cloud, vm_name
        default = DEFAULT_BASE_URLS.get(cloud or "", "")
        self.base_url = (base_url or os.environ.get(METADATA_URL_ENV) or default).rstrip("/")
        self.interval_s, self.timeout_s, self.give_up_after = interval_s, timeout_s, give_up_after
        self._clock = clock
        self._enabled = cloud is not None
        self._notice: Notice | None = None
        self._last_check: float | None = None
        self._failures = 0
        self._token: str | None = None
        self._token_at = 0.0
        self._lock = threading.Lock()
        # No proxies, whatever the environment says: the services are link-local.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def __repr__(self) -> str:
        return (
            f"PreemptionWatcher(cloud={self.cloud!r}, vm_name={self.vm_name!r}, "
            f"base_url={self.base_url!r}, enabled={self.enabled})"
        )

    @property
    def enabled(self) -> bool:
        """Whether the watcher still checks: False for cloud None, or after `give_up_after`
        consecutive connection failures (no metadata service here). Once False, stays False."""
        return self._enabled

    def poll(self) -> Notice | None:
        """Rate-limited check for a notice: at most one HTTP check per `interval_s` (None in
        between). Returns the Notice once seen, and the same Notice on every later call
        without more HTTP. Never raises: a failed check counts as "no notice". Only failures to
        connect count towards `give_up_after`, which disables the watcher; an answer meaning
        "no notice" (EC2's 404, GCE's FALSE, no matching Azure event) resets that count, and any
        other answer (HTTP errors, slow or garbled answers) leaves it as it is. Thread-safe."""
        with self._lock:
            if self._notice is not None or not self._enabled:
                return self._notice
            now = self._clock()
            if self._last_check is not None and now - self._last_check < self.interval_s:
                return None
            self._last_check = now
            try:
                notice = self._check()
            except _Unreachable as exc:
                self._failures += 1
                log.debug("no %s metadata service at %s: %s", self.cloud, self.base_url, exc)
                if self._failures >= self.give_up_after:
                    self._enabled = False
                    log.info(
                        "preemption watcher disabled: no %s metadata service at %s after %d tries",
                        self.cloud,
                        self.base_url,
                        self._failures,
                    )
                return None
            except Exception as exc:  # a slow, garbled or refused answer: no notice this time
                log.debug("%s metadata check inconclusive: %s", self.cloud, type(exc).__name__)
                return None
            self._failures = 0
            if notice is not None:
                self._notice = notice
                log.info("preemption notice: %s", notice.detail)
            return notice

    # --- HTTP -----------------------------------------------------------------------------
    def _request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        """One request; returns (status, body) for any HTTP answer, including errors. Raises
        _Unreachable when nothing could be connected to; TimeoutError and others otherwise."""
        data = b"" if method in ("PUT", "POST") else None
        req = urllib.request.Request(self.base_url + path, data, headers, method=method)
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                return int(resp.status), resp.read(_MAX_BODY)
        except urllib.error.HTTPError as err:
            with contextlib.closing(err):
                return int(err.code), b""
        except urllib.error.URLError as err:  # raised only before a request was sent
            raise _Unreachable(str(err.reason)) from None

    def _check(self) -> Notice | None:
        if self.cloud == "aws":
            return self._check_aws()
        if self.cloud == "gcp":
            return self._check_gcp()
        return self._check_azure()

    # --- AWS ------------------------------------------------------------------------------
    def _ec2_token(self) -> str:
        """The cached IMDSv2 token, fetched again when it is near its expiry."""
        now = self._clock()
        if self._token is None or now - self._token_at >= EC2_TOKEN_TTL_S - EC2_TOKEN_REFRESH_S:
            headers = {"X-aws-ec2-metadata-token-ttl-seconds": str(EC2_TOKEN_TTL_S)}
            status, body = self._request("PUT", EC2_TOKEN_PATH, headers)
            token = body.decode(errors="replace").strip()
            if status != 200 or not token:
                raise _Unanswered(f"token request answered HTTP {status}")
            self._token, self._token_at = token, now
        return self._token

    def _check_aws(self) -> Notice | None:
        status, body = 0, b""
        for _ in range(2):  # a 401 means an expired or revoked token: fetch one and ask again
            headers = {"X-aws-ec2-metadata-token": self._ec2_token()}
            status, body = self._request("GET", EC2_ACTION_PATH, headers)
            if status != 401:
                break
            self._token = None
        if status == 404:
            return None
        if status != 200:
            raise _Unanswered(f"instance-action answered HTTP {status}")
        now = time.time()
        try:
            doc: Any = json.loads(body)
        except ValueError:
            doc = {}
        if not isinstance(doc, dict):
            doc = {}
        action = str(doc.get("action") or "terminate").lower()
        when = str(doc.get("time") or "")
        deadline = _iso_to_epoch(when) if when else None
        if deadline is None:
            deadline = now + EC2_NOTICE_S
        if action == "hibernate":  # no two-minute warning: hibernation begins at once
            deadline = min(deadline, now)
        return Notice(
            "aws", action, deadline, _one_line(f"EC2 spot interruption: {action} at {when or '?'}")
        )

    # --- GCP ------------------------------------------------------------------------------
    def _check_gcp(self) -> Notice | None:
        status, body = self._request("GET", GCE_PREEMPTED_PATH, {"Metadata-Flavor": "Google"})
        answer = body.decode(errors="replace").strip().upper()
        if status != 200 or answer not in ("TRUE", "FALSE"):
            raise _Unanswered(f"preempted answered HTTP {status}")
        if answer == "FALSE":
            return None
        return Notice(
            "gcp", "preempt", time.time() + GCE_NOTICE_S, "GCE preemption: instance/preempted=TRUE"
        )

    # --- Azure ----------------------------------------------------------------------------
    def _check_azure(self) -> Notice | None:
        status, body = self._request("GET", AZURE_EVENTS_PATH, {"Metadata": "true"})
        if status != 200:
            raise _Unanswered(f"scheduledevents answered HTTP {status}")
        doc = json.loads(body)  # ValueError: garbled, inconclusive
        events = doc.get("Events") if isinstance(doc, dict) else None
        if not isinstance(events, list):
            raise _Unanswered("scheduledevents answered without an Events list")
        now = time.time()
        best: Notice | None = None
        for event in events:
            notice = self._azure_notice(event, now) if isinstance(event, dict) else None
            if notice is not None and (best is None or notice.deadline < best.deadline):
                best = notice
        return best

    def _azure_notice(self, event: dict[str, Any], now: float) -> Notice | None:
        """A Notice for one Scheduled Event when it is a Preempt/Terminate of this VM."""
        kind = str(event.get("EventType") or "")
        if kind.lower() not in AZURE_NOTICE_TYPES:
            return None  # Freeze, Reboot, Redeploy: the VM stays
        resources = event.get("Resources")
        names = {str(r).casefold() for r in resources} if isinstance(resources, list) else set()
        if self.vm_name and self.vm_name.casefold() not in names:
            return None  # an event for another VM of the same availability set/scale set
        status = str(event.get("EventStatus") or "")
        not_before = str(event.get("NotBefore") or "")
        deadline = _http_date_to_epoch(not_before)
        if deadline is None:
            deadline = now if status.lower() == "started" else now + AZURE_NOTICE_S
        detail = (
            f"Azure scheduled event {kind} {event.get('EventId', '?')} ({status or '?'}), "
            f"NotBefore {not_before or '-'}"
        )
        if event.get("Description"):
            detail += f": {event['Description']}"
        return Notice("azure", kind.lower(), deadline, _one_line(detail))
