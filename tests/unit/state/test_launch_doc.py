"""control/launch.json (cloudtrain/state/launch_doc.py): what a controller needs to adopt a run,
with no secret in it, and the spec rebuilt from it with the env the run's cluster.json carries."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cloudtrain.core.errors import UsageError
from cloudtrain.jobs.protocol import ClusterDoc
from cloudtrain.jobspec.job import load_spec_text
from cloudtrain.jobspec.run_options import RunOptions
from cloudtrain.providers.local import LocalStore
from cloudtrain.state.launch_doc import LaunchDoc, read, write
from cloudtrain.state.run_key import generate

SPEC = """\
name: adopt-me
cluster:
  strategy: multi_worker_mirrored
  workers: 2
  spot: true
workdir: .
entrypoint: python train.py --epochs 3
max_hours: 2
max_cost_usd: 9.5
max_restarts: 4
env:
  PLAIN: "1"
  TOKEN: {value: s3cr3t-value, secret: true}
"""


def test_the_document_holds_no_secret_and_rebuilds_the_spec(tmp_path: Path) -> None:
    spec = load_spec_text(SPEC, "job.yaml", base_dir=tmp_path)
    options = RunOptions.for_provider("local", detach=True)
    doc = LaunchDoc.of(spec, "adopt-me-1a2b3c", options, 1_800_000_000.0, "ab" * 32, "file:///b")
    body = doc.to_json()
    assert b"s3cr3t" not in body and b"PLAIN" not in body  # env travels in cluster.json only
    again = LaunchDoc.from_json(body)
    assert again == doc
    assert again.run_options() == options
    cluster = ClusterDoc(env={"PLAIN": "1", "TOKEN": "s3cr3t-value"}, secrets=["TOKEN"])
    rebuilt = again.job_spec(cluster)
    assert rebuilt.env_values() == spec.env_values()
    assert rebuilt.secret_names() == ["TOKEN"]
    for field in ("name", "entrypoint", "max_hours", "max_cost_usd", "max_restarts"):
        assert getattr(rebuilt, field) == getattr(spec, field)
    assert rebuilt.cluster == spec.cluster


def test_unknown_fields_of_a_newer_writer_are_ignored(tmp_path: Path) -> None:
    spec = load_spec_text(SPEC, "job.yaml", base_dir=tmp_path)
    doc = LaunchDoc.of(spec, "r-1", RunOptions(), 1.0, "cd" * 32, "file:///b")
    data = dataclasses.asdict(doc)
    data["options"]["a_knob_from_the_future"] = 3
    again = LaunchDoc.from_json(json.dumps({**data, "new_field": 1}).encode())
    assert again.run_options() == RunOptions()


def test_a_run_without_a_launch_document_is_a_clear_error(tmp_path: Path) -> None:
    store = LocalStore("file://" + str(tmp_path / "bucket"))
    with pytest.raises(UsageError, match=r"no control/launch\.json"):
        read(store, "r-1")
    spec = load_spec_text(SPEC, "job.yaml", base_dir=tmp_path)
    doc = LaunchDoc.of(spec, "r-1", RunOptions(), 1.0, "cd" * 32, store.uri)
    key = generate()
    write(store, doc, key)  # signed with the run's key (cloudtrain/state/run_key.py)
    assert read(store, "r-1", key) == doc
