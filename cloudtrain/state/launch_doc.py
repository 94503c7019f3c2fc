"""control/launch.json: what a controller needs to adopt a run it did not start (issue 17).

The laptop writes it before it creates the controller node; the controller node and
`cloudtrain attach` read it. With the run's journal (cloudtrain/state/journal.py: the run's ledger
row, plan, provider options, resources) it is enough to rebuild the Orchestrator anywhere:
- the spec as the laptop validated it, without its env (the values, secrets included, travel only
  in cluster.json, and are blanked there at teardown) and with `workdir: .` (the bundle in the
  bucket is the workdir now);
- the run's options (RunOptions), its start, the bundle's sha256 and the controller node's name
  and $/h.
Holds no secret; signed with the run's key (cloudtrain/state/run_key.py). Pure but for
`write`/`read`.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain.core.errors import UsageError
from cloudtrain.jobs import protocol
from cloudtrain.jobs.bucket_reads import LAUNCH_MAX_BYTES
from cloudtrain.jobs.protocol import ClusterDoc
from cloudtrain.jobs.protocol_base import (
    ProtocolError,
    load_json,
    read_integer,
    read_number,
    read_object,
    read_text,
)
from cloudtrain.jobspec.run_options import RunOptions
from cloudtrain.providers.base import ObjectStore

if TYPE_CHECKING:
    from cloudtrain.jobspec.job import JobSpec

VERSION = 1
# how each field of LaunchDoc (as annotated) is read from JSON: of its type, or refused
_READERS: dict[str, Callable[[Any], Any]] = {
    "str": read_text,
    "float": read_number,
    "int": read_integer,
    "dict[str, Any]": read_object,
}


@dataclass(frozen=True)
class LaunchDoc:
    """The run as a controller adopts it (see the module)."""

    run_id: str
    spec: dict[str, Any]  # JobSpec.model_dump(json) without env, workdir "."
    options: dict[str, Any]  # RunOptions as fields
    started: float
    bundle_sha256: str
    store_uri: str
    controller: str = ""  # the controller node's name ("" while attached)
    controller_hourly_usd: float = 0.0
    version: int = VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        spec: JobSpec,
        run_id: str,
        options: RunOptions,
        started: float,
        bundle_sha256: str,
        store_uri: str,
        controller: str = "",
        controller_hourly_usd: float = 0.0,
    ) -> LaunchDoc:
        """The document for a run of `spec`. Pure."""
        data = spec.model_dump(mode="json", exclude_unset=True, by_alias=True)
        data.pop("env", None)
        data["workdir"] = "."
        return cls(
            run_id,
            data,
            dataclasses.asdict(options),
            started,
            bundle_sha256,
            store_uri,
            controller,
            controller_hourly_usd,
        )

    def to_json(self) -> bytes:
        """The bytes the bucket holds. Pure."""
        return json.dumps(dataclasses.asdict(self), indent=1).encode()

    @classmethod
    def from_json(cls, body: bytes) -> LaunchDoc:
        """Parse the bucket's bytes by the protocol's rule (`load_json`: at most
        LAUNCH_MAX_BYTES, 32 levels deep, finite numbers), each field of its type (unknown
        fields ignored, a null one its default). UsageError naming what is wrong when it is
        unreadable, ill-typed or lacks a field. Pure."""
        what = "control/launch.json"
        try:
            data = read_object(load_json(body, what=what, max_bytes=LAUNCH_MAX_BYTES))
        except (ProtocolError, TypeError) as exc:
            raise UsageError(f"{what} is unreadable: {exc}") from None
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if data.get(f.name) is None:
                continue
            try:
                values[f.name] = _READERS[str(f.type)](data[f.name])
            except (TypeError, ValueError) as exc:
                raise UsageError(f"{what}: {f.name} is unreadable: {exc}") from None
        try:
            return cls(**values)
        except TypeError as exc:  # a field without a default is missing
            raise UsageError(f"{what} is unreadable: {exc}") from None

    def run_options(self) -> RunOptions:
        """The run's options (fields a newer writer added are ignored). Pure."""
        names = {f.name for f in dataclasses.fields(RunOptions)}
        return RunOptions(**{k: v for k, v in self.options.items() if k in names})

    def job_spec(self, cluster: ClusterDoc) -> JobSpec:
        """The spec, its env taken back from the run's cluster document (secrets as secret
        entries). Raises SpecError when it no longer validates (a newer writer's spec)."""
        import yaml

        from cloudtrain.jobspec.job import load_spec_text

        data = dict(self.spec)
        secrets = set(cluster.secrets)
        data["env"] = {
            k: ({"value": v, "secret": True} if k in secrets else v) for k, v in cluster.env.items()
        }
        with tempfile.TemporaryDirectory(prefix="ct-launch-") as base:
            # the workdir is the bundle in the bucket: "." only has to exist while validating
            return load_spec_text(
                yaml.safe_dump(data), protocol.launch_key(self.run_id), base_dir=Path(base)
            )


