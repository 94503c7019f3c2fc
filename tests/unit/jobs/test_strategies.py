"""The strategy registry (`cloudtrain.jobs.strategies`): each declaration says what the program
did by string comparison before it (the role counts of the spec's old rules, the ports, the
launch, TF_CONFIG, what scale varies), and the runtime builds each declared strategy.

Node-side (tests/node-side-tests.txt): standard library and pytest only, no pydantic, no TF.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Iterator
from itertools import product
from operator import attrgetter
from pathlib import Path
from types import ModuleType
from unittest import mock

import pytest

from cloudtrain.jobs import strategies
from cloudtrain.jobs.strategies import STRATEGIES, UNDECLARED, Count, infer, strategy
from cloudtrain.jobs.tf_config import task_tf_config

FIELDS = ("chief", "workers", "ps", "evaluator")
ROLE_OF_FIELD = {"chief": "chief", "workers": "worker", "ps": "ps", "evaluator": "evaluator"}


def old_count_problem(strategy: str, field: str, value: int | None) -> str | None:
    """The spec's rule before the registry (cloudtrain/jobspec/job.py at 88ed924), the oracle."""
    single = strategy in ("one_device", "mirrored", "central_storage", "tpu")  # + issue 32's
    ps = strategy == "parameter_server"
    hvd = strategy == "horovod"
    if field == "chief" and hvd and value:
        return "must be 0 or unset for strategy 'horovod' (worker 0 is the rendezvous host)"
    if field == "evaluator" and hvd and value:
        return "must be 0 for strategy 'horovod' (it has no evaluator node)"
    if field == "chief" and ps and value == 0:
        return "must be 1 or unset for strategy 'parameter_server' (it always has a chief)"
    if field == "chief" and single and value:
        return f"must be 0 or unset for strategy {strategy!r} (its single node is the chief)"
    if field == "workers" and single and value != 1:
        return f"must be 1 for strategy {strategy!r} (got {value}; use multi_worker_mirrored)"
    if field == "ps" and ps and (value or 0) < 1:
        return f"strategy 'parameter_server' needs at least 1 (got {value})"
    if field == "ps" and not ps and value:
        return f"must be 0 for strategy {strategy!r} (only parameter_server uses ps nodes)"
    if field == "evaluator" and single and value:
        return f"must be 0 for strategy {strategy!r}, a single node without an evaluator"
    return None


def test_the_seven_strategies_in_the_spec_order() -> None:
    assert tuple(STRATEGIES) == (
        "one_device",
        "mirrored",
        "multi_worker_mirrored",
        "parameter_server",
        "horovod",
        "central_storage",
        "tpu",
    )
    assert strategies.DEFAULT == "multi_worker_mirrored"
    assert all(name == info.name for name, info in STRATEGIES.items())


# the counts the spec's fields may take within their own limits (chief and evaluator 0..1,
# workers >= 1, ps >= 0; chief may be unset)
SPEC_VALUES = {"chief": (None, 0, 1), "workers": (1, 2, 5), "ps": (0, 1, 3), "evaluator": (0, 1)}


@pytest.mark.parametrize(("name", "field"), list(product(STRATEGIES, FIELDS)))
def test_count_rules_refuse_what_the_old_rules_refused(name: str, field: str) -> None:
    count = STRATEGIES[name].counts()[ROLE_OF_FIELD[field]]
    for value in SPEC_VALUES[field]:
        assert count.problem(name, value) == old_count_problem(name, field, value), value


@pytest.mark.parametrize(
    ("name", "chief", "worker", "ps", "evaluator"),
    [
        # (low, high) per role; high None: no bound of its own
        ("one_device", (0, 0), (1, 1), (0, 0), (0, 0)),
        ("mirrored", (0, 0), (1, 1), (0, 0), (0, 0)),
        ("multi_worker_mirrored", (0, 1), (1, None), (0, 0), (0, 1)),
        ("parameter_server", (1, 1), (1, None), (1, None), (0, 1)),
        ("horovod", (0, 0), (1, None), (0, 0), (0, 0)),  # workers only
        ("central_storage", (0, 0), (1, 1), (0, 0), (0, 0)),
        ("tpu", (0, 0), (1, 1), (0, 0), (0, 0)),  # one TPU VM: a single-host slice
    ],
)
def test_roles_and_counts(
    name: str, chief: tuple, worker: tuple, ps: tuple, evaluator: tuple
) -> None:
    counts = STRATEGIES[name].counts()
    assert list(counts) == list(strategies.ROLES)
    got = {role: (c.low, c.high) for role, c in counts.items()}
    assert got == {"chief": chief, "worker": worker, "ps": ps, "evaluator": evaluator}


def test_an_unset_chief_settles_as_before() -> None:
    # the old rule: 1 under parameter_server, else the value or 0
    for name, value in product(STRATEGIES, (None, 0, 1)):
        if STRATEGIES[name].chief.problem(name, value) is None:
            old = 1 if name == "parameter_server" else (value or 0)
            assert STRATEGIES[name].chief.settle(value) == old, (name, value)


