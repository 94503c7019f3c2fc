"""The node-side preemption probe of a Compute Engine VM (`INFO.preemption`).

`GET /computeMetadata/v1/instance/preempted` answers `TRUE` or `FALSE`; the VM goes ~30 s after
TRUE. https://cloud.google.com/compute/docs/instances/create-use-preemptible#detecting_if_an_instance_was_preempted

Standard library only, Python 3.10 (it runs on the node before anything is installed).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cloudtrain.providers.metadata import Notice, Request, Unanswered

BASE_URL = "http://metadata.google.internal"
GCE_PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
GCE_NOTICE_S = 30.0


class GceProbe:
    """Asks the GCE metadata server whether this VM is being preempted. Stateless."""

    base_url = BASE_URL

    def __init__(self, vm_name: str, clock: Callable[[], float] = time.monotonic) -> None:
        """Both arguments are unused: the server answers for this VM only."""

    def check(self, request: Request) -> Notice | None:
        """One request: the Notice, or None (FALSE)."""
        status, body = request("GET", GCE_PREEMPTED_PATH, {"Metadata-Flavor": "Google"})
        answer = body.decode(errors="replace").strip().upper()
        if status != 200 or answer not in ("TRUE", "FALSE"):
            raise Unanswered(f"preempted answered HTTP {status}")
        if answer == "FALSE":
            return None
        return Notice(
            "gcp", "preempt", time.time() + GCE_NOTICE_S, "GCE preemption: instance/preempted=TRUE"
        )
