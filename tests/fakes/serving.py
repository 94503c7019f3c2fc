"""A fake's HTTP server, served in a daemon thread until closed (tests only).

    self._served = Served(server, "gce-fake")  # serving on return
    url = f"http://{HOST}:{self._served.port}"
    self._served.close()  # idempotent

The one serve/shutdown/join sequence of the box's fakes and fronts (gce_fake, arm_fake,
gcs_authorizer, blob_authorizer); a short poll interval makes `close` quick.
"""

from __future__ import annotations

import socketserver
import threading


class Served:
    """`server` served in a daemon thread named `name`, from construction to `close`."""

    def __init__(self, server: socketserver.BaseServer, name: str) -> None:
        self.server = server
        self._thread: threading.Thread | None = threading.Thread(
            target=server.serve_forever, name=name, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        """The port the server is bound to."""
        return int(self.server.server_address[1])  # type: ignore[index]

    def close(self) -> None:
        """Stop serving, free the port and join the thread (5 s at most). Idempotent."""
        if self._thread is None:
            return
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)
        self._thread = None
