"""The controller's account questions (issue 30): check's verdicts, the plan that skips regions
whose quota cannot hold it, the refusal of a caller missing rights, and where credentials are
visible without an SDK. Each cloud's own probe is tested against its box elsewhere; here a
scripted probe (tests/fakes/scripted_account.py) drives the controller's decisions."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cloudtrain.api.check import CheckReport
from cloudtrain.catalog.offers import Catalog, Offer
from cloudtrain.cli.check import report_lines
from cloudtrain.core.errors import PlanError, RightsMissing
from cloudtrain.jobspec.job import load_spec
from cloudtrain.plan.account_check import Candidate, check_cloud, needs_of, rights_error
from cloudtrain.plan.account_plan import not_looked_note, plan_for_account
from cloudtrain.plan.planner import make_plan
from cloudtrain.providers.credential_hints import visible
from cloudtrain.providers.registry import info
from tests.fakes.scripted_account import ScriptedProbe


def _offer(itype: str, acc: str | None, count: int, region: str, price: float) -> Offer:
    vcpus = 4.0 if acc else 8.0
    return Offer("aws", itype, acc, count, vcpus, 32.0, region, f"{region}-a", price, None, "d")


# three regions, cheapest first: r-one, r-two, r-three
CATALOG = Catalog.from_rows(
    [
        _offer("g4dn.xlarge", "T4", 1, "r-one", 0.50),
        _offer("g4dn.xlarge", "T4", 1, "r-two", 0.60),
        _offer("g4dn.xlarge", "T4", 1, "r-three", 0.70),
        _offer("m5.2xlarge", None, 0, "r-one", 0.30),
    ]
)
JOB = """\
name: quota-test
provider: aws
cluster:
  strategy: multi_worker_mirrored
  workers: 2
  accelerator: "T4:1"
