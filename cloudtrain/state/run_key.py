"""The run's key: proof that a document in the run's bucket was written by a controller of the
run, which its nodes (running the user's code, with write access to the run's prefix) cannot make.

Each run has 32 random bytes (`generate`), kept in the ledger of every controller of the run
(`Ledger.run_key`, never journaled) and in the bucket at `control/key` for a machine that has
never seen the run (`status`/`down`/`attach` given the run id and provider). The nodes never get
it: it is in no cluster.json, script or environment, and each cloud's node identity is refused
`control/key` (providers/<cloud>/: the node role's Denies, the bucket bindings' conditions, the
container grant's ABAC condition; on `local` the nodes are the user's own processes and can read
it: there, it guards against mistakes, not against the user's code).

What is signed: every journal entry (bound to its object name), `control/launch.json`,
`control/yield` (bound to the holder's lease term) and, for the lease, any JSON object
(`sign_doc`/`verify_doc` with a purpose of its own). A MAC is HMAC-SHA256 over `canonical`
bytes: the purpose, then the document as sorted, compact JSON without its `mac` field.
Comparisons are constant-time. Pure but for `fetch`/`publish` (one bucket call each).
Runs on the controller node: Python 3.10+.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import TYPE_CHECKING, Any, Protocol

from cloudtrain.core.errors import NotFound, TooLarge
from cloudtrain.jobs.bucket_reads import RUN_KEY_MAX_BYTES, YIELD_MAX_BYTES
from cloudtrain.jobs.protocol import KEY_NAME, run_prefix
from cloudtrain.jobs.protocol_base import ProtocolError, load_json

if TYPE_CHECKING:
    from cloudtrain.providers.base import ObjectStore



class KeyShelf(Protocol):
    """Where a controller keeps run keys: the ledger (`Ledger.run_key`, `Ledger.set_run_key`)."""

    def run_key(self, run_id: str) -> bytes | None: ...
    def set_run_key(self, run_id: str, key: bytes) -> bytes: ...


KEY_BYTES = 32
MAC_FIELD = "mac"
# purposes: one MAC never verifies as another document's
JOURNAL = "journal"
LAUNCH = "launch"
YIELD = "yield"
LEASE = "lease"


def key_object(run_id: str) -> str:
    """control/key: the run's key as hex (read by controllers only; see the module). Pure."""
    return run_prefix(run_id) + KEY_NAME


def generate() -> bytes:
    """A fresh run key: 32 bytes from `secrets`. Non-blocking."""
    return secrets.token_bytes(KEY_BYTES)


def key_id(key: bytes) -> str:
    """A key's public name for messages: 'key sha256:<first 12 hex digits of its digest>'
    (reveals nothing of the key). Pure."""
    return "key sha256:" + hashlib.sha256(key).hexdigest()[:12]


def canonical(purpose: str, doc: dict[str, Any]) -> bytes:
    """The bytes a MAC covers: `purpose`, a NUL, then `doc` without its `mac` field as sorted,
    compact, ASCII JSON. Pure; TypeError/ValueError for a doc that is not JSON-able."""
    body = {k: v for k, v in doc.items() if k != MAC_FIELD}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return purpose.encode() + b"\0" + text.encode()


def mac(key: bytes, purpose: str, doc: dict[str, Any]) -> str:
    """The hex HMAC-SHA256 of `canonical(purpose, doc)` under `key`. Pure."""
    return hmac.new(key, canonical(purpose, doc), hashlib.sha256).hexdigest()


