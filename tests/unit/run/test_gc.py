"""`cloudtrain gc`: which runs it collects (done and unknown ones; live ones only past their
deadline; global-only ones only when the ledger places them here), the table's ages and prices,
the deletion, and the command itself on the local provider through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from cloudtrain.catalog.offers import Catalog, Offer
from cloudtrain.core.errors import ProviderError, TransientError, UsageError
from cloudtrain.providers.base import NodeRequest, ProviderConfig, RunInfo, Tagged
from cloudtrain.providers.faults import FaultPlan, FaultyCompute
from cloudtrain.run import gc
from cloudtrain.state.ledger import Ledger, RunRecord
from tests.fakes.memory_provider import MemoryProvider
from tests.unit.cli.test_cli import cli

NOW = 1_800_000_000.0
HEAVY = ("tensorflow", "boto3", "botocore", "google.cloud", "azure", "tf_keras")
SLEEPER = "#!/usr/bin/env bash\nsleep 300\n"


class Clock:
    """A settable clock for the ledger's and the fake cloud's timestamps."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def add_run(
    ledger: Ledger,
    clock: Clock,
    run_id: str,
    status: str,
    created: float,
    max_hours: float | None = 2.0,
    provider: str = "memory",
    region: str | None = "mem-1",
) -> None:
    clock.now = created
    plan = json.dumps({"max_hours": max_hours}) if max_hours is not None else None
    ledger.create_run(run_id, run_id, provider, region, None, None, None, plan)
    if status != "planned":
        ledger.set_status(run_id, status, "succeeded" if status == "done" else None)


def make_run(provider: MemoryProvider, run_id: str, itype: str = "m.large") -> None:
    run = RunInfo(run_id, "mem-1", None, (2222, 2230))
    provider.compute.ensure_network(run)
    provider.compute.create_nodes(
        run, [NodeRequest(run_id, role, 0, itype, "x") for role in ("chief", "worker")]
    )


@pytest.fixture
def world(tmp_path: Path) -> tuple[MemoryProvider, Ledger, Clock]:
    """Five runs in the cloud, made two hours ago; the ledger knows four of them."""
    clock = Clock(NOW - 7200)
    provider = MemoryProvider()
    provider.compute.clock = clock
    for run_id in ("done-1", "live-1", "late-1", "noplan-1", "lost-1"):
        make_run(provider, run_id)
    ledger = Ledger(tmp_path / "ledger.db", clock=clock)
    add_run(ledger, clock, "done-1", "done", NOW - 7200)
    add_run(ledger, clock, "live-1", "running", NOW - 3600)  # deadline in an hour
    add_run(ledger, clock, "late-1", "running", NOW - 10 * 3600)  # deadline 8 h ago
    add_run(ledger, clock, "noplan-1", "provisioning", NOW - 10 * 3600, max_hours=None)
    clock.now = NOW
    return provider, ledger, clock


def test_done_unknown_and_overdue_runs_are_leaked_live_ones_are_not(
    world: tuple[MemoryProvider, Ledger, Clock],
) -> None:
    provider, ledger, _ = world
    found = gc.survey(provider, ledger, gc.Scope("memory"), now=NOW)
    states = {r.run_id: r.state for r in found.leaked}
    assert states == {"done-1": "done", "late-1": "running, past deadline", "lost-1": "unknown"}
    live = {r.run_id: r.reason for r in found.live}
    assert set(live) == {"live-1", "noplan-1"}
    assert "deadline in 1h 0m" in live["live-1"]
    assert "no deadline" in live["noplan-1"]
    assert found.where == "memory mem-1"
    done = next(r for r in found.leaked if r.run_id == "done-1")
    assert [(t.kind, t.id) for t in done.items] == [
        ("node", "ct-done-1-chief-0"),
        ("node", "ct-done-1-worker-0"),
        ("firewall", "ct-done-1-fw"),
    ]
    assert provider.compute.calls["delete_node"] == 0, "a survey deletes nothing"


def test_a_run_just_past_its_deadline_waits_out_the_grace_period(tmp_path: Path) -> None:
    clock = Clock(NOW)
    ledger = Ledger(tmp_path / "ledger.db", clock=clock)
    add_run(ledger, clock, "r", "running", NOW - 2 * 3600 - 60, max_hours=2.0)
    rec = ledger.get_run("r")
    state, reason = gc.ledger_state(rec, NOW)
    assert state is None and "within the grace period" in reason
    assert gc.ledger_state(rec, NOW + gc.DEADLINE_GRACE_S)[0] == "running, past deadline"
    assert gc.deadline(rec) == pytest.approx(NOW - 60)


def test_a_plan_without_a_usable_max_hours_gives_no_deadline() -> None:
    def rec(plan_json: str | None) -> RunRecord:
        fields = ("r", "r", "aws", None, None, None, None, None, plan_json, "running", None)
        return RunRecord(*fields, NOW, None, None)

    for plan in (None, "not json", "[]", '{"max_hours": "x"}', '{"max_hours": 0}', "{}"):
        assert gc.deadline(rec(plan)) is None, plan
        assert gc.ledger_state(rec(plan), NOW + 10**9)[0] is None


