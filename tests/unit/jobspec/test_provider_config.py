"""Typed provider options: the `providers:` section of job.yaml (file:line errors, the account
aliases), `$CLOUDTRAIN_HOME/config.yaml` (defaults across jobs, the job wins per field), the
deprecated CLOUDTRAIN_* variables (used only when nothing else sets the option, one warning line
per variable), what `plan` shows and the schema holds, the ledger round trip for `down`, and an
adapter that reads its options from its config (the GCE fake)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cloudtrain import api
from cloudtrain.catalog.offers import Catalog
from cloudtrain.cli.main import app
from cloudtrain.core.errors import SpecError
from cloudtrain.jobspec import provider_config
from cloudtrain.jobspec.job import json_schema, load_spec
from cloudtrain.plan.planner import Plan, make_plan
from cloudtrain.providers.base import ProviderConfig, RunInfo
from cloudtrain.providers.gcp.options import GcpOptions
from cloudtrain.providers.gcp.provider import GcpProvider
from cloudtrain.run.configs import config_for, config_for_record
from cloudtrain.state.ledger import RunRecord
from tests.fakes.gce_fake import GceFake, gce_fake

__all__ = ["gce_fake"]  # fixture, for pytest
SUB = "01234567-89ab-cdef-0123-456789abcdef"
HEAD = "name: demo\nentrypoint: python train.py\n"
DEPRECATED = (
    "CLOUDTRAIN_GCP_NETWORK",
    "CLOUDTRAIN_GCP_SERVICE_ACCOUNT",
    "CLOUDTRAIN_GCP_SIGNER",
    "CLOUDTRAIN_SSH_CIDR",
    "CLOUDTRAIN_AZURE_RESOURCE_GROUP",
    "CLOUDTRAIN_AZURE_STORAGE_ACCOUNT",
)


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh CLOUDTRAIN_HOME, no deprecated variable set, no variable warned about yet."""
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path / "home"))
    for var in DEPRECATED:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(provider_config, "_warned", set())
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def job(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(HEAD + text)
    return path


def by_name(shown: Any) -> dict[str, Any]:
    return {o["name"] if isinstance(o, dict) else o.name: o for o in shown}


# --- the section in job.yaml ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "provider: gcp\nproviders:\n  gcp:\n    network: My_Net\n",
            r"job\.yaml:6: providers\.gcp\.network: must be a VPC network name",
        ),
        (
            "providers:\n  gpc:\n    network: x\n",
            r"job\.yaml:4: providers\.gpc: unknown field; did you mean 'gcp'\?",
        ),
        (
            "providers:\n  gcp:\n    netwrk: x\n",
            r"job\.yaml:5: providers\.gcp\.netwrk: unknown field; did you mean 'network'\?",
        ),
        (
            "providers:\n  aws:\n    ssh_cidr: 0.0.0.0/0\n",
            r"job\.yaml:5: providers\.aws\.ssh_cidr: '0\.0\.0\.0/0' would open SSH to the whole",
        ),
        (
            "providers:\n  azure:\n    resource_group: 'bad group.'\n",
            r"job\.yaml:5: providers\.azure\.resource_group: must be a resource group name",
        ),
        (
            "providers:\n  gcp:\n    service_account: someone@example.com\n",
            r"job\.yaml:5: providers\.gcp\.service_account: must be a service account email",
        ),
        ("providers:\n  gcp: [a]\n", r"job\.yaml:4: providers\.gcp: must be a mapping"),
    ],
)
def test_section_errors_name_file_line_and_field(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        load_spec(job(tmp_path, text))


def test_alias_and_section_agree_or_the_error_names_both_lines(tmp_path: Path) -> None:
    same = "provider: gcp\nproject: my-project-1\nproviders:\n  gcp:\n    project: my-project-1\n"
    assert load_spec(job(tmp_path, same)).account == "my-project-1"
    differ = same.replace("project: my-project-1\n", "project: other-project\n", 1)
    with pytest.raises(SpecError, match=r"job\.yaml:7: providers\.gcp\.project: 'my-project-1'"
                       r" differs from project: 'other-project' at line 4"):
        load_spec(job(tmp_path, differ))


def test_account_of_the_section_and_the_top_level_alias(tmp_path: Path) -> None:
    text = f"provider: azure\nproviders:\n  azure:\n    subscription: {SUB}\n"
    spec = load_spec(job(tmp_path, text))
    assert spec.account == SUB and config_for(spec).account == SUB
    old = load_spec(job(tmp_path, "provider: gcp\nproject: my-project-1\n"))
    config = config_for(old)
    assert config.account == "my-project-1" and config.option("project") == "my-project-1"
    assert isinstance(config.options, GcpOptions)


# --- config.yaml ----------------------------------------------------------------------------


def test_config_yaml_gives_defaults_and_the_job_wins_per_field(tmp_path: Path, home: Path) -> None:
    (home / "config.yaml").write_text(
        "providers:\n  gcp:\n    network: team-vpc\n    ssh_cidr: 198.51.100.0/24\n"
    )
    spec = load_spec(job(tmp_path, "provider: gcp\nproviders:\n  gcp:\n    network: job-vpc\n"))
    config = config_for(spec)
    assert config.option("network") == "job-vpc"  # job.yaml wins
    assert config.option("ssh_cidr") == "198.51.100.0/24"  # config.yaml fills the rest
    assert config.option("service_account") is None
    shown = by_name(provider_config.resolve(spec, "gcp").shown())
    assert shown["network"]["source"] == "job.yaml"
    assert shown["network"]["where"].endswith("job.yaml:6")
    assert shown["ssh_cidr"]["source"] == "config.yaml"
    assert shown["ssh_cidr"]["where"] == f"{home / 'config.yaml'}:4"
    assert shown["signer"]["source"] == "default"


def test_config_yaml_errors_name_that_file_and_line(tmp_path: Path, home: Path) -> None:
    config = home / "config.yaml"
    config.write_text("providers:\n  azure:\n    storage_account: Not-Valid\n")
    with pytest.raises(SpecError, match=rf"^{config}:3: providers\.azure\.storage_account: must"):
        api.load(job(tmp_path, ""))
    config.write_text("provider: gcp\n")
    with pytest.raises(SpecError, match=rf"^{config}:1: provider: unknown field"):
        api.load(job(tmp_path, ""))


# --- deprecated variables -------------------------------------------------------------------


def test_deprecated_variable_is_used_with_one_warning_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOUDTRAIN_GCP_NETWORK", "legacy-vpc")
    monkeypatch.setenv("CLOUDTRAIN_AZURE_RESOURCE_GROUP", "team-ml")  # another cloud's: unused
    spec = load_spec(job(tmp_path, "provider: gcp\n"))
    warnings: list[str] = []
    first = config_for(spec, warn=warnings.append)
    again = config_for(spec, warn=warnings.append)
    assert first.option("network") == again.option("network") == "legacy-vpc"
    assert warnings == [
        "$CLOUDTRAIN_GCP_NETWORK is deprecated: set providers.gcp.network in job.yaml or"
        f" {provider_config.user_config_path()} instead"
    ]
    shown = by_name(make_plan(spec, Catalog.bundled()).provider_options)
    assert (shown["network"].source, shown["network"].where) == (
        "env (deprecated)",
        "$CLOUDTRAIN_GCP_NETWORK",
    )


def test_a_set_option_wins_over_the_deprecated_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOUDTRAIN_GCP_NETWORK", "legacy-vpc")
    spec = load_spec(job(tmp_path, "provider: gcp\nproviders:\n  gcp:\n    network: new-vpc\n"))
    warnings: list[str] = []
    assert config_for(spec, warn=warnings.append).option("network") == "new-vpc"
    assert warnings == []


def test_an_invalid_deprecated_variable_is_said_once_and_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The adapters read only their options (issue 31), so a deprecated variable the option's
    rule refuses can no longer be reported by the adapter that used to read it: it is named
    here, once, with the rule's reason, and the option keeps its default."""
    monkeypatch.setenv("CLOUDTRAIN_SSH_CIDR", "0.0.0.0/0")
    spec = load_spec(job(tmp_path, "provider: gcp\n"))
    warnings: list[str] = []
    first = config_for(spec, warn=warnings.append)
    config_for(spec, warn=warnings.append)
    assert first.option("ssh_cidr") is None
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("$CLOUDTRAIN_SSH_CIDR='0.0.0.0/0' is ignored: ")
    assert "whole internet" in warnings[0] and "providers.gcp.ssh_cidr" in warnings[0]
    assert "\n" not in warnings[0]


# --- plan, schema, ledger -------------------------------------------------------------------


def test_plan_json_shows_the_options_in_effect_and_where_from(tmp_path: Path) -> None:
    path = job(tmp_path, "provider: gcp\nregion: us-central1\nproviders:\n  gcp:\n    network: v\n")
    result = CliRunner().invoke(app, ["plan", str(path), "--json"])
    assert result.exit_code == 0, result.output
    shown = by_name(json.loads(result.stdout)["provider_options"])
    assert shown["network"] == {
        "name": "network", "value": "v", "source": "job.yaml", "where": f"{path}:7",
    }
    assert shown["service_account"] == {
        "name": "service_account", "value": None, "source": "default", "where": "",
    }
    options = ["project", "network", "service_account", "signer", "ssh_cidr", "tpu_runtime"]
    assert list(shown) == options


def test_plan_text_shows_the_options_and_warns_once_about_a_deprecated_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    account = "trainer@my-project-1.iam.gserviceaccount.com"
    monkeypatch.setenv("CLOUDTRAIN_GCP_SERVICE_ACCOUNT", account)
    path = job(tmp_path, "provider: gcp\nregion: us-central1\nproviders:\n  gcp:\n    network: v\n")
    result = CliRunner().invoke(app, ["plan", str(path)])
    assert result.exit_code == 0, result.output
    assert f"gcp.network: v  [job.yaml ({path}:7)]" in result.stdout
    assert "gcp.signer: -  [default]" in result.stdout
    assert (
        f"gcp.service_account: {account}  [env (deprecated)"
        " ($CLOUDTRAIN_GCP_SERVICE_ACCOUNT)]" in result.stdout
    )
    warned = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warned == [
        "warning: $CLOUDTRAIN_GCP_SERVICE_ACCOUNT is deprecated: set"
        f" providers.gcp.service_account in job.yaml or {provider_config.user_config_path()}"
        " instead"
    ]


def test_schema_includes_every_providers_options() -> None:
    schema = json_schema()
    section = schema["properties"]["providers"]
    ref = section.get("$ref") or section["allOf"][0]["$ref"]
    fields = schema["$defs"][ref.rsplit("/", 1)[-1]]["properties"]
    assert set(fields) >= {"local", "aws", "gcp", "azure"}
    gcp = schema["$defs"]["GcpOptions"]
    assert gcp["additionalProperties"] is False
    assert "VPC network" in gcp["properties"]["network"]["description"]
    assert set(schema["$defs"]["AzureOptions"]["properties"]) >= {"resource_group", "subscription"}
    assert "ssh_cidr" in schema["$defs"]["AwsOptions"]["properties"]
    result = CliRunner().invoke(app, ["schema"])
    assert result.exit_code == 0 and "resource_group" in result.stdout


def record_of(the_plan: Plan, account: str | None = None, plan_json: str | None = "") -> RunRecord:
    data = json.dumps(the_plan.to_dict()) if plan_json == "" else plan_json
    return RunRecord(
        "r1", the_plan.run_name, the_plan.provider, the_plan.region, the_plan.zone, account,
        None, None, data, "ended", "succeeded", 0.0, 1.0, None,
    )


def test_config_for_record_rebuilds_the_runs_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (
        f"provider: azure\nregion: eastus\nproviders:\n  azure:\n    subscription: {SUB}\n"
        "    resource_group: team-ml\n    storage_account: ctshared01\n"
    )
    spec = load_spec(job(tmp_path, text))
    the_plan = make_plan(spec, Catalog.bundled())
    at_run = config_for(spec, the_plan)
    # later, the spec and the environment may say something else: the record decides
    monkeypatch.setenv("CLOUDTRAIN_AZURE_RESOURCE_GROUP", "someone-else")
    warnings: list[str] = []
    again = config_for_record(record_of(the_plan, SUB), warn=warnings.append)
    assert again == at_run and warnings == []
    assert (again.name, again.region, again.account) == ("azure", "eastus", SUB)
    assert again.option("resource_group") == "team-ml"
    # a run recorded before options were kept: today's deprecated variable, with its warning
    old = record_of(the_plan, SUB, plan_json=None)
    assert config_for_record(old, warn=warnings.append).option("resource_group") == "someone-else"
    assert len(warnings) == 1 and "CLOUDTRAIN_AZURE_RESOURCE_GROUP" in warnings[0]


# --- one read per command (issue 31) ---------------------------------------------------------


def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the reads of config.yaml (each read of the outside layers reads it once)."""
    reads: list[int] = []
    real = provider_config.load_user_config

    def counted(path: Path | None = None) -> Any:
        reads.append(1)
        return real(path)

    monkeypatch.setattr(provider_config, "load_user_config", counted)
    return reads


def test_a_plan_reads_config_yaml_once_however_many_places_it_prices(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (home / "config.yaml").write_text("providers:\n  gcp:\n    network: team-vpc\n")
    path = job(tmp_path, "provider: cheapest\n")
    reads = count_reads(monkeypatch)
    the_plan = api.plan(path, account=False)
    assert len(reads) == 1
    if the_plan.provider == "gcp":
        assert by_name(the_plan.provider_options)["network"].value == "team-vpc"
    reads.clear()
    api.plan(api.load(path), account=False)  # a loaded spec: read once, not loaded again
    assert len(reads) == 2  # load's own read, then the plan's


def test_a_run_builds_its_provider_from_the_plan_without_reading_again(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (home / "config.yaml").write_text("providers:\n  gcp:\n    network: team-vpc\n")
    path = job(tmp_path, "provider: gcp\nregion: us-central1\n")
    spec = api.load(path)
    the_plan = api.plan(spec, account=False)
    (home / "config.yaml").write_text("providers:\n  gcp:\n    network: changed-vpc\n")
    reads = count_reads(monkeypatch)
    built = config_for(spec, the_plan)
    assert reads == [] and built.option("network") == "team-vpc"


def test_prepare_reads_config_yaml_once(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = job(tmp_path, "provider: local\n")
    reads = count_reads(monkeypatch)
    ready = api.prepare(path)
    assert len(reads) == 1 and ready.plan.provider == "local"


# --- an adapter reads its options --------------------------------------------------------------


def test_gcp_adapter_takes_network_ssh_cidr_and_account_from_its_options(
    tmp_path: Path, gce_fake: GceFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOUDTRAIN_GCE_ENDPOINT", gce_fake.url)  # test-only endpoints
    monkeypatch.setenv("CLOUDTRAIN_IAM_ENDPOINT", gce_fake.url)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "ct-unit-project")
    text = (
        "provider: gcp\nregion: us-central1\nzone: us-central1-a\nproviders:\n  gcp:\n"
        "    network: team-vpc\n    ssh_cidr: 203.0.113.7\n    service_account: default\n"
    )
    config = config_for(load_spec(job(tmp_path, text)))
    made = GcpProvider(config).compute.ensure_network(
        RunInfo("unit-opt1", "us-central1", "us-central1-a", (2222, 2230), ssh=True)
    )
    assert {r.kind for r in made} == {"firewall"}  # the user's account: no per-run one
    rules = {r["name"]: r for r in gce_fake.firewalls()}
    assert all(r["network"].endswith("/global/networks/team-vpc") for r in rules.values())
    assert rules["cloudtrain-unit-opt1-ssh"]["sourceRanges"] == ["203.0.113.7/32"]
    assert gce_fake.service_accounts() == []


def test_node_side_config_has_no_options_model() -> None:
    """The node side builds providers with the default config: options read as their defaults,
    no pydantic model needed."""
    config = ProviderConfig(name="gcp")
    assert config.option("network") is None and config.option("signer", "x") == "x"


def test_config_without_spec_or_record_takes_config_yaml(home: Path) -> None:
    (home / "config.yaml").write_text("providers:\n  azure:\n    resource_group: team-ml\n")
    config = provider_config.config_for_provider("azure", "eastus", account=SUB)
    assert (config.region, config.account, config.option("resource_group")) == (
        "eastus",
        SUB,
        "team-ml",
    )


def test_overrides_keep_what_job_yaml_set_and_what_it_left_to_config_yaml(
    tmp_path: Path, home: Path
) -> None:
    (home / "config.yaml").write_text("providers:\n  gcp:\n    network: team-vpc\n")
    spec = load_spec(job(tmp_path, "providers:\n  gcp:\n    signer: null\n"))
    moved = spec.with_overrides(provider="gcp", region="us-central1")
    shown = by_name(provider_config.resolve(moved, "gcp").shown())
    assert (shown["network"]["value"], shown["network"]["source"]) == ("team-vpc", "config.yaml")
    assert shown["signer"]["source"] == "job.yaml"