def sign_doc(key: bytes, purpose: str, doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` with its `mac` field set (any old one replaced). Pure."""
    return {**doc, MAC_FIELD: mac(key, purpose, doc)}


def verify_doc(key: bytes | None, purpose: str, doc: object) -> bool:
    """Whether `doc` is a JSON object whose `mac` is `key`'s for `purpose` (constant-time
    compare). False for no key, no or a mistyped mac, or a doc that is not an object. Pure."""
    if key is None or not isinstance(doc, dict):
        return False
    given = doc.get(MAC_FIELD)
    if not isinstance(given, str):
        return False
    try:
        expected = mac(key, purpose, doc)
    except (TypeError, ValueError):
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def journal_purpose(name: str) -> str:
    """A journal entry's purpose: bound to its object name, so a node cannot copy a signed
    entry under another name (a replay at another time). Pure."""
    return f"{JOURNAL}:{name}"


def yield_body(key: bytes, run_id: str, owner: str, term: int) -> bytes:
    """control/yield's bytes: `owner` asks the holder of lease `term` of `run_id` to hand the
    run back, signed. Pure."""
    doc = {"run_id": run_id, "owner": owner, "term": int(term)}
    return json.dumps(sign_doc(key, YIELD, doc), sort_keys=True).encode()


def yield_owner(body: bytes, key: bytes | None, run_id: str, term: int) -> str | None:
    """The asker's owner id when `body` is a yield signed with `key` for `run_id` and the
    current lease `term` (an old yield, copied back by a node, names an old term), else None
    (unsigned, forged, another run's or term's, unreadable: over YIELD_MAX_BYTES, too deep).
    Pure; never raises."""
    try:
        doc = load_json(body, what="control/yield", max_bytes=YIELD_MAX_BYTES)
    except ProtocolError:
        return None
    if not verify_doc(key, YIELD, doc):
        return None
    if doc.get("run_id") != run_id or doc.get("term") != term:
        return None
    owner = doc.get("owner")
    return owner if isinstance(owner, str) else None


def parse_key(body: bytes) -> bytes | None:
    """The key in control/key's bytes (64 hex digits), or None when they are not one. Pure."""
    try:
        key = bytes.fromhex(body.decode("ascii").strip())
    except (ValueError, UnicodeDecodeError):
        return None
    return key if len(key) == KEY_BYTES else None


def fetch(store: ObjectStore, run_id: str) -> bytes | None:
    """The key in the run's bucket, or None when there is none (or it is not a key: one over
    RUN_KEY_MAX_BYTES is not read further). Blocks; the store's errors other than NotFound
    propagate."""
    try:
        body = store.get(key_object(run_id), max_bytes=RUN_KEY_MAX_BYTES)
    except (NotFound, TooLarge):
        return None
    return parse_key(body)


def publish(store: ObjectStore, run_id: str, key: bytes) -> None:
    """Put the key in the run's bucket (control/key). Idempotent; blocks."""
    store.put(key_object(run_id), key.hex().encode())


def reader_key(ledger: KeyShelf, store: ObjectStore, run_id: str) -> bytes | None:
    """The key to check the run's documents with: the ledger's (a key once kept never changes,
    so a node that replaces control/key fools no machine that had the run's key), else the
    bucket's (kept in the ledger from then on), else None (a run from before keys: nothing
    of its bucket can be trusted). Blocks for at most one bucket read; the store's errors
    other than NotFound propagate."""
    key = ledger.run_key(run_id)
    if key is not None:
        return key
    key = fetch(store, run_id)
    return None if key is None else ledger.set_run_key(run_id, key)


def writer_key(ledger: KeyShelf, store: ObjectStore, run_id: str) -> bytes:
    """The key to sign the run's documents with: `reader_key`'s, else a new one, kept in the
    ledger and put in the bucket (the run's first controller, when its bucket exists). Blocks
    for a bucket read and, the first time, a write; the store's errors propagate."""
    key = reader_key(ledger, store, run_id)
    if key is not None:
        return key
    key = ledger.set_run_key(run_id, generate())
    publish(store, run_id, key)
    return key


def yield_asked(store: ObjectStore, run_id: str, key: bytes | None, term: int) -> bool:
    """Whether control/yield holds a yield signed with the run's `key` for lease `term` (what
    a controller checks at each renewal; an unsigned or forged one is ignored). Blocks for one
    read (at most YIELD_MAX_BYTES: a larger one is no yield); the store's other errors
    propagate."""
    from cloudtrain.jobs.protocol import yield_key

    try:
        got = store.get_tagged(yield_key(run_id), max_bytes=YIELD_MAX_BYTES)
    except TooLarge:
        return False
    return got is not None and yield_owner(got[0], key, run_id, term) is not None
