"""Run-id fuzzing: every command that takes a run id, on every provider, given hostile ids.

Each bad id must give one `error:` line and a non-zero exit, no traceback; it must create no path
(anywhere under the test's folder, $CLOUDTRAIN_HOME included, but the ledger's own file), touch
no process (a sentinel whose pid is planted in node.json files that a traversal would reach must
survive), and send no request to any cloud: the AWS, GCP and Azure SDKs are pointed at a local
recording server, which must see no connection. A positive control shows that a valid id does
reach that server through each SDK, so "no connection" is not a misrouted SDK.

NUL cannot be tested through the command line: argv is NUL-terminated (execve(2)), so the OS
refuses such an argument before cloudtrain runs (asserted below).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudtrain.state.ledger import Ledger

pytestmark = pytest.mark.e2e

CLOUDS = ("aws", "gcp", "azure")
PROVIDERS = ("local", *CLOUDS)
HOSTILE = [
    "",
    "-",
    "-x",
    "--provider",
    "--help-me",
    "..",
    ".",
    "../x",
    "../../x",
    "../../../x",
    "/etc",
    "a/../../b",
    "victim-abcdef/../../x",
    "*",
    "v*",
    "?",
    "[v]",
    "%",
    "v%",
    "_",
    "v_",
    "'",
    '"',
    "v'; DELETE FROM runs; --",
    "v;rm -rf x",
    "$(touch pwned)",
    "`touch pwned`",
    "v\nb",
    "v\tb",
    "v\rb",
    "v\x1b[2J",
    "\uff56ictim",  # fullwidth v
    "\u0432ictim-abcdef",  # Cyrillic ve, not a Latin v
    "victim-abcdef\u200b",
    "VICTIM-ABCDEF",
    "v" * 38,
    "v" * 5000,
    "victim-abcdef ",
    " victim",
    "~",
]
# valid-looking ids that name no run: refused by the ledger lookup, still nothing built
UNKNOWN = ["nosuch-abcdef", "nosuch", "z"]


def _commands(run_id: str) -> list[list[str]]:
    """Every command that takes a run id, with the id where a user would type it."""
    ids = ["--", run_id] if run_id.startswith("-") else [run_id]
    out = [
        ["status", *ids],
        ["status", "--json", *ids],
        ["logs", *ids],
        ["logs", "--follow", *ids],
        ["logs", "--bootstrap", *ids],
        ["resume", *ids],
        ["cost", *ids],
        ["down", *ids],
    ]
    for provider in PROVIDERS:
        out.append(["down", "--provider", provider, *ids])
    return out


def _typed_bare(run_id: str) -> list[list[str]]:
    """An id that starts with '-' as a user would type it first: an option to click."""
    if not run_id.startswith("-"):
        return []
    return [["status", run_id], ["logs", "--follow", run_id], ["down", run_id, "-p", "aws"]]


class Recorder:
    """A TCP server on loopback that records every connection (HTTP or TLS alike) and answers
    HTTP 503. Stands in for every cloud endpoint."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.seen: list[bytes] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                data = b""
                with contextlib.suppress(OSError):
                    data = conn.recv(4096)
                with self._lock:
                    self.seen.append(data[:200])
                with contextlib.suppress(OSError):
                    conn.sendall(
                        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                        b"Connection: close\r\n\r\n"
                    )

    def count(self) -> int:
        with self._lock:
            return len(self.seen)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[dict[str, str], Recorder, subprocess.Popen[bytes]]]:
    """$CLOUDTRAIN_HOME with a ledger row per provider, every SDK pointed at a recorder, and a
    sentinel process planted in node.json files where traversals lead."""
    home = tmp_path / "home"
    recorder = Recorder()
    url = f"http://127.0.0.1:{recorder.port}"
    key = "a2V5a2V5a2V5a2V5a2V5a2V5a2V5a2V5a2V5a2V5a2V5"
    env = {k: v for k, v in os.environ.items() if not k.upper().endswith("_PROXY")}
    for name in list(env):
        if name.startswith(("AWS_", "AZURE_", "GOOGLE_", "CLOUDSDK_", "CLOUDTRAIN_")):
            del env[name]
    env.update(
        CLOUDTRAIN_HOME=str(home),
        COLUMNS="200",
        NO_PROXY="127.0.0.1,localhost",
        AWS_ENDPOINT_URL=url,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_MAX_ATTEMPTS="1",
        AWS_EC2_METADATA_DISABLED="true",
        CLOUDTRAIN_GCE_ENDPOINT=url,
        CLOUDTRAIN_IAM_ENDPOINT=url,
        STORAGE_EMULATOR_HOST=url,
        GOOGLE_CLOUD_PROJECT="proj-1",
        CLOUDTRAIN_ARM_ENDPOINT=url,
        AZURE_SUBSCRIPTION_ID="00000000-0000-0000-0000-000000000000",
        CLOUDTRAIN_AZURE_STORAGE_ACCOUNT="acct",
        CLOUDTRAIN_AZURE_IMDS=url,
        AZURE_STORAGE_CONNECTION_STRING=(
            f"DefaultEndpointsProtocol=http;AccountName=acct;AccountKey={key};"
            f"BlobEndpoint={url}/acct;"
        ),
    )
    ledger = Ledger(home / "ledger.db")
    stores = {
        "local": f"file://{home}/buckets/local",
        "aws": "s3://bucket-1",
        "gcp": "gs://bucket-1",
        "azure": "az://acct/bucket-1",
    }
    for provider in PROVIDERS:
        ledger.create_run(
            f"victim-{provider}-abcdef"[:37],
            "victim",
            provider,
            None if provider == "local" else "us-east-1",
            None,
            str(tmp_path / "job.yaml"),
            stores[provider],
            None,
        )
        ledger.set_status(f"victim-{provider}-abcdef"[:37], "done", "succeeded")
    sentinel = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(900)"], start_new_session=True
    )
    meta = {"name": "n", "run_id": "x", "role": "worker", "index": 0, "pid": sentinel.pid}
    # where `runs/<id>/nodes/*` leads for id ../x, ../../x and ../../../x, and ./x itself
    for folder in (home / "local", home, tmp_path, home / "local" / "runs" / "x"):
        node = (
            folder / "x" / "nodes" / "n"
            if folder != home / "local" / "runs" / "x"
            else (folder / "nodes" / "n")
        )
        node.mkdir(parents=True, exist_ok=True)
        (node / "node.json").write_text(json.dumps(meta))
    try:
        yield env, recorder, sentinel
    finally:
        sentinel.kill()
        sentinel.wait()
        recorder.close()


