"""`down` never deletes what is not the run's (issue 29), on AWS through the real boto3 on moto:
a node forges a journal entry naming a role of the account; a fresh machine's `down` (which
replays the journal) must leave that role alone, and so must a teardown whose ledger holds such a
name some other way (an old ledger, a bug): each delete by name reads the entity's tags first.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.unit.aws_kit import REGION, aws

__all__ = ["aws"]  # the fixture, for pytest

RUN = "mnist-0a1b2c"
BUCKET = "cloudtrain-123456789012-us-east-1"  # moto's account: the provider's default bucket
STORE = f"s3://{BUCKET}"
TRUST = json.dumps(
    {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:*"}
        ],
    }
)


def roles(iam: Any) -> set[str]:
    return {r["RoleName"] for r in iam.list_roles()["Roles"]}


def setup_run(home: Path) -> tuple[Any, Any]:
    """The laptop's run on AWS: its identity and group made, its journal in the bucket; and two
    roles of the account that are not the run's: an untagged `prod-admin`, and another run's
    `cloudtrain-cifar-3d4e5f` (tagged with that run). Returns (provider, laptop ledger)."""
    from cloudtrain.providers import get_provider
    from cloudtrain.providers.base import ProviderConfig, RunInfo
    from cloudtrain.state.journal import Journal
    from cloudtrain.state.ledger import Ledger

    prov = get_provider("aws", ProviderConfig("aws", region=REGION))
    store = prov.store(STORE)
    store.ensure_bucket()
    iam = boto3.client("iam", region_name=REGION)
    iam.create_role(RoleName="prod-admin", AssumeRolePolicyDocument=TRUST)
    iam.create_role(
        RoleName="cloudtrain-cifar-3d4e5f",
        AssumeRolePolicyDocument=TRUST,
        Tags=[{"Key": "cloudtrain:run", "Value": "cifar-3d4e5f"}],
    )
    led = Ledger(home / "ledger.db")
    journal = Journal(store, RUN, "laptop")
    led.journal_to(RUN, journal)
    led.create_run(RUN, "mnist", "aws", REGION, None, None, STORE, None)
    info = RunInfo(RUN, REGION, None, (2222, 2232), store_uri=STORE, nodes=("worker-0",))
    for res in prov.compute.planned_network(info):
        led.record_intent(res)
    for res in prov.compute.ensure_network(info):
        led.mark_created(RUN, res.kind, res.id, res.cloud_id)
    led.set_status(RUN, "running")
    journal.close()
    return prov, led


def forged_role(name: str, seq: int) -> tuple[str, bytes]:
    from cloudtrain.jobs.protocol import journal_prefix
    from cloudtrain.state.journal import entry_key

    entry = {
        "op": "record_intent",
        "at": time.time(),
        "run_id": RUN,
        "provider": "aws",
        "kind": "iam-role",
        "resource_id": name,
        "region": REGION,
        "cloud_id": None,
        "price_hourly": 0.0,
    }
    key = journal_prefix(RUN) + entry_key(time.time_ns(), seq, "node")
    return key, json.dumps(entry).encode()


def test_down_from_a_fresh_machine_leaves_a_role_a_node_named_in_the_journal(
    aws: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cloudtrain import api

    prov, _ = setup_run(tmp_path / "laptop")
    store = prov.store(STORE)
    for seq, name in enumerate(("prod-admin", "cloudtrain-cifar-3d4e5f"), 1):
        store.put(*forged_role(name, seq))
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path / "fresh"))
    said: list[str] = []
    report = api.down(RUN, provider="aws", region=REGION, say=said.append)
    left = roles(boto3.client("iam", region_name=REGION))
    assert {"prod-admin", "cloudtrain-cifar-3d4e5f"} <= left, said
    assert not [r for r in left if r.startswith(f"cloudtrain-{RUN}")]  # the run's own went
    assert not any("prod-admin" in r for r in report.resources_deleted)


def test_teardown_refuses_a_foreign_name_its_ledger_holds(aws: None, tmp_path: Path) -> None:
    from cloudtrain.providers.base import Resource
    from cloudtrain.run.teardown import teardown

    prov, led = setup_run(tmp_path / "laptop")
    led.journal_to(RUN, None)
    # in the ledger without a journal (an old ledger, a bug): the delete itself must refuse
    for kind, name in (
        ("iam-role", "prod-admin"),
        ("iam-role", "cloudtrain-cifar-3d4e5f"),
        ("instance-profile", "prod-admin"),
        ("controller-role", "prod-admin"),
    ):
        led.record_intent(Resource("aws", kind, name, REGION, RUN))
    said: list[str] = []
    report = teardown(prov, led, RUN, said.append)
    left = roles(boto3.client("iam", region_name=REGION))
    assert {"prod-admin", "cloudtrain-cifar-3d4e5f"} <= left
    assert not [r for r in left if r.startswith(f"cloudtrain-{RUN}")]
    refused = [e.message for e in led.events(RUN) if e.kind == "refused"]
    assert any("prod-admin" in m for m in refused), led.events(RUN)
    assert any("cloudtrain-cifar-3d4e5f" in m for m in refused)
    assert "iam-role/prod-admin" not in report.resources_deleted
    # the refused rows leave the run's record, so the next `down` is quiet and complete
    live = {(r.kind, r.resource_id) for r in led.resources(RUN, live_only=True)}
    assert ("iam-role", "prod-admin") not in live
    again = teardown(prov, led, RUN, said.append)
    assert again.resources_deleted == []
