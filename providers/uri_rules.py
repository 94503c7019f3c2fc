"""The shape of a bucket URI, one rule per scheme, for the spec and the stores alike. Stdlib only.

`cloudtrain/jobspec/job.py` checks `checkpoint:` with `checkpoint_problem` (so a bad URI is a
`file:line: checkpoint:` error before anything exists), and each store checks the URI it is built
with by the same function of its scheme (`providers/local.py`, `providers/aws/storage.py`,
`providers/gcp/storage.py`, `providers/azure/storage.py`). No SDK is imported: `plan` and
`--help` stay light, and the nodes (which open their store by URI) run it on Python 3.10.

Every function returns what is wrong in one line, or None. The URIs:
- `file:///ABSOLUTE/PATH` (host empty or `localhost`), percent-encoding allowed;
- `slurm:///ABSOLUTE/PATH` (no host: the cluster is the provider's login host), a folder on a
  Slurm cluster's shared filesystem, by the same path rules, but never `/` itself;
- `s3://BUCKET[/PREFIX]`, `gs://BUCKET[/PREFIX]`, `az://ACCOUNT/CONTAINER[/PREFIX]`.
None may hold a query or fragment (`?`, `#`: a URL parser would drop them silently; encode them
as %3F and %23), a `..` segment, or a control character (they end up in HTTP paths and headers,
and in file names).
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Iterator, Mapping


class _Schemes(Mapping[str, str]):
    """Provider name -> the URI scheme of its store, as each provider's INFO declares it. Read
    from the registry when asked, not at import: local.py imports this module, and the registry
    imports local.py for its INFO."""

    def _map(self) -> dict[str, str]:
        from cloudtrain.providers.registry import infos

        return {i.name: i.scheme for i in infos()}

    def __getitem__(self, name: str) -> str:
        return self._map()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._map())

    def __len__(self) -> int:
        return len(self._map())


SCHEMES: Mapping[str, str] = _Schemes()  # provider -> scheme
_URI_RE = re.compile(r"^(?P<scheme>[a-z0-9]+)://(?P<rest>.*)$", re.DOTALL)

# Linux: PATH_MAX 4096 bytes with the NUL, NAME_MAX 255 bytes per name (<linux/limits.h>)
PATH_MAX = 4096
NAME_MAX = 255
# Object keys are at most 1024 bytes on all three clouds (S3: "Naming objects", GCS: "Object
# naming requirements", Azure: "Naming and referencing containers, blobs, and metadata");
# cloudtrain's own keys under the prefix (cloudtrain/runs/<run id>/checkpoints/...) need room.
MAX_PREFIX_BYTES = 512

# S3 general purpose buckets, "Bucket naming rules" (docs.aws.amazon.com/AmazonS3/latest/
# userguide/bucketnamingrules.html): 3-63 characters of a-z, 0-9, '.' and '-', beginning and
# ending with a letter or digit, no '..', not an IPv4 address, and the reserved prefixes and
# suffixes below.
_S3_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_S3_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_S3_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
# Cloud Storage, "Bucket naming requirements" (cloud.google.com/storage/docs/buckets#naming):
# a-z, 0-9, '-', '_' and '.', beginning and ending with a letter or digit; 3-63 characters, or
# up to 222 with dots and then at most 63 between dots; not an IPv4 address; not beginning with
# "goog" nor containing "google" (or a close misspelling such as "g00gle").
_GCS_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_GOOGLE_RE = re.compile(r"g[o0][o0]g[l1]e")
# Azure, "Naming rules for Azure resources", Microsoft.Storage (learn.microsoft.com/azure/
# azure-resource-manager/management/resource-name-rules): a storage account is 3-24 characters
# of a-z and 0-9. "Naming and referencing containers, blobs, and metadata" (learn.microsoft.com/
# rest/api/storageservices/): a container is 3-63 characters of a-z, 0-9 and '-', beginning
# with a letter or digit, and every '-' between two letters or digits.
_ACCOUNT_RE = re.compile(r"^[a-z0-9]{3,24}$")
_CONTAINER_RE = re.compile(r"^[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}$")


def _control(text: str) -> int | None:
    """The position (1-based) of the first control character (C0, DEL, C1) in `text`."""
    for pos, ch in enumerate(text, 1):
        if ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F:
            return pos
    return None


def _is_ipv4(name: str) -> bool:
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        return False
    return True


def s3_bucket_problem(bucket: str) -> str | None:
    """What breaks S3's bucket naming rules in `bucket`, or None. Pure."""
    if not _S3_RE.match(bucket):
        return (
            "an S3 bucket name is 3-63 characters of a-z, 0-9, '.' and '-', beginning and"
            " ending with a letter or digit"
        )
    if ".." in bucket:
        return "an S3 bucket name has no two periods in a row"
    if _is_ipv4(bucket):
        return "an S3 bucket name is not an IP address"
    if bucket.startswith(_S3_PREFIXES) or bucket.endswith(_S3_SUFFIXES):
        return "S3 reserves that prefix or suffix of bucket names (xn--, sthree-, -s3alias...)"
    return None