def _tree(root: Path) -> set[str]:
    """Every path under `root` but the ledger's own files (SQLite writes beside it)."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.name.startswith("ledger.db")}


DRIVER = r"""
import io, json, sys, traceback
from contextlib import redirect_stderr, redirect_stdout
from cloudtrain.cli.main import main
results = []
for argv in json.load(sys.stdin):
    out, err = io.StringIO(), io.StringIO()
    code = None
    sys.argv = ["cloudtrain", *argv]
    try:
        with redirect_stdout(out), redirect_stderr(err):
            main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        err.write(traceback.format_exc())
        code = "raised"
    results.append([argv, code, out.getvalue(), err.getvalue()])
json.dump(results, sys.stdout)
"""


def _drive(env: dict[str, str], cases: list[list[str]]) -> list[list[object]]:
    """Run `cloudtrain.cli.main.main` (the console script's entry point) once per argv, in one
    process (hundreds of Python start-ups would take minutes); each one's exit and output."""
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER],
        input=json.dumps(cases),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return list(json.loads(proc.stdout))


def _shape_refusal(err: str) -> bool:
    return "is not a run id" in err or "got an empty string" in err


def _problems(results: list[list[object]], expect: str) -> list[str]:
    problems = []
    for argv, code, out, err in results:
        lines = [line for line in str(err).splitlines() if line.strip()]
        if code in (0, "raised") or "Traceback" in f"{out}{err}":
            problems.append(f"{argv!r}: exit {code}\n{out}{err}")
        elif len(lines) != 1 or not lines[0].startswith("error: ") or expect not in lines[0]:
            problems.append(f"{argv!r}: not one `error:` line with {expect!r}: {err!r}")
    return problems


