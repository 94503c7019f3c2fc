"""Unit tests for cloudtrain.jobs.tf_config: TF_CONFIG building and validation."""

from __future__ import annotations

import json

import pytest

from cloudtrain.jobs.tf_config import build_tf_config, chief_task, is_chief, needs_tf_config

CHIEF = ["10.0.0.1:2222"]
WORKERS = ["10.0.0.2:2222", "10.0.0.3:2222"]
PS = ["10.0.0.4:2222"]
EVALUATOR = ["10.0.0.5:2222"]


def test_single_chief() -> None:
    cluster = {"chief": CHIEF}
    assert build_tf_config(cluster, "chief", 0) == {
        "cluster": {"chief": CHIEF},
        "task": {"type": "chief", "index": 0},
    }
    assert chief_task(cluster) == ("chief", 0)
    assert is_chief(cluster, "chief", 0)
    assert not needs_tf_config(cluster)


def test_workers_only() -> None:
    cluster = {"worker": WORKERS}
    for index in range(2):
        config = build_tf_config(cluster, "worker", index)
        assert config == {
            "cluster": {"worker": WORKERS},
            "task": {"type": "worker", "index": index},
        }
        json.dumps(config)  # serialisable as the TF_CONFIG environment variable
    assert chief_task(cluster) == ("worker", 0)
    assert is_chief(cluster, "worker", 0)
    assert not is_chief(cluster, "worker", 1)
    assert needs_tf_config(cluster)


def test_single_worker_still_needs_tf_config() -> None:
    assert needs_tf_config({"worker": WORKERS[:1]})


def test_chief_and_workers() -> None:
    cluster = {"chief": CHIEF, "worker": WORKERS}
    assert build_tf_config(cluster, "worker", 1)["task"] == {"type": "worker", "index": 1}
    assert build_tf_config(cluster, "chief", 0)["cluster"] == cluster
    assert chief_task(cluster) == ("chief", 0)
    assert is_chief(cluster, "chief", 0)
    assert not is_chief(cluster, "worker", 0)
    assert needs_tf_config(cluster)


def test_chief_workers_ps() -> None:
    cluster = {"chief": CHIEF, "worker": WORKERS, "ps": PS}
    for role, index in [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]:
        config = build_tf_config(cluster, role, index)
        assert config["cluster"] == cluster
        assert config["task"] == {"type": role, "index": index}
    assert not is_chief(cluster, "ps", 0)
    assert needs_tf_config(cluster)


def test_evaluator_left_out_of_cluster() -> None:
    cluster = {"chief": CHIEF, "worker": WORKERS, "ps": PS, "evaluator": EVALUATOR}
    expected = {"chief": CHIEF, "worker": WORKERS, "ps": PS}
    config = build_tf_config(cluster, "evaluator", 0)
    assert config == {"cluster": expected, "task": {"type": "evaluator", "index": 0}}
    assert build_tf_config(cluster, "worker", 1)["cluster"] == expected
    assert not is_chief(cluster, "evaluator", 0)


def test_evaluator_without_listing_it() -> None:
    cluster = {"worker": WORKERS}
    assert build_tf_config(cluster, "evaluator", 0)["task"] == {"type": "evaluator", "index": 0}
    with pytest.raises(ValueError, match="out of range"):
        build_tf_config(cluster, "evaluator", 1)


def test_input_not_mutated() -> None:
    cluster = {"worker": WORKERS, "evaluator": EVALUATOR}
    build_tf_config(cluster, "worker", 0)["cluster"]["worker"].append("x:1")
    assert cluster == {"worker": WORKERS, "evaluator": EVALUATOR}
    assert WORKERS == ["10.0.0.2:2222", "10.0.0.3:2222"]


@pytest.mark.parametrize(
    ("cluster", "role", "index", "message"),
    [
        ({"master": CHIEF, "worker": WORKERS}, "worker", 0, "'master' is not accepted"),
        ({"chief": CHIEF, "worker": WORKERS}, "master", 0, "'master' is not accepted"),
        ({"chief": [*CHIEF, "10.0.0.9:2222"]}, "chief", 0, "at most one chief"),
        ({"worker": WORKERS, "evaluator": EVALUATOR * 2}, "worker", 0, "at most one evaluator"),
        ({"worker": WORKERS}, "worker", 2, "out of range"),
        ({"worker": WORKERS}, "worker", -1, "out of range"),
        ({"chief": CHIEF}, "chief", 1, "out of range"),
        ({"worker": WORKERS, "ps": PS}, "worker", 0, "requires a chief"),
        ({"chief": CHIEF, "ps": PS}, "chief", 0, "at least one worker"),
        ({"chief": CHIEF}, "worker", 0, "not present"),
        ({"worker": WORKERS}, "ps", 0, "not present"),
        ({"worker": WORKERS}, "trainer", 0, "unknown role"),
        ({"worker": WORKERS, "trainer": PS}, "worker", 0, "unknown role"),
        ({}, "chief", 0, "empty"),
        ({"chief": [], "worker": []}, "chief", 0, "empty"),
        ({"chief": CHIEF, "worker": []}, "chief", 0, "no addresses"),
        ({"worker": [""]}, "worker", 0, "empty address"),
        ({"worker": ["10.0.0.2"]}, "worker", 0, "host:port"),
        ({"worker": "10.0.0.2:2222"}, "worker", 0, "must be a list"),
        ({"evaluator": EVALUATOR}, "evaluator", 0, "chief or at least one worker"),
        ({"worker": WORKERS}, "worker", True, "must be an int"),
    ],
)
def test_invalid_layouts(cluster: dict, role: str, index: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_tf_config(cluster, role, index)