def gcs_bucket_problem(bucket: str) -> str | None:
    """What breaks Cloud Storage's bucket naming rules in `bucket`, or None. Pure."""
    if not _GCS_RE.match(bucket):
        return (
            "a GCS bucket name is 3-63 characters (222 with dots) of a-z, 0-9, '-', '_' and"
            " '.', beginning and ending with a letter or digit"
        )
    if any(not 0 < len(part) <= 63 for part in bucket.split(".")):
        return "a GCS bucket name is at most 63 characters, or 63 between dots"
    if _is_ipv4(bucket):
        return "a GCS bucket name is not an IP address"
    if bucket.startswith("goog") or _GOOGLE_RE.search(bucket):
        return "a GCS bucket name may not begin with 'goog' or contain 'google'"
    return None


def azure_container_problem(account: str, container: str) -> str | None:
    """What breaks Azure's naming rules in a storage account and container, or None. Pure."""
    if not _ACCOUNT_RE.match(account):
        return "an Azure storage account name is 3-24 characters of a-z and 0-9"
    if not _CONTAINER_RE.match(container):
        return (
            "an Azure container name is 3-63 characters of a-z, 0-9 and '-', beginning with a"
            " letter or digit, every '-' between two letters or digits"
        )
    return None


def _prefix_problem(prefix: str) -> str | None:
    """What is wrong with an object-key prefix (already percent-decoded), or None."""
    pos = _control(prefix)
    if pos:
        return f"the prefix has a control character at character {pos}"
    if ".." in prefix.split("/") or "." in prefix.split("/"):
        return "must not contain '..' or '.' path segments"
    try:
        size = len(prefix.encode("utf-8"))
    except UnicodeEncodeError:
        return "the prefix is not valid UTF-8 (a lone surrogate)"
    if size > MAX_PREFIX_BYTES:
        return f"the prefix is {size} bytes; at most {MAX_PREFIX_BYTES} (object keys are 1 KiB)"
    return None


def file_path_problem(path: str) -> str | None:
    """What is wrong with the (percent-decoded) path of a file:// URI, or None. Pure."""
    if not path.startswith("/"):
        return "a file:// URI names an absolute path: file:///PATH"
    if "\x00" in path:
        return "a path cannot hold a NUL byte"
    if ".." in path.split("/"):
        return "must not contain '..' path segments"
    try:
        raw = path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return "the path is not valid UTF-8 (a lone surrogate)"
    if len(raw) >= PATH_MAX:
        return f"the path is {len(raw)} bytes; Linux takes at most {PATH_MAX - 1} (PATH_MAX)"
    if any(len(name) > NAME_MAX for name in raw.split(b"/")):
        return f"a folder name in the path is over {NAME_MAX} bytes (Linux's NAME_MAX)"
    return None


