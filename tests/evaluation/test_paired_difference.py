"""GRPO against SFT paired per task: the statistic, and the pipeline report's table of it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from canvasagent.evaluation.metrics import paired_difference, succeeded
from canvasagent.training.report import paired_grpo_gain, write_report

scores = st.lists(st.floats(0, 1), min_size=0, max_size=30)


def test_paired_difference_by_hand():
    before = [{"hybrid": 0.2}, {"hybrid": 0.5}, {"hybrid": 0.9}, {}]
    after = [{"hybrid": 0.4}, {"hybrid": 0.5}, {"hybrid": 0.6}, {"hybrid": 0.3}]
    g = paired_difference(before, after)
    d = [0.2, 0.0, -0.3, 0.3]  # a task without the key scores 0
    mean = sum(d) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
    assert g["n"] == 4 and g["mean_diff"] == pytest.approx(mean) and g["se"] == pytest.approx(sd / 2)
    assert (g["wins"], g["losses"]) == (2, 1)


def test_paired_difference_refuses_different_tasks():
    with pytest.raises(ValueError, match="same tasks"):
        paired_difference([{"hybrid": 1.0}], [])


@given(scores, scores)
def test_paired_difference_is_antisymmetric_and_bounded(a, b):
    n = min(len(a), len(b))
    before, after = [{"hybrid": x} for x in a[:n]], [{"hybrid": x} for x in b[:n]]
    up, down = paired_difference(before, after), paired_difference(after, before)
    assert up["mean_diff"] == pytest.approx(-down["mean_diff"], abs=1e-12) and up["se"] == pytest.approx(down["se"])
    assert -1 <= up["mean_diff"] <= 1 and up["se"] >= 0 and up["wins"] == down["losses"]
    assert up["wins"] + up["losses"] <= n


def test_paired_success_is_the_reported_success_rate():
    # Sampled tasks: align/passed is the share of a task's episodes that passed every check; the
    # task succeeded when at least half did. Paired "success" must pair that, not the share.
    before = [{"align/passed": p} for p in (0.25, 0.5, 0.0, 1.0)]
    after = [{"align/passed": p} for p in (0.5, 0.25, 0.75, 1.0)]
    g = paired_difference(before, after, "success")
    assert g["mean_diff"] == pytest.approx(0.25) and (g["wins"], g["losses"]) == (2, 1)
    assert paired_difference(before, after, "align/passed")["mean_diff"] == pytest.approx(0.1875)


@given(st.lists(st.tuples(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]), st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0])), min_size=1, max_size=30))
def test_paired_success_equals_the_difference_of_success_rates(pairs):
    before, after = [{"align/passed": b} for b, _ in pairs], [{"align/passed": a} for _, a in pairs]
    rate = lambda xs: sum(succeeded(x) for x in xs) / len(xs)
    assert paired_difference(before, after, "success")["mean_diff"] == pytest.approx(rate(after) - rate(before))


def _eval(per_task, per_task_sampled, sources):
    return {"task_sources": sources, "per_task": per_task, "per_task_sampled": per_task_sampled}


def test_report_pairs_grpo_with_sft_per_source(tmp_path: Path):
    sources = ["scripted", "scripted", "canvascraft", "canvascraft"]
    sft = _eval([{"hybrid": h} for h in (0.9, 0.8, 0.2, 0.3)], [{"hybrid": h} for h in (0.5, 0.5, 0.1, 0.1)], sources)
    grpo = _eval([{"hybrid": h} for h in (0.8, 0.8, 0.6, 0.7)], [{"hybrid": h} for h in (0.5, 0.6, 0.3, 0.2)], sources)
    gain = paired_grpo_gain({"eval_sft": sft, "eval_grpo": grpo})
    assert set(gain) == {f"{m}: {s}" for m in ("greedy", "sampled") for s in ("all", "scripted", "canvascraft")}
    assert gain["greedy: scripted"]["mean_diff"] == pytest.approx(-0.05)
    assert gain["greedy: canvascraft"]["mean_diff"] == pytest.approx(0.4) and gain["greedy: canvascraft"]["se"] == pytest.approx(0, abs=1e-9)
    assert gain["sampled: all"]["n"] == 4

    out = write_report(tmp_path, {"eval_sft": sft, "eval_grpo": grpo})
    md = Path(out["markdown"]).read_text()
    assert "| greedy: canvascraft | 2 | +0.400 | 0.000 | 2/0 | up |" in md
    assert "| sampled: scripted | 2 | +0.050 | 0.050 | 1/0 | no |" in md
    assert json.loads(Path(out["json"]).read_text())["grpo_vs_sft"]["greedy: scripted"]["losses"] == 1


def test_paired_table_says_which_way_a_difference_beyond_2_se_goes():
    from canvasagent.training.report import paired_table

    down = paired_difference([{"hybrid": 0.9}, {"hybrid": 0.8}, {"hybrid": 0.7}], [{"hybrid": 0.5}, {"hybrid": 0.3}, {"hybrid": 0.3}])
    assert down["mean_diff"] < -2 * down["se"]
    assert paired_table({"greedy: all": down}).splitlines()[-1].endswith("| 0/3 | down |")


def test_report_leaves_out_the_table_when_the_tasks_do_not_pair(tmp_path: Path):
    sft = _eval([{"hybrid": 0.5}] * 3, [], ["scripted"] * 3)
    grpo = _eval([{"hybrid": 0.5}] * 2, [], ["scripted"] * 2)
    assert paired_grpo_gain({"eval_sft": sft, "eval_grpo": grpo}) == {}
    assert "paired per held-out task" not in Path(write_report(tmp_path, {"eval_sft": sft, "eval_grpo": grpo})["markdown"]).read_text()


def _cell_report(root: Path, cell: str, scores: dict[str, dict[str, float]]) -> None:
    from canvasagent.evaluation.ablation import slug

    path = root / "cells" / slug(cell) / "eval" / "greedy" / "report.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"tasks": [{"task_id": t, "scores": s} for t, s in scores.items()]}))


def test_ablation_cells_are_paired_against_the_reference_cell(tmp_path: Path):
    from canvasagent.evaluation.ablation import paired_against, paired_table

    full = {"t1": {"hybrid": 0.6, "align": 0.5, "traj": 0.4, "rule": 0.9}, "t2": {"hybrid": 0.4, "align": 0.1, "traj": 0.2, "rule": 0.7}}
    _cell_report(tmp_path, "SFT+RL", full)
    # task order in a report does not matter; a legacy total name reads as hybrid
    _cell_report(tmp_path, "w/o outcome reward", {"t2": {"total": 0.3, "align": 0.0, "traj": 0.2, "rule": 0.8},
                                                  "t1": {"hybrid": 0.5, "align": 0.3, "traj": 0.4, "rule": 0.9}})
    _cell_report(tmp_path, "other tasks", {"t1": full["t1"], "t3": full["t2"]})
    paired = paired_against(tmp_path, ["SFT+RL", "w/o outcome reward", "other tasks", "no report"], "SFT+RL")
    assert list(paired) == ["w/o outcome reward"]
    cols = paired["w/o outcome reward"]
    assert cols["hybrid"]["mean_diff"] == pytest.approx(-0.1) and cols["align"]["mean_diff"] == pytest.approx(-0.15)
    assert cols["rule"]["mean_diff"] == pytest.approx(0.05) and cols["traj"]["losses"] == 0
    assert "| w/o outcome reward | -0.100 ± 0.000 | -0.150 ± 0.050 |" in paired_table(paired, "SFT+RL")
    assert paired_against(tmp_path, ["SFT+RL"], "missing") == {}
