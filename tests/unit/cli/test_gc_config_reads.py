"""`cloudtrain gc` reads config.yaml once per command, however many scopes it surveys (issue 31):
the scopes' providers all take their options from the command's one read
(`provider_config.read_once`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cloudtrain.cli.main import app
from cloudtrain.run import gc as gc_mod
from cloudtrain.state.ledger import Ledger
from tests.unit.jobspec.test_provider_config import DEPRECATED, count_reads

SCOPES = [gc_mod.Scope("local", region) for region in ("local", "r-b", "r-c")]


def test_gc_reads_config_yaml_once_for_all_its_scopes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(home))
    for var in DEPRECATED:
        monkeypatch.delenv(var, raising=False)
    home.mkdir()
    (home / "config.yaml").write_text("providers: {}\n")
    Ledger(home / "ledger.db")
    monkeypatch.setattr(gc_mod, "scopes", lambda *args: list(SCOPES))
    surveyed: list[gc_mod.Scope] = []
    real_survey = gc_mod.survey

    def survey(prov: Any, ledger: Ledger, scope: gc_mod.Scope) -> gc_mod.Survey:
        surveyed.append(scope)
        return real_survey(prov, ledger, scope)

    monkeypatch.setattr(gc_mod, "survey", survey)
    reads = count_reads(monkeypatch)
    result = CliRunner().invoke(app, ["gc", "--provider", "local"])
    assert result.exit_code == 0, result.output
    assert surveyed == SCOPES
    assert len(reads) == 1, f"config.yaml read {len(reads)} times for {len(SCOPES)} scopes"