def test_a_run_with_only_global_resources_here_needs_the_ledger_to_place_it(
    tmp_path: Path,
) -> None:
    clock = Clock(NOW)
    ledger = Ledger(tmp_path / "ledger.db", clock=clock)
    add_run(ledger, clock, "here", "done", NOW, provider="aws", region="us-east-1")
    add_run(ledger, clock, "there", "done", NOW, provider="aws", region="eu-west-1")
    items = [
        Tagged(run_id, kind, f"cloudtrain-{run_id}", NOW - 60, region=None)
        for run_id in ("here", "there", "nobody")
        for kind in ("iam-role", "instance-profile")
    ]
    items.append(Tagged("nobody-sg", "security-group", "cloudtrain-nobody-sg", None, None, "x"))
    records = {r: ledger.get_run(r) for r in ("here", "there", "nobody", "nobody-sg")}
    leaked, live = gc.select(items, records, "us-east-1", NOW)
    assert [r.run_id for r in leaked] == ["here", "nobody-sg"]
    reasons = {r.run_id: r.reason for r in live}
    assert "region is unknown" in reasons["nobody"]
    assert "eu-west-1" in reasons["there"]


def test_rows_carry_ages_and_catalog_prices(world: tuple[MemoryProvider, Ledger, Clock]) -> None:
    provider, ledger, clock = world
    clock.now = NOW - 600
    make_run(provider, "odd-1", itype="m.unpriced")
    catalog = Catalog.from_rows(
        [Offer("memory", "m.large", None, 0, 2, 8, "mem-1", None, 0.5, 0.2, "2026-01-01")]
    )
    found = gc.survey(provider, ledger, gc.Scope("memory"), now=NOW)
    lines = gc.rows(found, catalog, now=NOW)
    nodes = {r.id: r for r in lines if r.kind == "node"}
    assert nodes["ct-done-1-chief-0"].hourly_usd == 0.5
    assert nodes["ct-done-1-chief-0"].age_s == pytest.approx(7200)
    assert nodes["ct-odd-1-worker-0"].hourly_usd is None
    assert nodes["ct-odd-1-worker-0"].age_s == pytest.approx(600)
    assert {r.hourly_usd for r in lines if r.kind != "node"} == {0.0}
    console = Console(record=True, width=200)
    console.print(gc.table(found, lines))
    text = console.export_text()
    assert "ct-late-1-worker-0" in text and "2h 0m" in text and "10m" in text
    assert "total $3.0000/h (+ 2 node(s) of a type the catalog lacks)" in text  # 3 runs x 2 x 0.5


def test_unknown_creation_time_shows_as_a_question_mark() -> None:
    assert gc.format_age(None) == "?"
    assert [gc.format_age(s) for s in (5, 125, 3 * 3600 + 120, 2 * 86400 + 7200)] == [
        "5s",
        "2m",
        "3h 2m",
        "2d 2h",
    ]


def test_collect_deletes_exactly_the_leaked_runs(
    world: tuple[MemoryProvider, Ledger, Clock],
) -> None:
    provider, ledger, _ = world
    found = gc.survey(provider, ledger, gc.Scope("memory"), now=NOW)
    said: list[str] = []
    report = gc.collect(provider, ledger, found, said.append)
    report.raise_for_errors()
    left = {t.run_id for t in provider.compute.inventory()}
    assert left == {"live-1", "noplan-1"}
    assert sorted(r for r, _ in report.deleted) == ["done-1", "late-1", "lost-1"]
    assert report.summary().startswith("deleted 3 run(s) in memory mem-1: 6 node(s) and 3 other")
    late = ledger.get_run("late-1")
    assert late is not None and (late.status, late.outcome) == ("done", "crashed")
    done = ledger.get_run("done-1")
    assert done is not None and done.outcome == "succeeded"
    assert ledger.get_run("lost-1") is None, "gc adds no row for a run the ledger never had"
    assert any(m.startswith("lost-1: deleting 2 node(s)") for m in said)
    # and again: nothing is left to collect
    assert gc.survey(provider, ledger, gc.Scope("memory"), now=NOW).leaked == ()