def write(store: ObjectStore, doc: LaunchDoc, key: bytes | None = None) -> None:
    """Put the document in the run's bucket, signed with the run's `key`
    (cloudtrain/state/run_key.py:
    a node cannot rewrite the spec or the options a controller adopts; None: the bucket's
    control/key, which the run's journal put there; with none, the document goes unsigned and
    every reader refuses it). Pass the ledger's key where the caller has it. Idempotent;
    blocks."""
    from cloudtrain.state import run_key

    key = key if key is not None else run_key.fetch(store, doc.run_id)
    data = dataclasses.asdict(doc)
    signed = data if key is None else run_key.sign_doc(key, run_key.LAUNCH, data)
    store.put(protocol.launch_key(doc.run_id), json.dumps(signed, indent=1).encode())


def read(store: ObjectStore, run_id: str, key: bytes | None = None) -> LaunchDoc:
    """The run's launch document, checked against the run's `key` (None: the bucket's
    control/key; pass the ledger's where the caller has it, `Ledger.run_key`). UsageError when
    the run has none (started before managed runs, or not by cloudtrain), when there is no key
    to check it with, when it is over LAUNCH_MAX_BYTES (no more is read), too deep or not
    JSON, or when its MAC is missing or wrong (a node wrote it). Blocks."""
    from cloudtrain.core.errors import NotFound, TooLarge
    from cloudtrain.state import run_key

    where = f"{protocol.launch_key(run_id)} in {store.uri}"
    try:
        body = store.get(protocol.launch_key(run_id), max_bytes=LAUNCH_MAX_BYTES)
    except TooLarge:
        raise _not_adopted(run_id, f"{where} holds more than {LAUNCH_MAX_BYTES} bytes") from None
    except NotFound:
        raise UsageError(
            f"run {run_id} has no control/launch.json in {store.uri}: it was not started by a "
            "cloudtrain that can hand it over",
            hint=f"`cloudtrain down {run_id}` still tears it down",
        ) from None
    key = key if key is not None else run_key.fetch(store, run_id)
    if key is None:
        raise UsageError(
            f"run {run_id} has no key to check {where} with (a run from before launch "
            "documents were signed)",
            hint=f"`cloudtrain down {run_id}` still tears it down",
        )
    try:
        data = load_json(body, what=where, max_bytes=LAUNCH_MAX_BYTES)
    except ProtocolError as exc:
        raise _not_adopted(run_id, str(exc)) from None
    if not run_key.verify_doc(key, run_key.LAUNCH, data):
        why = f"{where} has no valid MAC under the run's {run_key.key_id(key)}"
        raise _not_adopted(run_id, why)
    return LaunchDoc.from_json(body)


def _not_adopted(run_id: str, why: str) -> UsageError:
    """The error of a launch document a controller did not write as it is. Pure."""
    return UsageError(
        f"{why}: not written by a controller of the run (a node may have rewritten it); "
        "not adopting it",
        hint=f"`cloudtrain down {run_id}` still tears the run down",
    )
