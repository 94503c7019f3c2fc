"""The access tokens a box's metadata service issued, and who holds each (tests only).

One book per box: the metadata route issues an opaque bearer token for an identity (a GCE
service account's email, an Azure principal id) and, on Azure, the audience it was asked for
(`resource`); the store's front asks `who(token, audience)` and gets the holder of a live token
for that audience, or None. Tokens expire after `lifetime_s`, as the clouds' do.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Token:
    """Who a token was issued to, for which audience ("" for none), and when it expires."""

    holder: str
    audience: str
    expires_at: float


class TokenBook:
    """Issued tokens, each `prefix` + random text, living `lifetime_s`. Thread-safe."""

    def __init__(self, prefix: str, lifetime_s: float) -> None:
        self.prefix, self.lifetime_s = prefix, lifetime_s
        self._lock = threading.Lock()
        self._tokens: dict[str, Token] = {}

    def issue(self, holder: str, audience: str = "", lifetime_s: float | None = None) -> str:
        """A new opaque token for `holder` and `audience`."""
        token = self.prefix + secrets.token_urlsafe(24)
        life = self.lifetime_s if lifetime_s is None else lifetime_s
        with self._lock:
            self._tokens[token] = Token(holder, audience, time.time() + life)
        return token

    def who(self, token: str, audience: str | None = None) -> str | None:
        """The holder of a live token issued for `audience` (a trailing "/" aside; None: any
        audience), or None: unknown, expired, or for another audience."""
        with self._lock:
            found = self._tokens.get(token)
        if found is None or found.expires_at <= time.time():
            return None
        if audience is not None and found.audience.rstrip("/") != audience.rstrip("/"):
            return None
        return found.holder