def test_a_run_that_fails_to_delete_is_reported_and_the_others_still_go(
    world: tuple[MemoryProvider, Ledger, Clock], monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, ledger, _ = world
    compute = provider.compute
    real_delete = compute.delete_node

    def delete_node(node):  # type: ignore[no-untyped-def]
        if node.run_id == "lost-1":
            raise ProviderError(f"cannot delete {node.name}")
        real_delete(node)

    monkeypatch.setattr(compute, "delete_node", delete_node)
    found = gc.survey(provider, ledger, gc.Scope("memory"), now=NOW)
    report = gc.collect(provider, ledger, found)
    assert sorted(r for r, _ in report.deleted) == ["done-1", "late-1"]
    assert [r for r, _ in report.failed] == ["lost-1"]
    with pytest.raises(ProviderError, match=r"run\(s\) lost-1 not fully deleted"):
        report.raise_for_errors()


def test_scopes_come_from_the_ledger_unless_given() -> None:
    def rec(run_id: str, provider: str, region: str | None, account: str | None) -> RunRecord:
        fields = (run_id, run_id, provider, region, None, account, None, None, None, "done")
        return RunRecord(*fields, None, NOW, None, None)

    runs = [
        rec("a", "aws", "us-east-1", None),
        rec("b", "aws", "eu-west-1", None),
        rec("c", "aws", "us-east-1", None),
        rec("d", "gcp", "us-central1", "p1"),
        rec("e", "gcp", "europe-west4", "p1"),
        rec("f", "gcp", "us-central1", "p2"),
        rec("g", "local", "local", None),
        rec("h", "local", None, None),
    ]
    found = {(s.provider, s.region, s.account) for s in gc.scopes(runs)}
    assert {s for s in found if s[0] == "aws"} == {
        ("aws", "us-east-1", None),
        ("aws", "eu-west-1", None),
    }
    assert sorted(s[2] for s in found if s[0] == "gcp") == ["p1", "p2"], "one per project"
    assert len([s for s in found if s[0] == "local"]) == 1
    assert gc.scopes(runs, "aws", "ap-south-1") == [gc.Scope("aws", "ap-south-1")]
    assert gc.scopes([], "azure", "eastus", "sub") == [gc.Scope("azure", "eastus", "sub")]
    with pytest.raises(UsageError, match="--provider"):
        gc.scopes([])


def test_the_faults_wrapper_passes_inventory_through_its_gate() -> None:
    inner = MemoryProvider().compute
    make_run_on = RunInfo("r-1", "mem-1", None, (1, 2))
    inner.ensure_network(make_run_on)
    wrapped = FaultyCompute(inner, FaultPlan())
    assert wrapped.inventory() == inner.inventory()
    assert wrapped.calls["inventory"] == 1
    with pytest.raises(TransientError):
        FaultyCompute(inner, FaultPlan(error_rate=1.0)).inventory()


# --- the command, on the local provider through the real CLI --------------------------------


def test_gc_on_local_dry_run_then_yes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cloudtrain.providers.local import LocalProvider, kill_session

    home = tmp_path / "home"
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(home))
    provider = LocalProvider(ProviderConfig(name="local"))
    compute = provider.compute
    ledger = Ledger()
    clock = Clock(0.0)
    ledger.clock = clock
    now = time.time()
    add_run(ledger, clock, "done-run", "done", now - 60, provider="local", region="local")
    add_run(ledger, clock, "live-run", "running", now - 60, provider="local", region="local")
    ids = ("done-run", "live-run", "lost-run")
    try:
        for run_id in ids:
            run = RunInfo(run_id, "local", "local", (2222, 2230))
            compute.create_nodes(run, [NodeRequest(run_id, "chief", 0, "local", SLEEPER)])

        dry = cli(home, "gc")
        assert dry.returncode == 0, dry.stderr
        out = dry.stdout
        assert "ct-done-run-chief-0" in out and "ct-lost-run-chief-0" in out
        assert "unknown" in out and "done" in out and "total $0.0000/h" in out
        assert "ct-live-run-chief-0" not in out
        assert "left alone: run live-run (running; deadline in 1h 5" in out
        assert "2 run(s) would be deleted; pass --yes to delete them" in out
        assert all(n.alive for r in ids for n in compute.list_nodes(r)), "a dry run deletes nothing"

        wet = cli(home, "gc", "--yes")
        assert wet.returncode == 0, wet.stderr
        assert "deleted 2 run(s) in local: 2 node(s) and 0 other resource(s)" in wet.stdout
        assert compute.list_nodes("done-run") == compute.list_nodes("lost-run") == []
        assert [n.alive for n in compute.list_nodes("live-run")] == [True]

        again = cli(home, "gc", "--provider", "local")
        assert again.returncode == 0, again.stderr
        assert "no leaked cloudtrain resources in local" in again.stdout
    finally:
        for meta_path in home.glob("local/runs/*/nodes/*/node.json"):
            meta = json.loads(meta_path.read_text())
            if not meta.get("deleted"):
                kill_session(int(meta["pid"]))


def test_gc_without_a_provider_or_runs_is_a_one_line_error(tmp_path: Path) -> None:
    proc = cli(tmp_path, "gc")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--provider" in lines[0]


@pytest.mark.parametrize("args", [("gc", "--help"), ("gc", "--provider", "local")])
def test_gc_on_local_imports_no_cloud_sdk(tmp_path: Path, args: tuple[str, ...]) -> None:
    code = (
        "import sys; from cloudtrain.cli.main import app\n"
        f"try:\n    app({list(args)!r})\nexcept SystemExit:\n    pass\n"
        "print('\\n'.join(sorted(sys.modules)))"
    )
    env = dict(os.environ, CLOUDTRAIN_HOME=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    ).stdout
    assert "cloudtrain.run.gc" in out or args[-1] == "--help"
    assert [m for m in out.splitlines() if m.startswith(HEAVY)] == []
