"""benchmarks/train_evidence.py pools paired differences over seeds with a standard error that
does not pretend seeds sharing held-out tasks are independent tasks."""

from __future__ import annotations

import pytest

from tests.training.conftest import benchmark_script


@pytest.fixture(scope="module")
def evidence():
    yield from benchmark_script("train_evidence")  # grpo_pool imports its sibling grpo_fit


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


@pytest.fixture(scope="module")
def built_run(tmp_path_factory):
    """The data stage of a CanvasCraft-only pipeline: 4 GRPO training tasks, 2 held out."""
    from canvasagent.pipeline import Pipeline, PipelineConfig

    out = tmp_path_factory.mktemp("evidence") / "seed_0"
    cfg = PipelineConfig.load("default", out=str(out), data="canvascraft", cc_sft_n=2, cc_rl_n=4, cc_eval_n=2,
                              cc_mix={"single": 0, "hard": 0, "Flip": 1, "Rotate": 1})
    Pipeline(cfg).run(only=["data"], isolate=False)
    return out


def test_the_per_chain_table_counts_each_chains_grpo_training_tasks(evidence, built_run, tmp_path):
    from canvasagent.evaluation.tasks_io import load_tasks

    train = load_tasks(built_run / "data" / "canvascraft" / "rl", split="train")
    pool = evidence.grpo_pool(built_run)
    assert sum(pool.values()) == len(train) == 4
    assert pool == {evidence.chain_key(t.meta, t.expected_tools): n for t, n in
                    ((t, sum(x.meta["chain"] == t.meta["chain"] and x.meta.get("tone") == t.meta.get("tone") for x in train)) for t in train)}
    assert all(k.split(" (")[0] in ("Flip", "Rotate") for k in pool)
    # Held-out rows carry their chain's training-task count; a chain GRPO never trained on carries 0.
    first = next(iter(pool))
    chain, tone = first.split(" (")
    held = [{"meta": {"chain": chain, "tone": tone.rstrip(")")}, "expected_tools": [chain]},
            {"meta": {"chain": "Crop+Rotate", "tone": "explicit"}, "expected_tools": ["Crop", "Rotate"]}]
    res = {stage: {"per_task": [{"hybrid": 0.5, "success": 1.0}] * 2} for stage in ("eval_sft", "eval_grpo")}
    by_chain = evidence._by_chain(held, res, pool)
    assert by_chain[first]["grpo_tasks"] == pool[first] and by_chain["Crop+Rotate (explicit)"]["grpo_tasks"] == 0
    assert "grpo_tasks" not in evidence._by_chain(held, res)[first]
    assert evidence.grpo_pool(tmp_path) is None  # no build: GRPO trained on made tasks


def test_the_grpo_pool_counts_only_the_tasks_a_task_id_file_kept(evidence, built_run, tmp_path):
    import json
    import shutil

    from canvasagent.evaluation.tasks_io import load_tasks

    run = tmp_path / "seed_0"
    shutil.copytree(built_run, run)
    train = load_tasks(run / "data" / "canvascraft" / "rl", split="train")
    kept = train[:2]
    ids = tmp_path / "task_ids.txt"
    ids.write_text("".join(f"{t.id}\n" for t in kept))
    recorded = json.loads((run / "pipeline_config.json").read_text())
    recorded["grpo_overrides"] = {**recorded.get("grpo_overrides", {}), "data.task_ids": str(ids)}
    (run / "pipeline_config.json").write_text(json.dumps(recorded))
    pool = evidence.grpo_pool(run)
    assert sum(pool.values()) == 2
    assert pool == evidence.Counter(evidence.chain_key(t.meta, t.expected_tools) for t in kept)
    ids.unlink()  # the recorded file is gone: refused, not counted as the whole build
    with pytest.raises(ValueError, match="does not exist"):
        evidence.grpo_pool(run)



def test_the_figure_draws_each_seed_and_the_pool_with_two_se_bars(evidence, tmp_path):
    from PIL import Image

    stat = lambda m, se: {"mean_diff": m, "se": se}  # noqa: E731
    rows = [{"seed": s, **{f"{mode}_paired_{k}": stat(0.01 * (s + 1), 0.005) for mode in ("greedy", "sampled")
                           for k in ("hybrid", "success")}} for s in (0, 1)]
    pooled = {f"{mode}_{k}": stat(0.015, 0.004) for mode in ("greedy", "sampled") for k in ("hybrid", "success")}
    path = evidence.draw_paired(rows, pooled, tmp_path / "ev.png")
    with Image.open(path) as im:
        assert im.format == "PNG" and im.width > im.height > 100
    with pytest.raises(KeyError):  # a row without its paired statistics is refused, not drawn blank
        evidence.draw_paired([{"seed": 2}], pooled, tmp_path / "bad.png")