def test_what_each_strategy_declares() -> None:
    single = {n for n, s in STRATEGIES.items() if not s.spans_nodes}
    assert single == {"one_device", "mirrored", "central_storage", "tpu"}
    assert {n: s.scale for n, s in STRATEGIES.items() if s.scale} == dict.fromkeys(
        ("multi_worker_mirrored", "parameter_server", "horovod"), "workers"
    )
    hvd = STRATEGIES["horovod"]
    assert (hvd.launch, hvd.tf_config_roles, hvd.peer_ports) == ("horovod_ranks", (), (1024, 65535))
    assert hvd.image_module == "horovod.tensorflow"
    assert "HOROVOD_RANK" in hvd.reserved_env
    others = [s for s in STRATEGIES.values() if s is not hvd]
    assert all(s.launch == "plain" and s.peer_ports is None for s in others)
    assert all(
        s.tf_config_roles == ("chief", "worker", "ps") and not s.reserved_env for s in others
    )
    assert all(s.image_module is None for s in others)
    serving = {n: s.serving_roles for n, s in STRATEGIES.items() if s.serving_roles}
    assert serving == {"parameter_server": ("worker", "ps")}
    widths = {n: s.data_parallel for n, s in STRATEGIES.items()}
    assert widths["multi_worker_mirrored"] == "tf_config_workers"
    assert widths["horovod"] == "horovod_nodes"
    assert {n for n, s in STRATEGIES.items() if s.device != "gpu"} == {"tpu"}
    ones = ("one_device", "mirrored", "parameter_server", "central_storage", "tpu")
    assert {widths[n] for n in ones} == {"one"}


def test_lookup_never_raises() -> None:
    assert strategy("horovod") is STRATEGIES["horovod"]
    for name in ("multi_worker", "", None, "Horovod"):
        assert strategy(name) is None
    assert UNDECLARED.name not in STRATEGIES and UNDECLARED.launch == "plain"


def test_count_problem_formats_the_name_and_value() -> None:
    assert (
        Count(1, 2, "{name!r}: {value} not in {low}..{high}").problem("x", 3)
        == "'x': 3 not in 1..2"
    )
    assert Count(1, 2).problem("x", None) is None  # unset is low


def test_inference_as_before() -> None:
    def no_gpus() -> int:
        raise AssertionError("asked for GPUs with a cluster")

    assert infer(["chief", "worker", "ps"], no_gpus) == "parameter_server"
    assert infer(["chief", "worker"], no_gpus) == "multi_worker_mirrored"
    assert infer(["chief"], lambda: 2) == "mirrored"
    assert infer([], lambda: 1) == "one_device"


def test_tf_config_follows_the_declaration() -> None:
    cluster = {"chief": ["a:1"], "worker": ["b:1"], "ps": ["c:1"], "evaluator": ["d:1"]}
    ps = STRATEGIES["parameter_server"]
    doc = task_tf_config(ps, cluster, "worker", 0)
    assert doc == {
        "cluster": {"chief": ["a:1"], "worker": ["b:1"], "ps": ["c:1"]},
        "task": {"type": "worker", "index": 0},
    }
    assert task_tf_config(ps, cluster, "evaluator", 0)["task"]["type"] == "evaluator"  # type: ignore[index]
    assert task_tf_config(STRATEGIES["horovod"], {"worker": ["a:1", "b:1"]}, "worker", 1) is None
    assert task_tf_config(STRATEGIES["mirrored"], {"chief": ["a:1"]}, "chief", 0) is None
    assert task_tf_config(UNDECLARED, {"worker": ["a:1"]}, "worker", 0) is not None


