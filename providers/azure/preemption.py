"""The node-side eviction probe of an Azure VM (`INFO.preemption`).

Scheduled Events: a `Preempt` or `Terminate` event whose `Resources` name this VM.
https://learn.microsoft.com/azure/virtual-machines/linux/scheduled-events

Standard library only, Python 3.10 (it runs on the node before anything is installed).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from cloudtrain.providers.metadata import (
    Notice,
    Request,
    Unanswered,
    http_date_to_epoch,
    one_line,
)

BASE_URL = "http://169.254.169.254"  # the instance metadata service (link-local)
AZURE_EVENTS_PATH = "/metadata/scheduledevents?api-version=2020-07-01"
AZURE_NOTICE_S = 30.0  # the minimum notice of a Preempt event, used when NotBefore is ""
AZURE_NOTICE_TYPES = frozenset({"preempt", "terminate"})


class ScheduledEventsProbe:
    """Asks Scheduled Events for a Preempt/Terminate of this VM. Stateless."""

    base_url = BASE_URL

    def __init__(self, vm_name: str, clock: Callable[[], float] = time.monotonic) -> None:
        """`vm_name` is matched against the events' `Resources` (empty: any Preempt/Terminate
        event counts). `clock` is unused."""
        self.vm_name = vm_name

    def check(self, request: Request) -> Notice | None:
        """One request: the Notice with the earliest deadline, or None."""
        status, body = request("GET", AZURE_EVENTS_PATH, {"Metadata": "true"})
        if status != 200:
            raise Unanswered(f"scheduledevents answered HTTP {status}")
        doc = json.loads(body)  # ValueError: garbled, inconclusive
        events = doc.get("Events") if isinstance(doc, dict) else None
        if not isinstance(events, list):
            raise Unanswered("scheduledevents answered without an Events list")
        now = time.time()
        best: Notice | None = None
        for event in events:
            notice = self._notice(event, now) if isinstance(event, dict) else None
            if notice is not None and (best is None or notice.deadline < best.deadline):
                best = notice
        return best

    def _notice(self, event: dict[str, Any], now: float) -> Notice | None:
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
        deadline = http_date_to_epoch(not_before)
        if deadline is None:
            deadline = now if status.lower() == "started" else now + AZURE_NOTICE_S
        detail = (
            f"Azure scheduled event {kind} {event.get('EventId', '?')} ({status or '?'}), "
            f"NotBefore {not_before or '-'}"
        )
        if event.get("Description"):
            detail += f": {event['Description']}"
        return Notice("azure", kind.lower(), deadline, one_line(detail))
