"""Shared pieces of the security tests (tests/unit/test_security.py and
tests/unit/providers/<cloud>/test_security_<cloud>.py).

A job spec whose env holds secrets (one read from the controller's environment, one inline),
canary cloud credentials to put in the controller's environment, the real `cloudtrain` CLI run
in process (`run --detach --json`, `status --json`, `plan --json`) against whatever offline cloud
the caller has pointed the environment at, every SDK request the controller sent (recorded at
botocore's and requests' level), the ledger dumped whole, and helpers to grep
all of it and to read presigned URLs out of a startup script.
"""

from __future__ import annotations

import base64
import datetime
import json
import re
import sqlite3
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

SECRET_FROM_ENV = "wandb-canary-5f1d2c3b4a99"
SECRET_INLINE = "hf_canary_inline_9e8d7c6b5a"
SECRET_ENV_NAME = "CT_SECURITY_WANDB_KEY"  # where the controller's environment holds it
SECRETS = (SECRET_FROM_ENV, SECRET_INLINE)
# Fake cloud credentials in the controller's environment: none may be copied anywhere (but an
# S3 URL presigned with temporary credentials must carry the session token: see the AWS tests).
CREDENTIAL_CANARIES = {
    "AWS_SECRET_ACCESS_KEY": "awsSecretCanary0123456789abcdefABCDEFGHIJ",
    "AWS_SESSION_TOKEN": "awsSessionTokenCanary0123456789abcdef",
    "AZURE_CLIENT_SECRET": "azureClientSecretCanary~0123456789abc",
    "GOOGLE_OAUTH_ACCESS_TOKEN": "ya29.gcpAccessTokenCanary0123456789",
    "CLOUDSDK_AUTH_ACCESS_TOKEN": "ya29.gcloudTokenCanary0123456789abc",
}
MAX_URL_TTL_S = 3600


def spec_text(
    provider: str,
    region: str | None,
    *,
    workers: int = 2,
    entrypoint: str = "python train.py",
) -> str:
    """A job (multi-worker, or one_device for one worker) whose env has a plain value, a
    from_env secret and an inline secret."""
    where = f"region: {region}\n" if region else ""
    cluster = "one_device" if workers == 1 else f"multi_worker_mirrored\n  workers: {workers}"
    return (
        f"name: sec\nprovider: {provider}\n{where}"
        f"entrypoint: {json.dumps(entrypoint)}\n"
        f"cluster:\n  strategy: {cluster}\n"
        "env:\n"
        "  WANDB_PROJECT: digits\n"
        f"  WANDB_API_KEY: {{from_env: {SECRET_ENV_NAME}, secret: true}}\n"
        f"  HF_TOKEN: {{value: {SECRET_INLINE}, secret: true}}\n"
        "max_hours: 1\n"
    )


def write_job(folder: Path, text: str) -> Path:
    """job.yaml plus a train.py in `folder`; returns the job file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text("print('training')\n")
    job = folder / "job.yaml"
    job.write_text(text)
    return job


def set_canaries(mp: pytest.MonkeyPatch, home: Path) -> None:
    """The controller's environment: its own home, the from_env secret, canary credentials."""
    mp.setenv("CLOUDTRAIN_HOME", str(home))
    mp.setenv(SECRET_ENV_NAME, SECRET_FROM_ENV)
    for name, value in CREDENTIAL_CANARIES.items():
        mp.setenv(name, value)


def canaries(*more: str) -> list[str]:
    """Every value that must never leave the controller except through cluster.json."""
    return [*SECRETS, *CREDENTIAL_CANARIES.values(), *(m for m in more if m)]


def leaks(haystack: str, needles: list[str]) -> list[str]:
    """The needles found in `haystack`, as they are, URL-quoted, or base64-encoded from the start
    of a base64 block (the recorded bodies are decoded where the cloud encodes them)."""
    found = []
    for needle in needles:
        forms = {needle, urllib.parse.quote(needle, safe=""), urllib.parse.quote_plus(needle)}
        forms.add(base64.b64encode(needle.encode()).decode().rstrip("="))
        if any(form in haystack for form in forms):
            found.append(needle)
    return found


# --- what the controller sent and kept --------------------------------------------------------