workdir: .
entrypoint: python train.py
max_hours: 1
"""


@pytest.fixture
def spec(tmp_path: Path):  # type: ignore[no-untyped-def]
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "train.py").write_text("print('hi')\n")
    return load_spec(tmp_path / "job.yaml")


def _candidates(spec) -> list[Candidate]:  # type: ignore[no-untyped-def]
    from cloudtrain.plan.account_check import candidates

    return list(candidates(spec, CATALOG, 12))


def test_candidates_walk_the_regions_in_price_order_with_their_nodes(spec) -> None:  # type: ignore[no-untyped-def]
    cands = _candidates(spec)
    assert [(c.region, c.hourly_usd) for c in cands] == [
        ("r-one", 1.0),
        ("r-two", 1.2),
        ("r-three", 1.4),
    ]
    assert {n.region for n in cands[1].nodes} == {"r-two"}
    needs = needs_of("aws", cands[0].nodes, CATALOG)
    assert [(n.instance_type, n.nodes, n.vcpus, n.accelerator_count) for n in needs] == [
        ("g4dn.xlarge", 2, 4, 1)
    ]


def test_a_region_without_quota_is_named_and_the_next_one_launches(spec) -> None:  # type: ignore[no-untyped-def]
    probe = ScriptedProbe(gpu_limits={"r-one": 0.0})
    got = check_cloud("aws", probe, _candidates(spec), CATALOG)
    assert [r.fits for r in got.regions] == [False, True, True]
    assert got.regions[0].reason() == "quota GPUS in r-one: limit 0, in use 0, needs 2 GPU"
    launch = got.launch_region()
    assert launch is not None and launch.region == "r-two"


def test_usage_counts_against_the_limit(spec) -> None:  # type: ignore[no-untyped-def]
    probe = ScriptedProbe(gpu_limits={"r-one": 4.0}, usage={"r-one": 3.0})
    got = check_cloud("aws", probe, _candidates(spec), CATALOG)
    assert not got.regions[0].fits
    assert "limit 4, in use 3, needs 2" in got.regions[0].reason()


def test_no_credentials_asks_nothing_else(spec) -> None:  # type: ignore[no-untyped-def]
    probe = ScriptedProbe(source=None)
    got = check_cloud("aws", probe, _candidates(spec), CATALOG)
    assert probe.asked == ["credentials"]
    assert "no credentials found" in got.error and not got.usable
    assert got.launch_region() is None


def test_a_refused_quota_question_is_said_and_never_counts_as_room(spec) -> None:  # type: ignore[no-untyped-def]
    probe = ScriptedProbe(refuse_quotas=("r-one",))
    got = check_cloud("aws", probe, _candidates(spec), CATALOG)
    assert not got.regions[0].fits
    assert got.regions[0].reason().startswith("quotas not read: not allowed to read quotas")
    assert got.launch_region().region == "r-two"  # type: ignore[union-attr]


def test_missing_rights_block_every_region_and_the_line_is_runs_refusal(spec) -> None:  # type: ignore[no-untyped-def]
    probe = ScriptedProbe(missing=("iam:CreateRole",))
    got = check_cloud("aws", probe, _candidates(spec), CATALOG)
    assert got.launch_region() is None
    report = CheckReport((got,), job="job.yaml")
    refusal = rights_error("AWS", ["iam:CreateRole"])
    assert isinstance(refusal, RightsMissing) and refusal.missing == ("iam:CreateRole",)
    lines = report_lines(report)
    assert str(refusal) in lines  # check prints exactly what run refuses with
    assert "the AWS credentials lack 1 right(s) a run needs: iam:CreateRole" in str(refusal)
    assert lines[-2] == "job.yaml: cannot launch now: no region where the rights and quotas hold"
    assert not report.ok


def test_rights_error_bounds_a_long_list() -> None:
    many = [f"svc:Action{i:02}" for i in range(20)]
    text = rights_error("GCP", many).message
    assert "lack 20 right(s)" in text and text.endswith("and 8 more")


def test_report_verdict_and_json(spec) -> None:  # type: ignore[no-untyped-def]
    probe = ScriptedProbe(gpu_limits={"r-one": 0.0})
    report = CheckReport((check_cloud("aws", probe, _candidates(spec), CATALOG),), job="job.yaml")
    assert report.ok and report.launch_at() == ("aws", "r-two", 1.2)
    lines = report_lines(report)
    assert "aws r-one ($1.00/h): cannot launch: quota GPUS in r-one" in "\n".join(lines)
    assert "job.yaml: can launch now in aws r-two at $1.20/h" in lines
    data = report.to_dict()
    assert data["launch"] == {"provider": "aws", "region": "r-two", "hourly_usd": 1.2}
    assert data["clouds"][0]["regions"][0]["fits"] is False


def test_the_plan_skips_a_region_whose_quota_cannot_hold_it(spec) -> None:  # type: ignore[no-untyped-def]
    probe = ScriptedProbe(gpu_limits={"r-one": 0.0, "r-two": 1.0})
    got = plan_for_account(spec, CATALOG, lambda cloud, placed: probe)
    assert got.region == "r-three"
    skipped = [n for n in got.notes if n.startswith("skipped aws")]
    assert len(skipped) == 2, got.notes
    assert "quota GPUS in r-one: limit 0" in skipped[0] or "quota GPUS in r-one" in skipped[1]
    assert probe.asked == ["quotas r-one", "quotas r-two", "quotas r-three"]


def test_the_plan_stops_asking_at_the_first_region_that_holds_it(spec) -> None:  # type: ignore[no-untyped-def]
    probe = ScriptedProbe()
    got = plan_for_account(spec, CATALOG, lambda cloud, placed: probe)
    assert got.region == "r-one" and probe.asked == ["quotas r-one"]
    assert got == make_plan(spec, CATALOG)


def test_no_region_with_quota_is_a_plan_error_naming_the_quotas(spec) -> None:  # type: ignore[no-untyped-def]
    probe = ScriptedProbe(default_limit=0.0)
    with pytest.raises(PlanError) as err:
        plan_for_account(spec, CATALOG, lambda cloud, placed: probe)
    assert "quota GPUS in r-three" in str(err.value)


def test_without_visible_credentials_the_plan_says_it_did_not_look(spec) -> None:  # type: ignore[no-untyped-def]
    got = plan_for_account(spec, CATALOG, lambda cloud, placed: None)
    assert got.region == "r-one"
    assert not_looked_note("aws") in got.notes


def test_credentials_are_visible_from_variables_and_files(tmp_path: Path) -> None:
    aws = info("aws")
    assert visible(aws, {}, tmp_path) is None
    assert visible(aws, {"AWS_PROFILE": "dev"}, tmp_path) == "$AWS_PROFILE"
    assert visible(aws, {"AWS_PROFILE": "  "}, tmp_path) is None
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]\n")
    assert visible(aws, {}, tmp_path) == "~/.aws/credentials"
    gcp = info("gcp")
    assert visible(gcp, {"GOOGLE_APPLICATION_CREDENTIALS": "/k.json"}, tmp_path)
    assert visible(info("local"), {"AWS_PROFILE": "x"}, tmp_path) is None


def test_an_offline_plan_loads_no_sdk(spec, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from cloudtrain import api

    for name in info("aws").credential_env:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(spec.source_path.parent))
    for mod in [m for m in sys.modules if m.startswith(("boto3", "botocore"))]:
        monkeypatch.delitem(sys.modules, mod)
    got = api.plan(spec)
    assert not_looked_note("aws") in got.notes
    assert not any(m.startswith(("boto3", "botocore")) for m in sys.modules)


def test_a_skipped_region_as_cheap_as_the_chosen_one_is_noted(spec) -> None:  # type: ignore[no-untyped-def]
    tied = Catalog.from_rows(
        [
            _offer("g4dn.xlarge", "T4", 1, "r-one", 0.50),
            _offer("g4dn.xlarge", "T4", 1, "r-two", 0.50),
        ]
    )
    probe = ScriptedProbe(gpu_limits={"r-one": 0.0})
    got = plan_for_account(spec, tied, lambda cloud, placed: probe)
    assert got.region == "r-two"  # r-one ranks first at the same price: its skip is said
    assert [n for n in got.notes if n.startswith("skipped aws r-one: quota GPUS")], got.notes


CHEAPEST_JOB = JOB.replace("provider: aws", "provider: cheapest")


def test_cheapest_leaves_out_a_cloud_whose_caller_lacks_rights(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(CHEAPEST_JOB)
    (tmp_path / "train.py").write_text("print('hi')\n")
    spec = load_spec(tmp_path / "job.yaml")
    gcp = Offer("gcp", "g2-standard-8", "T4", 1, 8.0, 32.0, "g-one", "g-one-a", 0.9, None, "d")
    both = Catalog.from_rows([*CATALOG.offers("aws"), gcp])
    probes = {"aws": ScriptedProbe(missing=("iam:CreateRole",)), "gcp": ScriptedProbe()}
    got = plan_for_account(spec, both, lambda cloud, placed: probes[cloud])
    assert got.provider == "gcp" and got.region == "g-one"
    line = "the AWS credentials lack 1 right(s) a run needs: iam:CreateRole"
    skipped = [n for n in got.notes if n.startswith("skipped aws")]
    assert skipped == [f"skipped aws r-one, r-two and r-three: {line}"], got.notes
    # failover never goes there either: every AWS place is among the plan's avoided ones
    assert {p for p in got.avoided_places() if p[0] == "aws"} == {
        ("aws", "r-one"),
        ("aws", "r-two"),
        ("aws", "r-three"),
    }
    assert "quotas r-one" not in probes["aws"].asked