# --- the runtime builds every declared strategy -------------------------------------------------
@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", os.environ.get("TF_USE_LEGACY_KERAS", "1"))
    for key in ("CLOUDTRAIN_STRATEGY", "CLOUDTRAIN_ROLE", "CLOUDTRAIN_INDEX", "TF_CONFIG"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.delenv("GRPC_FAIL_FAST", raising=False)
    from cloudtrain.jobs import runtime as module

    module.strategy.cache_clear()
    yield module
    module.strategy.cache_clear()


def test_every_declared_builder_exists(runtime: ModuleType) -> None:
    assert {s.builder for s in STRATEGIES.values()} <= set(runtime._BUILDERS)
    assert {s.data_parallel for s in STRATEGIES.values()} <= set(runtime._WIDTHS)


BUILT = (
    "OneDeviceStrategy",
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "ParameterServerStrategy",
    "get_strategy",
    "experimental.CentralStorageStrategy",
    "TPUStrategy",
)


@pytest.mark.parametrize(
    ("name", "role", "called"),
    [
        ("one_device", "chief", "OneDeviceStrategy"),
        ("mirrored", "chief", "MirroredStrategy"),
        ("multi_worker_mirrored", "worker", "MultiWorkerMirroredStrategy"),
        ("multi_worker_mirrored", "evaluator", "get_strategy"),
        ("parameter_server", "chief", "ParameterServerStrategy"),
        ("parameter_server", "worker", "serve"),
        ("parameter_server", "ps", "serve"),
        ("horovod", "worker", "get_strategy"),
        ("central_storage", "chief", "experimental.CentralStorageStrategy"),
        ("tpu", "chief", "TPUStrategy"),
    ],
)
def test_runtime_builds_the_declared_strategy(
    runtime: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    role: str,
    called: str,
) -> None:
    tf = mock.MagicMock()
    monkeypatch.setitem(sys.modules, "tensorflow", tf)
    monkeypatch.setenv("CLOUDTRAIN_STRATEGY", name)
    monkeypatch.setenv("CLOUDTRAIN_ROLE", role)
    served: list[bool] = []
    monkeypatch.setattr(runtime, "_serve_forever", lambda tf: served.append(True))
    runtime.strategy()
    made = [b for b in BUILT if attrgetter(b)(tf.distribute).called]
    if called == "serve":
        assert served == [True]
    else:
        assert made == [called] and not served
    grpc = os.environ.get("GRPC_FAIL_FAST")
    assert grpc == ("use_caller" if name == "parameter_server" else None)


def test_a_tpu_vm_without_chips_trains_on_one_device(
    runtime: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # what TensorFlow 2.21 raises on a VM without TPU chips (seen on this machine's CPU build)
    class NotFoundError(Exception):
        pass

    tf = mock.MagicMock()
    tf.errors.NotFoundError = NotFoundError
    tf.tpu.experimental.initialize_tpu_system.side_effect = NotFoundError(
        "TPUs not found in the cluster. Failed in initialization: No OpKernel ..."
    )
    monkeypatch.setitem(sys.modules, "tensorflow", tf)
    monkeypatch.setenv("CLOUDTRAIN_STRATEGY", "tpu")
    monkeypatch.setenv("CLOUDTRAIN_ROLE", "chief")
    runtime.strategy()
    assert not tf.distribute.TPUStrategy.called
    tf.distribute.cluster_resolver.TPUClusterResolver.assert_called_once_with(tpu="local")
    tf.distribute.OneDeviceStrategy.assert_called_once()
    said = capsys.readouterr().out
    assert "no TPU on this VM (TPUs not found in the cluster." in said
    assert "training under OneDeviceStrategy instead" in said


def test_runtime_refuses_an_unknown_strategy(
    runtime: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOUDTRAIN_STRATEGY", "tpu_pod")
    with pytest.raises(ValueError, match="unknown CLOUDTRAIN_STRATEGY 'tpu_pod'; expected one"):
        runtime.strategy_name()
    monkeypatch.delenv("CLOUDTRAIN_STRATEGY")
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["a:1"], "ps": ["b:1"]}}))
    assert runtime.strategy_name() == "parameter_server"


# --- no strategy name in quotes outside the registry -------------------------------------------
ROOT = Path(__file__).resolve().parents[3]
REGISTRY = ROOT / "jobs" / "strategies.py"
NAMES = "|".join(map(re.escape, STRATEGIES))
QUOTED_NAME = re.compile(rf"""(["'])({NAMES})\1""")  # 'horovod' or "horovod", not "horovod.x"


# (file, the whole line, stripped): why it may quote a strategy's name. Nothing else may.
ALLOWED = {
    ("providers/gcp/tpu_bodies.py", 'TPU_FIELD = "tpu"'): "the TPU API's QueuedResource field"
    " `tpu` (tpu.v2 discovery document), a word of Google's, no strategy",
}


def quoted_names(files: Iterable[Path], root: Path = ROOT) -> list[str]:
    """`PATH:LINE: text` for each line of `files` holding a declared strategy's name in quotes,
    but the lines ALLOWED."""
    hits = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if (rel, line.strip()) in ALLOWED:
                continue
            if QUOTED_NAME.search(line):
                hits.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return hits


def code_files() -> list[Path]:
    """The program's Python files (cloudtrain/, providers/, jobs/) but the registry."""
    folders = (ROOT / "cloudtrain", ROOT / "providers", ROOT / "jobs")
    return [p for d in folders for p in sorted(d.rglob("*.py")) if p != REGISTRY]


def test_the_check_sees_a_planted_name(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("if s.strategy == 'horovod':\n    x = \"horovod.tensorflow\"\n")
    assert quoted_names([planted], tmp_path) == ["planted.py:1: if s.strategy == 'horovod':"]
    assert len(code_files()) > 100 and REGISTRY not in code_files()


def test_no_strategy_name_in_quotes_outside_the_registry() -> None:
    hits = quoted_names(code_files())
    assert not hits, (
        "a strategy is known by its declaration (jobs/strategies.py), never by comparing its"
        " name: read `ClusterSpec.strategy_info` or `strategies.strategy(name)` instead, at\n"
        + "\n".join(hits)
    )