@dataclass
class SentRequests:
    """Every SDK request of this process while recording: (API, operation or URL, body)."""

    items: list[tuple[str, str, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, api: str, what: str, body: Any) -> None:
        """Record one request (thread-safe: the adapters fan out)."""
        text = body if isinstance(body, str) else _text(body)
        with self._lock:
            self.items.append((api, what, text))

    def calls(self, api: str, what: str) -> list[str]:
        """The bodies of the requests to `api` whose operation/URL contains `what`."""
        return [body for a, w, body in self.items if a == api and what in w]


def _text(value: Any) -> str:
    """A request body or parameters as text (bytes decoded, anything odd as its repr)."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode(errors="replace")
    return json.dumps(value, default=_scalar, sort_keys=True)


def _scalar(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode(errors="replace")
    return repr(value)


@contextmanager
def record_requests() -> Iterator[SentRequests]:
    """Record the controller's requests: botocore API calls (operation and parameters, before
    serialisation: UserData still plain) and every `requests` session's HTTP requests (the
    google-cloud and azure SDKs send through it), each with its URL and body."""
    sent = SentRequests()
    patches: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, wrapper: Any) -> None:
        patches.append((owner, name, getattr(owner, name)))
        setattr(owner, name, wrapper)

    try:
        from botocore.client import BaseClient

        make_call = BaseClient._make_api_call

        def _make_api_call(self: Any, operation: str, params: dict[str, Any]) -> Any:
            sent.add(self.meta.service_model.service_name, operation, params)
            return make_call(self, operation, params)

        patch(BaseClient, "_make_api_call", _make_api_call)
    except ImportError:
        pass
    try:
        import requests

        send = requests.Session.send

        def _send(self: Any, request: Any, **kw: Any) -> Any:
            sent.add("http", f"{request.method} {request.url}", request.body or "")
            return send(self, request, **kw)

        patch(requests.Session, "send", _send)
    except ImportError:
        pass
    try:
        yield sent
    finally:
        for owner, name, original in reversed(patches):
            setattr(owner, name, original)


def dump_ledger(home: Path) -> str:
    """Every row of every table of the ledger, plus the raw bytes of its files (WAL too)."""
    path = home / "ledger.db"
    rows: list[str] = []
    with sqlite3.connect(path) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            rows += [f"{table}: {row!r}" for row in db.execute(f"SELECT * FROM {table}")]
    raw = b"".join(p.read_bytes() for p in home.glob("ledger.db*"))
    return "\n".join(rows) + "\n" + raw.decode("latin-1")


@dataclass
class CliRun:
    """A detached `cloudtrain run` and what the controller printed and kept."""

    run_id: str
    job: Path
    outputs: dict[str, str]  # command -> stdout + stderr
    ledger: str
    sent: SentRequests

    def text(self) -> str:
        """Everything the controller printed or stored (not the cloud side)."""
        return "\n".join([*self.outputs.values(), self.ledger])


def cloudtrain(*args: str) -> str:
    """`cloudtrain ARGS` in process; its stdout and stderr. Fails the test on a non-zero exit."""
    from typer.testing import CliRunner

    from cloudtrain.cli.main import app

    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    output = result.stdout + (result.stderr if result.stderr_bytes is not None else "")
    assert result.exit_code == 0, output
    return output


def first_json(output: str) -> dict[str, Any]:
    """The first JSON object in a command's output (stdout comes before stderr)."""
    value, _ = json.JSONDecoder().raw_decode(output, output.index("{"))
    return dict(value)


def run_detached(home: Path, job: Path) -> CliRun:
    """`cloudtrain run JOB --detach --json`, then `status RUN --json` and `plan JOB --json`,
    recording every request the controller sent while doing so."""
    outputs: dict[str, str] = {}
    with record_requests() as sent:
        outputs["run"] = cloudtrain("run", str(job), "--detach", "--no-controller", "--json")
        run_id = str(first_json(outputs["run"])["run_id"])
        outputs["status"] = cloudtrain("status", run_id, "--json")
        outputs["plan"] = cloudtrain("plan", str(job), "--json")
    return CliRun(run_id, job, outputs, dump_ledger(home), sent)


# --- presigned URLs ---------------------------------------------------------------------------


# the presigned URLs a script may carry beyond the bundle's and the log's: the wheelhouse's GET
# (warm) or its two PUTs (the cold node that publishes it), cloudtrain/run/wheelhouse.py
OPTIONAL_URLS = ("CT_WHEELHOUSE_URL", "CT_WHEELHOUSE_PUT_URL", "CT_WHEELHOUSE_MANIFEST_PUT_URL")


