"""The node agent's preemption-notice watcher: is the cloud about to take this spot VM back?

`PreemptionWatcher(cloud, vm_name).poll()` asks the cloud's instance metadata service, at most
once per `interval_s`, whether this VM has been given its interruption notice, and returns a
`Notice` (with the best estimate of when the VM goes away) once it has. What to ask and how to
read the answer is the cloud's own: its probe, `ProviderInfo.preemption` (e.g.
providers/aws/preemption.py); this module paces the checks, counts the failures and keeps the
notice. A provider without a probe (the local one) gets no watcher.

Standard library only: this runs on freshly booted nodes before anything else is installed.
Requests never go through a proxy (metadata services are link-local). Nothing here logs or
returns a probe's secrets (the IMDSv2 token).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from cloudtrain.core import env
from cloudtrain.core.errors import UsageError
from cloudtrain.providers.metadata import MetadataHttp, Notice, Probe, Unreachable
from cloudtrain.providers.registry import info, info_for_uri, load, names

log = logging.getLogger(__name__)

METADATA_URL_ENV = env.METADATA_URL.name  # test-only: the fake metadata service

__all__ = ["METADATA_URL_ENV", "Notice", "PreemptionWatcher", "cloud_of_store", "watched_clouds"]


def watched_clouds() -> tuple[str, ...]:
    """The providers that have a preemption probe, in registry order."""
    return tuple(n for n in names() if info(n).preemption is not None)


def cloud_of_store(store_uri: str) -> str | None:
    """The provider whose metadata service to poll for a run's store URI (by its scheme, e.g.
    s3:// -> the provider serving s3://), or None when that provider has no probe (file://: the
    local provider) or no provider serves the URI. Pure function."""
    scheme, sep, rest = store_uri.partition("://")
    if not sep:
        return None
    try:
        found = info_for_uri(f"{scheme.lower()}://{rest}")
    except UsageError:
        return None
    return found.name if found.preemption is not None else None


def _probe(cloud: str, vm_name: str, clock: Callable[[], float]) -> Probe:
    """The cloud's probe for this VM. Raises ValueError for a cloud without one."""
    try:
        ref = info(cloud).preemption
    except UsageError:
        ref = None
    if ref is None:
        raise ValueError(f"unknown cloud {cloud!r}; expected one of {', '.join(watched_clouds())}")
    probe: Probe = load(ref)(vm_name, clock)
    return probe


class PreemptionWatcher:
    """Polls one cloud's metadata service for this VM's preemption notice.

    Thread-safe: calls are serialized by a lock. `poll()` blocks only when it makes a check,
    for at most a few `timeout_s` (one request, or the few a probe makes).
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
        """`cloud` is a provider with a preemption probe (`watched_clouds()`), or None (a
        disabled watcher that never makes a request). `vm_name` is this VM's name (a probe may
        match events against it). `base_url` defaults to $CLOUDTRAIN_METADATA_URL, else the
        cloud's metadata address. `clock` (monotonic seconds) paces the checks and is the
        probe's clock (token refreshes). Raises ValueError for an unknown cloud, a cloud
        without a probe, or a bad setting."""
        if interval_s < 0 or timeout_s <= 0 or give_up_after < 1:
            raise ValueError("interval_s >= 0, timeout_s > 0 and give_up_after >= 1 are required")
        self._probe = _probe(cloud, vm_name, clock) if cloud is not None else None
        self.cloud, self.vm_name = cloud, vm_name
        default = self._probe.base_url if self._probe is not None else ""
        self.base_url = (base_url or env.METADATA_URL.raw() or default).rstrip("/")
        self.interval_s, self.timeout_s, self.give_up_after = interval_s, timeout_s, give_up_after
        self._clock = clock
        self._enabled = cloud is not None
        self._notice: Notice | None = None
        self._last_check: float | None = None
        self._failures = 0
        self._lock = threading.Lock()
        self._http = MetadataHttp(timeout_s)

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
        "no notice" (the probe's None) resets that count, and any other answer (HTTP errors,
        slow or garbled answers) leaves it as it is. Thread-safe."""
        with self._lock:
            if self._notice is not None or not self._enabled:
                return self._notice
            now = self._clock()
            if self._last_check is not None and now - self._last_check < self.interval_s:
                return None
            self._last_check = now
            try:
                notice = self._check()
            except Unreachable as exc:
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

    def _check(self) -> Notice | None:
        """One check by the cloud's probe, against `base_url` as it is now."""
        if self._probe is None:  # never: a watcher without a probe is disabled
            return None

        def request(method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
            return self._http.request(self.base_url, method, path, headers)

        return self._probe.check(request)
