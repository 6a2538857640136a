"""`benchmarks/stage_compare.py` on hand-made run folders."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "stage_compare", Path(__file__).resolve().parents[2] / "benchmarks" / "stage_compare.py")
stage_compare = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(stage_compare)


def _scores(hybrid: float, passed: bool) -> dict:
    # succeeded(): every verifiable check passed (align/pass_rate 1 with a check to pass)
    return {"hybrid": hybrid, "align/checks": 1.0, "align/verifiable": 1.0, "align/passed": float(passed),
            "align/pass_rate": float(passed)}


def _run(root: Path, stage: str, greedy: list[tuple[float, bool]], sampled: list[tuple[float, bool]] | None,
         tasks: str = '{"id": "t1"}\n{"id": "t2"}\n{"id": "t3"}\n') -> Path:
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "data" / "eval_tasks.jsonl").write_text(tasks)
    (root / stage).mkdir(parents=True, exist_ok=True)
    done = {"per_task": [_scores(*g) for g in greedy],
            "metrics": {"hybrid": sum(h for h, _ in greedy) / len(greedy), "success": sum(p for _, p in greedy) / len(greedy)}}
    if sampled:
        done["per_task_sampled"] = [_scores(*s) for s in sampled]
        done["metrics_sampled"] = {"hybrid": sum(h for h, _ in sampled) / len(sampled),
                                   "success": sum(p for _, p in sampled) / len(sampled)}
    (root / stage / "done.json").write_text(json.dumps(done))
    return root


def test_pairs_each_task_with_itself(tmp_path, capsys):
    a = _run(tmp_path / "a", "eval_sft", [(0.5, False), (0.9, True), (0.7, False)], [(0.4, False), (0.8, True), (0.6, False)])
    b = _run(tmp_path / "b", "eval_grpo", [(0.6, True), (0.9, True), (0.5, False)], [(0.4, False), (0.9, True), (0.9, True)])
    stage_compare.main([str(a), str(b), "--stage", "eval_sft", "--stage-b", "eval_grpo", "--results", str(tmp_path / "r.md")])
    text = (tmp_path / "r.md").read_text()
    greedy = next(line for line in text.splitlines() if line.startswith("| greedy"))
    sampled = next(line for line in text.splitlines() if line.startswith("| sampled"))
    # greedy hybrid: +0.1, 0, -0.2 -> mean -0.0333, sd 0.1528, se 0.0882; success +1, 0, 0
    assert "0.7000 → 0.6667 | -0.0333 ± 0.0882 (1 up, 1 down)" in greedy
    assert "0.333 → 0.667 | +0.3333 ± 0.3333 (1 up, 0 down)" in greedy
    assert "+0.1333 ± 0.0882 (2 up, 0 down)" in sampled and "eval_grpo minus" in text


def test_only_modes_both_runs_have(tmp_path, capsys):
    a = _run(tmp_path / "a", "eval_sft", [(0.5, False)] * 3, None)
    b = _run(tmp_path / "b", "eval_sft", [(0.6, False)] * 3, [(0.6, False)] * 3)
    stage_compare.main([str(a), str(b)])
    out = capsys.readouterr().out
    assert "| greedy" in out and "| sampled" not in out


def test_refuses_other_tasks_and_missing_stages(tmp_path):
    a = _run(tmp_path / "a", "eval_sft", [(0.5, False)] * 3, None)
    b = _run(tmp_path / "b", "eval_sft", [(0.5, False)] * 3, None, tasks='{"id": "other"}\n')
    with pytest.raises(SystemExit, match="different held-out tasks"):
        stage_compare.main([str(a), str(b)])
    c = _run(tmp_path / "c", "eval_sft", [(0.5, False)] * 3, None)
    with pytest.raises(SystemExit, match="no finished eval_grpo"):
        stage_compare.main([str(a), str(c), "--stage", "eval_grpo"])


def test_refuses_modes_with_other_task_counts(tmp_path):
    a = _run(tmp_path / "a", "eval_sft", [(0.5, False)] * 3, [(0.5, False)] * 3)
    b = _run(tmp_path / "b", "eval_sft", [(0.5, False)] * 3, [(0.5, False)] * 2)
    with pytest.raises(SystemExit, match="sampled: 3 tasks against 2"):
        stage_compare.main([str(a), str(b)])
