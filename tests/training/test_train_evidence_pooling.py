"""benchmarks/train_evidence.py pools paired differences over seeds with a standard error that
does not pretend seeds sharing held-out tasks are independent tasks."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "train_evidence.py"


@pytest.fixture(scope="module")
def evidence():
    spec = importlib.util.spec_from_file_location("train_evidence", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _scores(values):
    return [{"hybrid": v} for v in values]


def test_shared_tasks_cluster_the_standard_error(evidence):
    # Three seeds on the same two tasks: task a always gains 1, task b never moves.
    ids = ["a", "b"] * 3
    p = evidence.pooled_paired(ids, _scores([0.0] * 6), _scores([1, 0] * 3), "hybrid")
    assert p["n"] == 6 and p["tasks"] == 2 and p["mean_diff"] == pytest.approx(0.5)
    assert p["se_pairs"] == pytest.approx((0.3 / 6) ** 0.5)
    assert p["se_tasks"] == pytest.approx(0.5) and p["se"] == p["se_tasks"]


def test_distinct_tasks_keep_the_per_pair_standard_error(evidence):
    ids = [f"s{s}-{i}" for s in range(3) for i in range(2)]
    p = evidence.pooled_paired(ids, _scores([0.0] * 6), _scores([1, 0, 0.5, 0.2, 0.9, 0.1]), "hybrid")
    assert p["tasks"] == 6 and p["se_tasks"] == pytest.approx(p["se_pairs"]) and p["se"] == pytest.approx(p["se_pairs"])
    with pytest.raises(ValueError):
        evidence.pooled_paired(ids[:5], _scores([0.0] * 6), _scores([0.0] * 6), "hybrid")
