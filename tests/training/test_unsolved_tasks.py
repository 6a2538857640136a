"""`grpo_tasks: unsolved`: the pipeline evaluates its SFT checkpoint on the GRPO training tasks and
trains GRPO only on those it does not solve yet (`canvasagent.training.unsolved`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from canvasagent.cli import main
from canvasagent.pipeline import Pipeline, PipelineConfig
from canvasagent.training import unsolved
from toolserver.config import from_dict

DEFAULT_YAML = Path(__file__).parents[2] / "configs" / "pipeline" / "default.yaml"


def test_a_task_is_solved_only_when_every_episode_passed():
    ok = {"align/passed": 1.0}
    assert unsolved.solved(ok, ok)
    assert not unsolved.solved(ok, {"align/passed": 0.75})  # one sampled episode of four failed
    assert not unsolved.solved({"align/passed": 0.0}, ok)
    assert not unsolved.solved({}, ok)  # no verdict is no pass


def test_the_option_sets_grpos_task_ids_and_samples_at_least_once(tmp_path):
    with pytest.raises(ValueError, match="unknown grpo_tasks"):
        PipelineConfig.load(grpo_tasks="hard")
    with pytest.raises(ValueError, match="writes GRPO's data.task_ids itself"):
        PipelineConfig.load(grpo_tasks="unsolved", grpo_overrides={"data.task_ids": "ids.txt"})
    pipe = Pipeline(PipelineConfig.load(out=str(tmp_path), grpo_tasks="unsolved", eval_samples=0))
    assert pipe.grpo.data.task_ids == str(tmp_path.resolve() / "unsolved_tasks" / "task_ids.txt")
    assert pipe.eval_inputs("unsolved_tasks")["samples"] == 1 and pipe.eval_inputs("eval_sft")["samples"] == 0
    assert Pipeline(PipelineConfig.load(out=str(tmp_path))).grpo.data.task_ids is None


@pytest.mark.slow
def test_grpo_trains_only_on_the_training_tasks_the_sft_policy_leaves_unsolved(tmp_path, monkeypatch):
    from canvasagent.training.common import toolbox_factory
    from canvasagent.training.data import grpo_rows
    from canvasagent.training.sources import source_of

    # The main job's mixed data (scripted tasks and a CanvasCraft build), 2 GRPO tasks of each.
    cfg = yaml.safe_load(DEFAULT_YAML.read_text())
    cfg.update(cc_sft_n=3, cc_rl_n=2, cc_eval_n=2, eval_samples=1, cc_mix={"single": 0, "hard": 0, "Flip": 1, "OCR": 1})
    (tmp_path / "pipe.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "main"
    argv = ["pipeline", "--out", str(out), "--config", str(tmp_path / "pipe.yaml"), "--n-eval", "2", "--n-eval-base", "1",
            "--grpo-tasks", "unsolved",
            "--sft-set", "optim.max_steps=2", "--sft-set", "data.n_train=4", "--sft-set", "run.save_steps=0",
            "--grpo-set", "optim.max_steps=1", "--grpo-set", "data.n_train=2", "--grpo-set", "run.save_steps=0",
            "--grpo-set", "grpo.max_completion_length=64", "--grpo-set", "grpo.max_turns=2"]
    assert main(argv) == 0
    stage = out / "unsolved_tasks"
    record = json.loads((stage / "done.json").read_text())
    ids = [x for x in (stage / "task_ids.txt").read_text().splitlines() if not x.startswith("#")]
    assert record["n_tasks"] == 4 and record["unsolved"] == ids and ids  # a 2-step SFT policy solves little
    assert len(list((stage / "sampled").rglob("trajectory.json"))) == 4  # every training task, 1 sample each

    pipe = Pipeline(from_dict(PipelineConfig, {**json.loads((out / "pipeline_config.json").read_text()), "out": str(out)}))
    every = pipe.grpo.__class__.load("grpo_tiny_cpu", {"data.format": "mixed", "data.path": pipe.grpo.data.path, "data.n_train": 2,
                                                       "tools.config": pipe.grpo.tools.config})
    factory = toolbox_factory(every)
    all_rows = [json.loads(r["task"])["id"] for r in grpo_rows(every, factory)]
    # train_tasks are the GRPO rows' tasks in their order: both sources, training split only.
    assert [t.id for t in source_of(every).train_tasks(every, factory())] == all_rows
    assert sum(i.startswith("rl-train") for i in all_rows) == 2 and len(all_rows) == 4
    # (Scripted ids number the tasks of one draw, so held-out scripted tasks reuse them; the build's do not.)
    held = {json.loads(line)["id"] for line in (out / "data" / "eval_tasks.jsonl").read_text().splitlines()}
    assert set(ids) <= set(all_rows) and not {i for i in ids if i.startswith("rl-")} & held
    # GRPO's rows are the unsolved ones, and the reports say so.
    assert sorted(json.loads(r["task"])["id"] for r in grpo_rows(pipe.grpo, factory)) == sorted(ids)
    assert f"GRPO trained on the {len(ids)} of 4 training tasks" in (out / "report" / "report.md").read_text()
    table = [line.split("|")[2:4] for line in (stage / "report.md").read_text().splitlines()
             if line.startswith("| ") and line.split("|")[2].strip().isdigit()]
    assert sum(int(n) for n, _ in table) == 4 and sum(int(u) for _, u in table) == len(ids)

    # A rerun skips the finished stage; other evaluation inputs are refused, not mixed in.
    assert main(argv) == 0
    assert json.loads((stage / "done.json").read_text())["seconds"] == record["seconds"]
    from canvasagent.stage_runner import StaleStage

    (stage / "done.json").unlink()
    with pytest.raises(StaleStage):
        Pipeline(from_dict(PipelineConfig, {**json.loads((out / "pipeline_config.json").read_text()), "out": str(out),
                                             "eval_samples": 2})).run(only=["unsolved_tasks"], isolate=False)
    # A policy that solves every task leaves GRPO nothing to learn from: refused, no id file.
    (stage / "task_ids.txt").unlink()
    monkeypatch.setattr(unsolved, "solved", lambda g, s: True)
    with pytest.raises(ValueError, match="solves all 4 training tasks"):
        pipe.run(only=["unsolved_tasks"], isolate=False)
    assert not (stage / "task_ids.txt").exists() and (stage / "report.md").exists()
