"""cloudtrain's security guarantees, for every provider, in one place.

Each guarantee is checked against what the real adapters render and what the offline clouds
record (moto; the GCE fake and the GCS emulator; the ARM fake and Azurite), after one detached
`cloudtrain run` per cloud with a job whose env holds secrets (one read from the controller's
environment, one inline) and with canary credentials in the controller's environment:

| guarantee                                  | aws | gcp | azure | local   |
|--------------------------------------------|-----|-----|-------|---------|
| 1 no secret/credential in user data,       | aws | gcp | azure | here    |
|   metadata, tags/labels, requests, ledger, |     |     |       |         |
|   CLI output, logs; env only in cluster.json |   |     |       |         |
| 2 bucket denies public access              | aws | gcp | azure | here    |
| 3 TF ports open only inside the cluster    | aws | gcp | azure | here    |
| 4 SSH closed unless asked, then one CIDR   | aws | gcp | azure | n/a     |
| 5 IMDSv2 required                          | aws | n/a | n/a   | n/a     |
| 6 presigned URLs live at most an hour      | aws | gcp | azure | exempt  |
| 7 node identity limited to its run         | aws | XFAIL | azure | n/a   |

"aws", "gcp", "azure": tests/unit/providers/<cloud>/test_security_<cloud>.py. GCP's guarantee 7
does not hold (nodes use a shared service account with the devstorage.read_write scope): a strict
xfail there.
Below: the local provider, a whole local run whose job prints its secrets (the logs, the
status, the CLI output and every file left behind must show `***`), and what the bundle carries.
"""

from __future__ import annotations

import io
import json
import stat
import tarfile
from pathlib import Path

import pytest

from tests.unit import security_kit as kit


@pytest.fixture
def controller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The controller's home, with the from_env secret and canary credentials set."""
    home = tmp_path / "home"
    kit.set_canaries(monkeypatch, home)
    return home


def _local_provider(home: Path):  # type: ignore[no-untyped-def]
    from cloudtrain.providers.base import ProviderConfig
    from cloudtrain.providers.local import LocalProvider

    return LocalProvider(ProviderConfig(name="local", options={"root": str(home / "local")}))


# --- local: what a node is given ---------------------------------------------------------------


def test_local_scripts_carry_no_secret_or_credential(controller: Path) -> None:
    job = kit.write_job(controller / "job", kit.spec_text("local", None))
    requests = kit.render_requests(job, _local_provider(controller), controller)
    assert len(requests) == 2
    for req in requests:
        assert kit.leaks(repr(req), kit.canaries()) == []
        assert "WANDB_API_KEY" not in req.startup_script and "HF_TOKEN" not in req.startup_script
        assert kit.leaks(json.dumps(req.labels), kit.canaries()) == []


def test_local_urls_are_file_urls(controller: Path) -> None:
    """Guarantee 6 is exempt on local: the bucket is a folder of this user's, no URL is signed."""
    job = kit.write_job(controller / "job", kit.spec_text("local", None, workers=1))
    (req,) = kit.render_requests(job, _local_provider(controller), controller)
    for url in kit.startup_urls(req.startup_script).values():
        assert url.startswith("file:///") and "?" not in url


def test_local_bucket_is_private_to_the_user(tmp_path: Path) -> None:
    provider = _local_provider(tmp_path)
    store = provider.store(f"file://{tmp_path / 'bucket'}")
    store.ensure_bucket()
    mode = stat.S_IMODE((tmp_path / "bucket").stat().st_mode)
    assert mode == 0o700, oct(mode)


def test_local_nodes_open_nothing_beyond_loopback(controller: Path) -> None:
    from cloudtrain.providers.base import RunInfo

    provider = _local_provider(controller)
    run = RunInfo("r1", "local", None, (2222, 2232), ssh=True)
    assert provider.compute.planned_network(run) == []
    assert provider.compute.ensure_network(run) == []  # no firewall: nothing is exposed
    job = kit.write_job(controller / "job", kit.spec_text("local", None, workers=1))
    (req,) = kit.render_requests(job, provider, controller)
    assert 'CLOUDTRAIN_NODE_HOST="${CLOUDTRAIN_NODE_HOST:-127.0.0.1}"' in req.startup_script


