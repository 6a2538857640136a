"""`benchmarks/grpo_length.py` on hand-made evidence folders."""

import importlib.util
import json
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "grpo_length", Path(__file__).resolve().parents[2] / "benchmarks" / "grpo_length.py")
grpo_length = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(grpo_length)


def _stage(run: Path, seed: int, stage: str, hybrid: list[float], passed: list[float]) -> None:
    folder = run / f"seed_{seed}" / stage
    folder.mkdir(parents=True)
    tasks = [{"hybrid": h, "align/passed": p, "align/verifiable": 1.0} for h, p in zip(hybrid, passed)]
    (folder / "done.json").write_text(json.dumps({"per_task": tasks, "per_task_sampled": tasks}))


def _run(root: Path, grpo: list[float], tasks: str = "t1\nt2\n", rewards=(0.5, 0.7)) -> Path:
    for seed in (0, 1):
        (root / f"seed_{seed}" / "data").mkdir(parents=True)
        (root / f"seed_{seed}" / "data" / "eval_tasks.jsonl").write_text(tasks)
        _stage(root, seed, "eval_sft", [0.5, 0.5], [0.0, 1.0])
        _stage(root, seed, "eval_grpo", grpo, [1.0, 1.0])
        (root / f"seed_{seed}" / "grpo").mkdir()
        lines = [{"step": i + 1, "reward": r} for i, r in enumerate(rewards)] + [{"step": 2, "reward": 0.9}]
        (root / f"seed_{seed}" / "grpo" / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)))
    return root


def test_paired_points_pool_the_seeds_from_step_zero(tmp_path):
    runs = {10: _run(tmp_path / "a", [0.6, 0.7]), 20: _run(tmp_path / "b", [0.5, 0.5])}
    points = grpo_length.paired_points(runs, [0, 1])
    steps, mean, se = zip(*points["greedy"]["hybrid"])
    assert steps == (0, 10, 20)
    assert mean[1] == pytest.approx(0.15) and se[1] > 0  # diffs 0.1, 0.2 on each seed
    assert mean[2] == pytest.approx(0.0)
    assert points["sampled"]["success"][1][1] == pytest.approx(0.5)  # one task of two newly passed


def test_training_reward_keeps_the_last_log_of_a_replayed_step(tmp_path):
    curve = grpo_length.training_reward(_run(tmp_path / "a", [0.5, 0.5]), [0], window=2)[0]
    # step 2 was logged 0.7, then 0.9 after a resume: the mean of steps 1-2 uses 0.9, (0.5 + 0.9) / 2
    assert curve == [(1, 0.5), (2, pytest.approx(0.7))]


def test_refuses_runs_with_other_held_out_tasks(tmp_path):
    runs = {10: _run(tmp_path / "a", [0.6, 0.7]), 20: _run(tmp_path / "b", [0.5, 0.5], tasks="t3\nt4\n")}
    with pytest.raises(SystemExit, match="held-out tasks differ"):
        grpo_length._check_same_tasks(runs, [0, 1])


def test_writes_the_table_and_the_figure(tmp_path):
    _run(tmp_path / "a", [0.6, 0.7])
    grpo_length.main(["--run", f"10={tmp_path / 'a'}", "--seeds", "0", "1", "--out", str(tmp_path / "out")])
    text = (tmp_path / "out.md").read_text()
    assert "| 10 | +0.1500 ±" in text and (tmp_path / "out.png").stat().st_size > 0
