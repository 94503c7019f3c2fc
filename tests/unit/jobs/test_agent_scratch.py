"""The job's temporary files live in the node's own folder and go with each attempt.

A killed MultiWorkerMirrored worker never runs its atexit cleanup, so what jobs/runtime.py made
with tempfile (a non-chief's checkpoint, model and TensorBoard folders) was left in the
machine's /tmp: on local, one `cloudtrain-ckpt-worker1-*` per killed worker, for good (313 on
the development machine). The agent gives its setup and training processes TMPDIR=<work>/tmp,
empties it before each attempt and removes it when the attempt ends. A real `Agent` on a real
`LocalStore`; entrypoints are tiny bash commands."""

# ruff: noqa: F811 - the fixtures `store` and `work` are agent_kit's, taken by name

from __future__ import annotations

import tempfile
from pathlib import Path

from cloudtrain.providers.local import LocalStore
from tests.unit.agent_kit import (  # noqa: F401 - the agent tests' fixtures, shared
    make_agent,
    put_json,
    read_logs,
    status_of,
    store,
    work,
)

MAKE_TEMP = 'python -c \'import tempfile; print("TEMP", tempfile.mkdtemp(prefix="ct-job-"))\''


def test_the_jobs_temp_files_are_in_the_node_folder_and_go_at_the_end(
    store: LocalStore, work: Path
) -> None:
    before = set(Path(tempfile.gettempdir()).glob("ct-job-*"))
    agent = make_agent(store, work, entrypoint=MAKE_TEMP, setup=MAKE_TEMP, roles={"chief": 1})
    put_json(store, "cluster.json", agent.cluster)
    assert agent.run() == 0
    assert status_of(store, "chief-0")["state"] == "succeeded"
    made = {  # a set: the log's chunks and its rolled segment both hold each line
        Path(line.split()[-1])
        for line in read_logs(store, "chief-0").splitlines()
        if line.startswith("TEMP ")
    }
    assert len(made) == 2, read_logs(store, "chief-0")  # the setup's and the training's
    assert all(p.is_relative_to(work / "tmp") for p in made), made
    assert not any(p.exists() for p in made), "removed when the attempt ended"
    assert set(Path(tempfile.gettempdir()).glob("ct-job-*")) == before


def test_an_attempt_starts_with_no_temp_files_of_the_one_before(
    store: LocalStore, work: Path
) -> None:
    stale = work / "tmp" / "cloudtrain-ckpt-worker1-abc"  # a killed attempt's leftover
    stale.mkdir(parents=True)
    check = f'test "$TMPDIR" = {work / "tmp"} -a -d "$TMPDIR" -a ! -e "$TMPDIR/{stale.name}"'
    agent = make_agent(store, work, entrypoint=check, roles={"chief": 1})
    put_json(store, "cluster.json", agent.cluster)
    assert agent.run() == 0
    status = status_of(store, "chief-0")
    assert status["state"] == "succeeded", status