def startup_urls(script: str) -> dict[str, str]:
    """Every presigned URL of a rendered startup script (bash single-quoted values): the bundle
    and log URLs, which every script has, and the wheelhouse's where the node got an offer."""
    out = {}
    for name in ("CT_BUNDLE_URL", "CT_LOG_URL"):
        m = re.search(rf"^{name}='([^']*)'$", script, re.M)
        assert m, f"{name} not in the script"
        out[name] = m[1]
    for name in OPTIONAL_URLS:
        m = re.search(rf"^{name}='([^']+)'$", script, re.M)
        if m:
            out[name] = m[1]
    return out


def url_lifetime_s(url: str, now: datetime.datetime | None = None) -> float | None:
    """How long a presigned URL stays valid from its signing (S3 and GCS V4: X-Amz-Expires /
    X-Goog-Expires; Azure SAS: se - st, else se - now). None: the URL says no expiry."""
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
    for name in ("X-Amz-Expires", "X-Goog-Expires"):
        if name in query:
            return float(query[name])
    if "se" in query:
        end = _iso(query["se"])
        start = _iso(query["st"]) if "st" in query else (now or datetime.datetime.now(datetime.UTC))
        return (end - start).total_seconds()
    return None


def _iso(value: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


# --- one node's request, rendered by the real orchestrator ------------------------------------


class QuietObserver:
    """An Observer that keeps what it is told (the controller's output, for grepping)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def event(self, message: str) -> None:
        self.lines.append(message)

    def log_line(self, node: str, line: str) -> None:
        self.lines.append(f"{node}: {line}")

    def update(self, view: Any) -> None:
        self.lines.append(repr(view))


def render_requests(job: Path, provider: Any, home: Path, store: Any = None) -> list[Any]:
    """The NodeRequests (startup script included) `Orchestrator.node_request` renders for every node
    of the job's plan on `provider`, with `store` (default: the provider's) presigning the URLs.
    Creates nothing in the cloud."""
    from cloudtrain.catalog.offers import Catalog
    from cloudtrain.jobspec.job import load_spec
    from cloudtrain.plan.planner import make_plan
    from cloudtrain.run.bundle import build_bundle
    from cloudtrain.run.orchestrator import Orchestrator
    from cloudtrain.state.ledger import Ledger

    spec = load_spec(job)
    plan = make_plan(spec, Catalog.bundled())
    orch = Orchestrator(spec, plan, provider, Ledger(home / "render.db"), QuietObserver())
    if store is not None:
        orch.store = store
    orch.bundle = build_bundle(spec.workdir_path(), home / "bundles")
    return [orch.node_request(node) for node in plan.nodes]


# --- a small IAM policy evaluator (controller identity tests, issue 17) ---------------------------


def iam_allows(
    policy: dict[str, Any], action: str, resource: str, context: dict[str, str] | None = None
) -> bool:
    """Whether an identity policy of Allow statements allows `action` on `resource` with the
    request's condition keys `context`: Action/Resource wildcards (`*`, `?`, case-insensitive
    actions), and StringEquals/StringLike conditions, every key of a statement's block required
    (a key missing from the request fails it), as IAM evaluates them (IAM User Guide, "Policy
    evaluation logic", "Condition operators"). Raises on anything else (a Deny, NotAction, an
    operator it does not know), so a test never passes on a policy it cannot read."""
    import fnmatch

    context = context or {}

    def listed(value: Any) -> list[str]:
        return [value] if isinstance(value, str) else list(value)

    def cond_ok(block: dict[str, Any]) -> bool:
        for operator, keys in block.items():
            if operator not in ("StringEquals", "StringLike"):
                raise AssertionError(f"iam_allows cannot evaluate {operator}")
            for key, wanted in keys.items():
                got = context.get(key)
                if got is None:
                    return False
                if operator == "StringEquals" and got not in listed(wanted):
                    return False
                if operator == "StringLike" and not any(
                    fnmatch.fnmatchcase(got, w) for w in listed(wanted)
                ):
                    return False
        return True

    for st in policy["Statement"]:
        if st.get("Effect") != "Allow" or set(st) - {
            "Sid",
            "Effect",
            "Action",
            "Resource",
            "Condition",
        }:
            raise AssertionError(f"iam_allows cannot evaluate {st}")
        if not any(fnmatch.fnmatch(action.lower(), a.lower()) for a in listed(st["Action"])):
            continue
        if not any(fnmatch.fnmatchcase(resource, r) for r in listed(st["Resource"])):
            continue
        if cond_ok(st.get("Condition", {})):
            return True
    return False