def split_uri(uri: str) -> tuple[str, str, str]:
    """`(scheme, location, prefix)` of a bucket URI: location is the bucket (s3, gs), the
    `account/container` (az) or '' (file); prefix is percent-decoded and without slashes at
    either end (file: the whole decoded path). Raises ValueError when it is no URI. Pure."""
    m = _URI_RE.match(uri)
    if not m:
        raise ValueError("not a URI")
    scheme, rest = m["scheme"], m["rest"]
    host, slash, path = rest.partition("/")
    if scheme == "file":
        if host not in ("", "localhost"):
            raise ValueError("a file:// URI has no host but localhost: file:///PATH")
        return scheme, "", urllib.parse.unquote(slash + path)
    if scheme == "slurm":
        if host:
            raise ValueError("a slurm:// URI has no host (the login host is the provider's): "
                             "slurm:///PATH")  # fmt: skip
        return scheme, "", urllib.parse.unquote(slash + path)
    if scheme == "az":
        container, _, path = path.partition("/")
        host = f"{host}/{container}"
    return scheme, host, urllib.parse.unquote(path).strip("/")


def uri_problem(uri: str, scheme: str | None = None) -> str | None:
    """What is wrong with the bucket URI `uri` (of `scheme` if given), by its scheme's naming
    rules, or None. The one rule both the spec and the stores apply. Pure."""
    m = _URI_RE.match(uri)
    known = ", ".join(f"{s}://" for s in SCHEMES.values())
    if not m or m["scheme"] not in SCHEMES.values():
        return f"must be a {known.replace(', az', ' or az')} URI"
    if scheme is not None and m["scheme"] != scheme:
        return f"must be a {scheme}:// URI"
    pos = _control(uri)
    if pos:
        return f"has a control character at character {pos}"
    if "?" in uri or "#" in uri:
        return "must not contain '?' or '#' (a URL's query or fragment): encode them as %3F, %23"
    try:
        scheme, location, prefix = split_uri(uri)
    except ValueError as exc:
        return str(exc)
    if scheme == "file":
        return file_path_problem(prefix)
    if scheme == "slurm":
        if not prefix.strip("/"):
            return "a bucket is a folder under /, not / itself: slurm:///PATH"
        return file_path_problem(prefix)
    if scheme == "s3":
        problem = s3_bucket_problem(location)
    elif scheme == "gs":
        problem = gcs_bucket_problem(location)
    else:
        problem = azure_container_problem(*location.split("/", 1))
    return problem or _prefix_problem(prefix)


def bucket_schemes(provider: str) -> tuple[str, ...]:
    """The schemes a run of `provider` may keep its bucket at: its store's own, then the other
    stores' its INFO names (`other_schemes`); none for a provider this version does not know.
    Pure."""
    from cloudtrain.providers.registry import declared

    info = declared(provider)
    return tuple(s for s in (info.scheme, *info.other_schemes) if s)


def checkpoint_problem(uri: str, provider: str | None) -> str | None:
    """What is wrong with `uri` as the spec's `checkpoint:` for `provider` (None: local), as
    the spec says it, with the value shown. Pure."""
    got = repr(uri if len(uri) <= 40 else uri[:37] + "...")
    if provider == "cheapest":
        return (
            f"cannot be set with provider 'cheapest' (got {got}): a checkpoint URI belongs to"
            " one cloud; remove it (the chosen cloud's run bucket is used), or set provider to"
            " aws, gcp or azure"
        )
    m = _URI_RE.match(uri)
    if not m or m["scheme"] not in SCHEMES.values():
        known = [f"{scheme}://" for scheme in SCHEMES.values()]
        return f"must be a {', '.join(known[:-1])} or {known[-1]} URI (got {got})"
    schemes = bucket_schemes(provider or "local")
    if m["scheme"] not in schemes:  # a provider's store opens its own scheme (and those named)
        named = [f"{s}://" for s in schemes] or ["no"]
        known = f"{', '.join(named[:-1])} or {named[-1]}" if len(named) > 1 else named[0]
        return f"provider {provider!r} keeps checkpoints at {known} URIs (got {got})"
    problem = uri_problem(uri)
    return f"{problem} (got {got})" if problem else None