def test_hostile_run_ids_are_refused_by_every_command_on_every_provider(
    world: tuple[dict[str, str], Recorder, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    env, recorder, sentinel = world
    before = _tree(tmp_path)
    checked = [argv for run_id in HOSTILE for argv in _commands(run_id)]
    bare = [argv for run_id in HOSTILE for argv in _typed_bare(run_id)]
    results = _drive(env, checked + bare)
    problems = _problems(results, "")  # every case: one `error:` line
    assert not problems, "\n".join(problems[:20])
    # every id that reaches cloudtrain is refused by its shape check, not by a later lookup
    passed = [r for r in results[: len(checked)] if not _shape_refusal(str(r[3]))]
    assert not passed, f"hostile ids past the shape check: {passed[:5]}"
    usage = ("No such option", "Missing argument", "requires an argument")
    for argv, _, _, err in results[len(checked) :]:  # click's usage error, or the shape check
        assert _shape_refusal(str(err)) or any(u in str(err) for u in usage), (argv, err)
    assert bare
    assert recorder.count() == 0, recorder.seen[:5]
    assert sentinel.poll() is None, "a process outside any run was killed"
    assert _tree(tmp_path) == before


def test_unknown_but_valid_ids_say_so_and_build_nothing(
    world: tuple[dict[str, str], Recorder, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    env, recorder, sentinel = world
    before = _tree(tmp_path)
    cases = [argv for run_id in UNKNOWN for argv in _commands(run_id) if "--provider" not in argv]
    problems = _problems(_drive(env, cases), "no run")
    assert not problems, "\n".join(problems[:20])
    assert recorder.count() == 0
    assert sentinel.poll() is None
    assert _tree(tmp_path) == before


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
        min_size=0,
        max_size=50,
    ).filter(lambda s: not all(c.isalnum() or c == "-" for c in s) or not s)
)
def test_generated_ids_with_a_foreign_character_are_refused(
    world: tuple[dict[str, str], Recorder, subprocess.Popen[bytes]], tmp_path: Path, run_id: str
) -> None:
    env, recorder, sentinel = world
    results = _drive(env, _commands(run_id) + _typed_bare(run_id))
    problems = _problems(results, "")
    assert not problems, "\n".join(problems[:5])
    assert recorder.count() == 0
    assert sentinel.poll() is None


def test_the_real_console_script_refuses_a_traversal_in_one_line(
    world: tuple[dict[str, str], Recorder, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """The driver above calls `main()`; this is the same through `python -m cloudtrain.cli.main`."""
    env, recorder, sentinel = world
    before = _tree(tmp_path)
    for argv in (["down", "../../x", "--provider", "local"], ["logs", "--follow", "../x"]):
        proc = subprocess.run(
            [sys.executable, "-m", "cloudtrain.cli.main", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2, proc.stderr
        assert len(lines) == 1 and lines[0].startswith("error: ") and "not a run id" in lines[0]
    assert sentinel.poll() is None
    assert recorder.count() == 0
    assert _tree(tmp_path) == before


def test_argv_cannot_carry_a_nul() -> None:
    with pytest.raises(ValueError, match="null byte"):
        subprocess.run(
            [sys.executable, "-m", "cloudtrain.cli.main", "status", "a\x00b"], timeout=60
        )


@pytest.mark.parametrize("provider", CLOUDS)
def test_control_a_valid_id_does_reach_the_recorder(
    world: tuple[dict[str, str], Recorder, subprocess.Popen[bytes]], provider: str
) -> None:
    """Without this, "the recorder saw nothing" could mean the SDKs talk elsewhere."""
    env, recorder, _ = world
    region = {"aws": "us-east-1", "gcp": "us-central1", "azure": "eastus"}[provider]
    argv = ["down", "ghost-abcdef", "-p", provider, "--region", region]
    proc = subprocess.Popen(
        [sys.executable, "-m", "cloudtrain.cli.main", *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:  # it may retry the 503s for long: the first connection is all this needs
        deadline = time.monotonic() + 90
        while recorder.count() == 0 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()
    assert recorder.count() > 0, f"{provider}'s SDK never reached the recorder"
