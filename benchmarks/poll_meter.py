"""Counting a poll's API calls at the HTTP level, pricing them, and the old RunReader (issue 19).

`HttpCalls` records every request the SDKs send while it is `recording()`: both boto3 (botocore's
URLLib3Session) and google-cloud-storage (requests) send through urllib3's
`HTTPConnectionPool.urlopen`, which it wraps in this process. Each request is classified as the
API call the cloud bills (`classify`): LIST (S3 ListObjectsV2, GCS objects.list: one page each),
GET (S3 GetObject, GCS media download or object metadata), PUT, HEAD, with the prefix a LIST
asked for. The in-process servers (moto's werkzeug, the GCS emulator's http.server) do not use
urllib3, so they are not counted twice.

`old_runstate()` loads the RunReader of commit 11bd739 (before issue 19: one listing of the run's
whole prefix per poll) from git into a module, without a copy in the tree.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import threading
import types
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OLD_COMMIT = "11bd739"  # the last commit whose RunReader listed the whole run prefix per poll
LIST, GET, PUT, HEAD, OTHER = "LIST", "GET", "PUT", "HEAD", "OTHER"
# GCS buckets.get (Class B): google-cloud-storage 3.x reads the bucket's metadata in a background
# thread once per Client (_bucket_metadata_cache), and GcsStore makes a Client per thread
BUCKET_GET = "BUCKET_GET"
OBJECT_CALLS = (LIST, GET, PUT, HEAD)

# Request prices, USD per 1,000 requests (list, get), standard storage class, cheapest US region:
# - S3 Standard (us-east-1): PUT, COPY, POST, LIST $0.005 per 1,000; GET, SELECT $0.0004 per 1,000
#   https://aws.amazon.com/s3/pricing/ ("Requests & data retrievals"); a ListObjectsV2 call
#   returns at most 1,000 keys: https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectsV2.html
# - GCS Standard: Class A (objects.list, inserts) $0.005 per 1,000, Class B (objects.get, media
#   downloads) $0.0004 per 1,000: https://cloud.google.com/storage/pricing#operations-pricing and
#   the worked example at https://cloud.google.com/storage/pricing-examples ("10,000 Class A
#   operations * $0.005 per 1,000 operations"); objects.list pages hold at most 1,000 items
#   (maxResults): https://cloud.google.com/storage/docs/json_api/v1/objects/list
# - Azure Blob Storage, hot tier, LRS (East US): "List and create container operations" $0.05
#   per 10,000, "Read operations" $0.004 per 10,000: https://azure.microsoft.com/en-us/pricing/
#   details/storage/blobs/ ; List Blobs is a "List and create container" operation and Get Blob a
#   read: https://learn.microsoft.com/en-us/azure/storage/blobs/map-rest-apis-transaction-categories
#   (List Blobs returns at most 5,000 blobs per call: the old poll's page count differs there).
PRICES: dict[str, tuple[float, float]] = {
    "s3": (0.005, 0.0004),
    "gcs": (0.005, 0.0004),
    "azure": (0.005, 0.0004),
}
PAGE_ITEMS = {"s3": 1000, "gcs": 1000, "azure": 5000}


@dataclass
class Call:
    """One HTTP request the SDK sent, as billed."""

    kind: str  # LIST, GET, PUT, HEAD, OTHER
    target: str  # the prefix a LIST asked for, else the object key


def classify(method: str, url: str) -> Call:
    """The billed call behind one request (S3 path-style or virtual-host, GCS JSON API). Pure."""
    parsed = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parsed.query)
    path = urllib.parse.unquote(parsed.path)
    prefix = query.get("prefix", [""])[0]
    if "/storage/v1/b/" in path or "/upload/storage/v1/b/" in path:  # GCS JSON API
        rest = path.split("/b/", 1)[1]
        bucket_and_o = rest.split("/o", 1)
        if method == "GET" and (len(bucket_and_o) == 1 or bucket_and_o[1] in ("", "/")):
            return Call(LIST if len(bucket_and_o) == 2 else BUCKET_GET, prefix)
        key = bucket_and_o[1].lstrip("/") if len(bucket_and_o) == 2 else ""
        if method == "GET":
            return Call(GET, key)
        if method in ("POST", "PUT"):
            return Call(PUT, query.get("name", [key])[0])
        return Call(OTHER, key)
    parts = path.lstrip("/").split("/", 1)  # S3 path style: /bucket/key
    key = parts[1] if len(parts) == 2 else ""
    if method == "GET" and "list-type" in query:
        return Call(LIST, prefix)
    if method == "GET" and key:
        return Call(GET, key)
    if method == "PUT" and key:
        return Call(PUT, key)
    if method == "HEAD":
        return Call(HEAD, key)
    return Call(OTHER, key)


@dataclass
class HttpCalls:
    """The SDK requests of this process while recording (thread-safe; see the module doc)."""

    calls: list[Call] = field(default_factory=list)
    _on: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def install(self) -> None:
        """Wrap urllib3's HTTPConnectionPool.urlopen (once per process)."""
        from urllib3 import connectionpool

        pool = connectionpool.HTTPConnectionPool
        inner = pool.urlopen
        if getattr(inner, "ct_meter", None) is not None:
            inner.ct_meter.append(self)  # type: ignore[attr-defined]
            return
        meters = [self]

        def urlopen(conn: object, method: str, url: str, *args: object, **kwargs: object) -> object:
            for meter in meters:
                meter._record(method, url)
            return inner(conn, method, url, *args, **kwargs)

        urlopen.ct_meter = meters  # type: ignore[attr-defined]
        pool.urlopen = urlopen  # type: ignore[method-assign,assignment]

    def _record(self, method: str, url: str) -> None:
        if self._on:
            call = classify(method.upper(), url)
            with self._lock:
                self.calls.append(call)

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[Call]]:
        """Record the requests sent inside the block into the list it yields."""
        with self._lock:
            self.calls = []
        self._on = True
        try:
            yield self.calls
        finally:
            self._on = False


def by_kind(calls: list[Call]) -> Counter[str]:
    """Calls per kind (LIST, GET, ...)."""
    return Counter(c.kind for c in calls)


def object_calls(calls: Counter[str]) -> Counter[str]:
    """Only the object API's calls (LIST, GET, PUT, HEAD): what the reader's design decides."""
    return Counter({k: v for k, v in calls.items() if k in OBJECT_CALLS})


def dollars_per_1000_polls(lists: float, gets: float, cloud: str) -> float:
    """The request charge of 1,000 polls that each make `lists` LIST and `gets` GET calls."""
    per_list, per_get = PRICES[cloud]
    return lists * per_list + gets * per_get


def pages(objects: int, cloud: str) -> int:
    """LIST calls one listing of `objects` keys takes on `cloud` (a page is at most
    PAGE_ITEMS)."""
    return max(1, math.ceil(objects / PAGE_ITEMS[cloud]))


def old_runstate() -> types.ModuleType:
    """The RunReader module of commit OLD_COMMIT, loaded from `git show` (not kept in the tree).
    Raises CalledProcessError outside a git checkout."""
    text = subprocess.run(
        ["git", "show", f"{OLD_COMMIT}:cloudtrain/state/runstate.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = types.ModuleType("runstate_11bd739")
    module.__file__ = f"git:{OLD_COMMIT}:cloudtrain/state/runstate.py"
    import sys

    sys.modules[module.__name__] = module  # dataclasses resolve annotations through it
    exec(compile(text, module.__file__, "exec"), module.__dict__)
    return module
