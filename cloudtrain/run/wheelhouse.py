"""The wheelhouse: the pinned node stack's wheels, kept in the run's bucket for every later run.

A bare image's node pip-installs tensorflow and tf-keras (and all they pull in) from the index:
minutes on every node of every run. The first node of a run that finds no wheelhouse for its
platform builds one while it installs (`pip wheel`, then `pip install --no-index` from it) and
publishes it; every node of every later run on that platform fetches the one tar, checks its
sha256 and installs with no index at all. The script's side is in jobs/startup.sh.j2 (the python
phase); this module is the controller's side: which offer each node's script gets.

Layout (ARCHITECTURE.md, "The bucket"): `cloudtrain/wheelhouse/<tag>/wheels.tar` (one object:
wheels are already compressed) and `cloudtrain/wheelhouse/<tag>/manifest.json`, written LAST by
the publishing node (the tar's sha256 and size, the pins, the file list), so a manifest always
describes a whole tar. The tag is `py<X.Y>-<machine>-<hash>`: the node's Python, its `uname -m`,
and the first 12 hex digits of the sha256 of the pins (one requirement a line), so a change of a
pin or of the CUDA extra never reuses old wheels. The prefix is outside every run's folder: the
bucket is shared per account and region and outlives runs (each provider's default_store_uri).

Trust: the sha256 a node checks comes from the controller (read from the manifest, put in the
startup script), never from the bucket at boot; the tar's URL is a presigned GET of the run's
usual ttl. The publisher gets presigned PUT URLs (the same ttl) for exactly the tar and the
manifest of its tag and nothing else. Offers go only where the stack is installed (a provider
that installs it) and where the image's Python is known; else nothing is offered and the script
installs from the index as before.

`$CLOUDTRAIN_WHEELHOUSE_TAG` names the nodes' tag where the controller cannot know it (an image
it does not know, e.g. a test's Debian 12 AMI; a test harness whose GPU node installs without the
CUDA wheels): every node whose provider installs the stack is then offered that tag. The script
still checks the tag against its own, so a wrong value costs a fallback, never a wrong wheel.
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass

from cloudtrain.core import env
from cloudtrain.core.errors import CloudtrainError, UsageError
from cloudtrain.jobs.bucket_reads import WHEELHOUSE_MANIFEST_MAX_BYTES, Skips, get_bounded
from cloudtrain.jobs.protocol_base import load_json
from cloudtrain.providers.base import NodeRequest, ObjectStore
from cloudtrain.run.startup import TF_KERAS_VERSION, TF_VERSION, WheelhouseOffer, built_stack

ROOT = "cloudtrain/wheelhouse/"
TAR = "wheels.tar"
MANIFEST = "manifest.json"
# Every image cloudtrain knows is amd64 (AWS: the x86_64 DLAMI and Canonical's amd64 AMIs; GCP and
# Azure: their x86_64 Ubuntu/Debian images: providers/*/images.py). The script checks its own
# `uname -m` against the offered tag, so a wrong guess costs a fallback, never a wrong wheel.
IMAGE_MACHINE = "x86_64"
SKIPS = Skips()  # the manifests this process could not read: one warning per key
TAG_ENV = env.WHEELHOUSE_TAG.name
TAG_RE = re.compile(r"^py\d+\.\d+-[A-Za-z0-9_]+-[0-9a-f]{12}$")


def stack_pins(gpu: bool, module: str = "") -> list[str]:
    """The requirements the script installs on a bare image, in its order: TensorFlow (with the
    CUDA wheels on a GPU node) and tf-keras; for a strategy whose `module` has a stack of its own
    (cloudtrain/run/startup.py: BuiltStack), its TensorFlow, its tf-keras if any, and the
    requirement it builds from source (the wheelhouse keeps the built wheel). Pure."""
    stack = built_stack(module)
    version = stack.tf_version if stack else TF_VERSION
    keras = stack.tf_keras_version if stack else TF_KERAS_VERSION
    tf = f"tensorflow[and-cuda]=={version}" if gpu else f"tensorflow=={version}"
    return [tf, *([f"tf-keras=={keras}"] if keras else []), *([stack.build] if stack else [])]


def pins_hash(pins: list[str]) -> str:
    """The first 12 hex digits of the sha256 of the pins, one a line (the script computes the
    same with `printf '%s\\n' ... | sha256sum`). Pure."""
    return hashlib.sha256("".join(p + "\n" for p in pins).encode()).hexdigest()[:12]


def tag(python: str, machine: str, pins: list[str]) -> str:
    """`py3.10-x86_64-<hash>`: the wheelhouse's folder name for a platform and pins. Pure."""
    return f"py{python}-{machine}-{pins_hash(pins)}"


def tar_key(wheel_tag: str) -> str:
    """The wheelhouse's tar object key. Pure."""
    return f"{ROOT}{wheel_tag}/{TAR}"


def manifest_key(wheel_tag: str) -> str:
    """The wheelhouse's manifest object key (written last). Pure."""
    return f"{ROOT}{wheel_tag}/{MANIFEST}"