# --- the bundle ----------------------------------------------------------------------------------


def test_inline_secret_stays_out_of_the_bundle(controller: Path) -> None:
    from cloudtrain.run.bundle import build_bundle

    job = kit.write_job(controller / "job", kit.spec_text("local", None))
    bundle = build_bundle(job.parent, controller / "bundles", leave_out=[job])  # as a run does
    with tarfile.open(bundle.path) as tar:
        text = b"".join(
            tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile() and m.name.startswith("workdir/")
        ).decode(errors="replace")
    assert kit.SECRET_INLINE not in text


def test_from_env_secret_never_enters_the_bundle(controller: Path) -> None:
    from cloudtrain.run.bundle import build_bundle

    job = kit.write_job(controller / "job", kit.spec_text("local", None))
    bundle = build_bundle(job.parent, controller / "bundles")
    with tarfile.open(bundle.path) as tar:
        data = io.BytesIO()
        for member in tar.getmembers():
            if member.isfile():
                data.write(tar.extractfile(member).read())  # type: ignore[union-attr]
    assert kit.SECRET_FROM_ENV.encode() not in data.getvalue()


# --- a whole local run whose job prints its secrets -------------------------------------------

PRINTS = 'echo "token=$HF_TOKEN key=$WANDB_API_KEY project=$WANDB_PROJECT"; echo "$HF_TOKEN" >&2'


def _files_left(home: Path) -> dict[str, str]:
    """Every file under the controller's home but the spec and the bundles."""
    out = {}
    for path in home.rglob("*"):
        rel = path.relative_to(home).as_posix()
        skip = (
            rel.startswith("job/")
            or path.name.endswith(".tar.gz")
            or "/bundle/" in f"/{rel}"
        )
        if path.is_file() and not skip:
            out[rel] = path.read_bytes().decode("latin-1")
    return out


def test_local_run_redacts_secrets_everywhere(controller: Path) -> None:
    job = kit.write_job(
        controller / "job", kit.spec_text("local", None, workers=1, entrypoint=PRINTS)
    )
    output = kit.cloudtrain("run", str(job), "--json")
    result = kit.first_json(output)
    assert result["outcome"] == "succeeded", output
    run_id = result["run_id"]
    logs = kit.cloudtrain("logs", run_id)
    assert "token=*** key=*** project=digits" in logs, logs  # what the job printed, redacted
    status = kit.cloudtrain("status", run_id, "--json")
    seen = {"run": output, "logs": logs, "status": status, **_files_left(controller)}
    leaked = {where: kit.leaks(text, kit.canaries()) for where, text in seen.items()}
    assert {where: found for where, found in leaked.items() if found} == {}
    # cluster.json carried the values to the nodes; after the teardown they are blanked there
    (cluster,) = controller.rglob(f"runs/{run_id}/cluster.json")
    doc = json.loads(cluster.read_text())
    assert sorted(doc["secrets"]) == ["HF_TOKEN", "WANDB_API_KEY"]
    assert doc["env"]["HF_TOKEN"] == "***" and doc["env"]["WANDB_API_KEY"] == "***"
    assert doc["env"]["WANDB_PROJECT"] == "digits"


# --- what the controller shows ----------------------------------------------------------------


def test_plan_table_and_json_show_no_secret(controller: Path) -> None:
    from rich.console import Console

    from cloudtrain.catalog.offers import Catalog
    from cloudtrain.cli.ui import plan_table
    from cloudtrain.jobspec.job import load_spec
    from cloudtrain.plan.planner import make_plan

    job = kit.write_job(controller / "job", kit.spec_text("local", None))
    plan = make_plan(load_spec(job), Catalog.bundled())
    console = Console(file=io.StringIO(), width=200)
    console.print(plan_table(plan))
    shown = console.file.getvalue() + json.dumps(plan.to_dict())  # type: ignore[attr-defined]
    shown += kit.cloudtrain("plan", str(job), "--json")
    assert kit.leaks(shown, kit.canaries()) == []