@dataclass(frozen=True)
class Manifest:
    """What manifest.json says of a published wheelhouse."""

    tag: str
    sha256: str
    size: int
    pins: list[str]
    files: list[str]

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        """Parse a manifest by the protocol's rule (`load_json`: at most
        WHEELHOUSE_MANIFEST_MAX_BYTES, nested at most 32 deep, finite numbers). Raises
        ValueError (a ProtocolError among them) for anything that is not a whole manifest."""
        doc = load_json(data, what="manifest", max_bytes=WHEELHOUSE_MANIFEST_MAX_BYTES)
        if not isinstance(doc, dict):
            raise ValueError("manifest is not a JSON object")
        sha, size = doc.get("sha256"), doc.get("size")
        pins, files = doc.get("pins"), doc.get("files")
        hexdigits = "0123456789abcdef"
        if not (isinstance(sha, str) and len(sha) == 64 and all(c in hexdigits for c in sha)):
            raise ValueError("manifest sha256 is not 64 hex digits")
        if not isinstance(size, int) or size <= 0:
            raise ValueError("manifest size is not a positive integer")
        for name, value in (("pins", pins), ("files", files)):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"manifest {name} is not a list of strings")
        return cls(str(doc.get("tag", "")), sha, size, list(pins), list(files))  # type: ignore[arg-type]


def read_manifest(store: ObjectStore, wheel_tag: str) -> Manifest | None:
    """The manifest of a complete wheelhouse for the tag, or None: no manifest, a malformed one,
    one for another tag or other pins, or a tar that is missing or of another size (a publish
    under way or cut short). A manifest over its cap (at most that much is read), too deep or
    malformed is warned about once (naming its key). Blocks (one get, one list); raises only
    the store's other errors."""
    key = manifest_key(wheel_tag)
    body = get_bounded(store, key, WHEELHOUSE_MANIFEST_MAX_BYTES, SKIPS)
    if body is None:
        return None
    try:
        manifest = Manifest.from_json(body)
    except ValueError as exc:
        SKIPS.skip(key, str(exc))
        return None
    expected_hash = wheel_tag.rsplit("-", 1)[-1]
    if manifest.tag != wheel_tag or pins_hash(manifest.pins) != expected_hash:
        return None
    listed = [o for o in store.list(f"{ROOT}{wheel_tag}/") if o.key == tar_key(wheel_tag)]
    if not listed or listed[0].size != manifest.size:
        return None
    return manifest


def image_python(provider_name: str, request: NodeRequest) -> str | None:
    """The Python (X.Y) of the image the provider boots for this node (its INFO.node_image,
    providers/*/images.py); None where unknown (a custom image, a provider without images, an
    image the provider refuses). Pure but for importing that module."""
    from cloudtrain.providers import registry

    try:
        ref = registry.info(provider_name).node_image
        image = registry.load(ref)(request) if ref else None
    except CloudtrainError:
        return None
    python = getattr(image, "python", None)
    return python if isinstance(python, str) and python else None


class WheelhousePlanner:
    """Decides each node's offer for one run: warm (fetch the published tar) where a manifest
    exists for the node's tag, cold (build and publish) for the first node of a tag that has
    none, and nothing for the rest or where the image's Python is unknown. Thread-safe."""

    def __init__(self, store: ObjectStore, provider_name: str, ttl_s: int) -> None:
        self.store, self.provider_name, self.ttl_s = store, provider_name, ttl_s
        self._published: dict[str, Manifest] = {}  # tag -> manifest found
        self._publishers: set[str] = set()  # tags a node of this run was asked to publish
        self._lock = threading.Lock()

    def offer_for(self, request: NodeRequest, module: str = "") -> WheelhouseOffer | None:
        """The offer for one node whose strategy needs `module` on the image ("": none), or
        None. Blocks (a manifest read per tag until one exists, one presign). Idempotent but for
        the publisher: a tag's first asker in this planner."""
        forced = env.WHEELHOUSE_TAG.text()
        if forced:
            if not TAG_RE.match(forced):
                raise UsageError(
                    f"{TAG_ENV}={forced!r} is not a wheelhouse tag",
                    hint="py<X.Y>-<uname -m>-<12 hex digits>: see cloudtrain.run.wheelhouse.tag()",
                )
            return self.offer_for_tag(forced)
        python = image_python(self.provider_name, request)
        if python is None:
            return None
        pins = stack_pins(request.accelerator_count > 0, module)
        return self.offer_for_tag(tag(python, IMAGE_MACHINE, pins))

    def offer_for_tag(self, wheel_tag: str) -> WheelhouseOffer | None:
        """The offer for a node whose platform has this tag (see `offer_for`); None also when
        the store cannot be read: the node then installs from the index, as without one."""
        with self._lock:
            try:
                manifest = self._published.get(wheel_tag) or read_manifest(self.store, wheel_tag)
            except CloudtrainError:  # unreadable (denied, unreachable): an optimisation, skipped
                return None
            if manifest is not None:
                self._published[wheel_tag] = manifest
                url = self.store.presign_get(tar_key(wheel_tag), self.ttl_s)
                return WheelhouseOffer("warm", wheel_tag, url=url, sha256=manifest.sha256)
            if wheel_tag in self._publishers:
                return None
            self._publishers.add(wheel_tag)
        return WheelhouseOffer(
            "cold",
            wheel_tag,
            put_url=self.store.presign_put(tar_key(wheel_tag), self.ttl_s),
            manifest_put_url=self.store.presign_put(manifest_key(wheel_tag), self.ttl_s),
        )
