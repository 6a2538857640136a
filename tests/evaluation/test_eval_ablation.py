"""The ablation grid: stages, skip-on-rerun, failures, Table-5 table and curves (training faked)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from canvasagent.cli import main as cli_main
from canvasagent.evaluation.ablation import AblationConfig, AblationRunner, cli_trainer, slug
from canvasagent.evaluation.metrics import TaskResult, policy_metrics
from canvasagent.training.evaluate import EvalResult

GRID = {
    "name": "test grid",
    "train": {"sft_config": "sft_tiny_cpu", "grpo_config": "grpo_tiny_cpu"},
    "eval": {"tasks": "SPLIT", "judge": "offline", "preset": "paper", "max_turns": 2, "policy_options": {"max_new_tokens": 8}},
    "cells": [
        {"name": "SFT only", "sft": True, "grpo": False},
        {"name": "RL only", "sft": False, "grpo": True},
        {"name": "SFT+RL", "sft": True, "grpo": True},
        {"name": "w/o outcome reward", "sft": True, "grpo": True, "reward_preset": "no-outcome"},
        {"name": "w/o process reward", "sft": True, "grpo": True, "reward_preset": "no-process"},
    ],
}


@pytest.fixture
def grid(tmp_path, eval_split):
    g = json.loads(json.dumps(GRID))
    g["eval"]["tasks"] = str(eval_split)
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(g))
    return path


class FakeTrainer:
    def __init__(self, fail: set[str] | None = None):
        self.calls: list[tuple[str, dict]] = []
        self.fail = fail or set()

    def __call__(self, kind, config, out: Path, overrides, log_path):
        from canvasagent.stage_runner import StageFailed

        self.calls.append((kind, dict(overrides)))
        if overrides.get("grpo.reward_preset") in self.fail:
            raise StageFailed("boom")  # what train_command raises for a failed run
        (out / "final").mkdir(parents=True, exist_ok=True)
        key = "loss" if kind == "sft" else "reward"
        (out / "metrics.jsonl").write_text("\n".join(json.dumps({"step": i, key: 1.0 / (i + 1)}) for i in range(5)))
        return out / "final"


def fake_evaluator(calls):
    def evaluate(checkpoint, out, title):
        calls.append((str(checkpoint), title))
        value = {"SFT only": 0.55, "RL only": 0.6, "SFT+RL": 0.82, "w/o outcome reward": 0.63, "w/o process reward": 0.38}[title]
        res = [TaskResult("t0", scores={"hybrid": value, "align": value, "aes": 0.7, "traj": value, "rule": value}, n_turns=3, valid_replies=3)]
        return {"greedy": EvalResult(policy_metrics(res), res)}

    return evaluate


def test_grid_runs_shares_sft_and_skips_finished_cells(grid, tmp_path):
    cfg = AblationConfig.load(grid)
    trainer, evals = FakeTrainer(), []
    out = AblationRunner(cfg, tmp_path / "abl", trainer, fake_evaluator(evals)).run()
    kinds = [k for k, _ in trainer.calls]
    assert kinds == ["sft", "grpo", "grpo", "grpo", "grpo"]  # one shared SFT run
    grpo = [o for k, o in trainer.calls if k == "grpo"]
    assert grpo[0]["run.init_from"] is None  # RL only starts from the base model
    assert all(o["run.init_from"].endswith("sft/final") for o in grpo[1:])
    assert [o["grpo.reward_preset"] for o in grpo] == ["paper", "paper", "no-outcome", "no-process"]
    assert evals[0] == (str(tmp_path / "abl" / "sft" / "final"), "SFT only")
    md = out["markdown"]
    assert "| Setting | Hybrid | Align. | Aes. | Traj. | Rule | Calls |" in md
    assert "| SFT+RL | 0.820 |" in md and "| w/o process reward | 0.380 |" in md
    assert (tmp_path / "abl" / "curves.png").stat().st_size > 1000
    # Rerun: every cell is skipped, nothing trains or evaluates again.
    trainer2, evals2 = FakeTrainer(), []
    again = AblationRunner(cfg, tmp_path / "abl", trainer2, fake_evaluator(evals2)).run()
    assert trainer2.calls == [] and evals2 == [] and again["markdown"] == md


def test_failed_cell_is_reported_and_retried(grid, tmp_path):
    cfg = AblationConfig.load(grid)
    out = AblationRunner(cfg, tmp_path / "abl", FakeTrainer(fail={"no-outcome"}), fake_evaluator([])).run()
    assert set(out["failures"]) == {"w/o outcome reward"} and "FAILED" in out["markdown"]
    trainer = FakeTrainer()
    out = AblationRunner(cfg, tmp_path / "abl", trainer, fake_evaluator([])).run()
    assert out["failures"] == {} and [k for k, _ in trainer.calls] == ["grpo"]  # only the failed cell reruns


def test_a_grid_resumed_under_changed_settings_is_refused_before_anything_trains(grid, tmp_path):
    """A finished grid rerun with another reply limit, or with a cell's reward changed, names
    every stale cell and what changed, and trains nothing; the unchanged grid resumes."""
    from canvasagent.stage_runner import StaleStage

    AblationRunner(AblationConfig.load(grid), tmp_path / "abl", FakeTrainer(), fake_evaluator([])).run()
    longer = AblationConfig.load(grid)
    longer.eval.policy_options["max_new_tokens"] = 384
    trainer = FakeTrainer()
    with pytest.raises(StaleStage, match=r"(?s)sft-only holds work.*'max_new_tokens': 8.*'max_new_tokens': 384.*w-o-process-reward holds"):
        AblationRunner(longer, tmp_path / "abl", trainer, fake_evaluator([])).run()
    assert trainer.calls == []
    other_reward = AblationConfig.load(grid)
    other_reward.cells[2].reward_preset = "no-process"
    with pytest.raises(StaleStage, match=r"sft-rl holds work done under other inputs than this run's \(cell: ") as e:
        AblationRunner(other_reward, tmp_path / "abl", FakeTrainer(), fake_evaluator([])).run()
    assert "sft-only" not in str(e.value)  # only the cell whose spec changed
    assert AblationRunner(AblationConfig.load(grid), tmp_path / "abl", trainer, fake_evaluator([])).run()["failures"] == {}
    assert trainer.calls == []


@pytest.mark.parametrize("limit", [0, -5, 2.5, "96", True])
def test_a_grid_with_an_unusable_reply_limit_is_refused_at_load(grid, tmp_path, limit):
    g = yaml.safe_load(grid.read_text())
    g["eval"]["policy_options"]["max_new_tokens"] = limit
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(g))
    with pytest.raises(ValueError, match="max_new_tokens must be an integer of at least 1 or null"):
        AblationConfig.load(path)


def test_cli_trainer_runs_a_subprocess_and_resumes(tmp_path):
    script = tmp_path / "fake_train.py"
    script.write_text(textwrap.dedent("""
        import sys, pathlib
        args = sys.argv[1:]
        out = pathlib.Path(args[args.index("--output-dir") + 1])
        print("ARGS", " ".join(args))
        if "fail=1" in args:
            sys.exit(3)
        (out / "final").mkdir(parents=True, exist_ok=True)
    """))
    train = cli_trainer([sys.executable, str(script)])
    out = tmp_path / "run"
    (out / "checkpoint-5").mkdir(parents=True)
    final = train("grpo", "grpo_tiny_cpu", out, {"grpo.reward_preset": "no-outcome", "run.init_from": None}, out / "train.log")
    assert final == out / "final"
    log = (out / "train.log").read_text()
    assert "-m canvasagent.train grpo --config grpo_tiny_cpu" in log and "--set run.init_from=null" in log and "--resume" in log
    from canvasagent.stage_runner import StageFailed

    with pytest.raises(StageFailed, match="exit 3"):
        train("sft", "x", tmp_path / "r2", {"fail": 1}, tmp_path / "r2.log")


def test_shipped_grids_load_and_dry_run(capsys, tmp_path):
    names = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "configs" / "ablation").glob("*.yaml"))
    assert {"paper", "tiny_cpu", "tiny_cpu_precision"} <= set(names)
    for name in names:
        cfg = AblationConfig.load(name)
        assert [slug(c.name) for c in cfg.cells] == ["sft-only", "rl-only", "sft-rl", "w-o-outcome-reward", "w-o-process-reward"]
    assert cli_main(["ablate", "--grid", "tiny_cpu", "--out", str(tmp_path / "unused-ablation-dir"), "--dry-run"]) == 0
    assert not (tmp_path / "unused-ablation-dir").exists()  # a dry run writes nothing
    text = capsys.readouterr().out
    assert "train sft  --config sft_tiny_cpu" in text and "reward no-process, from sft/final" in text


def test_only_named_cells_run_and_the_table_keeps_finished_ones(grid, tmp_path):
    cfg = AblationConfig.load(grid)
    trainer = FakeTrainer()
    AblationRunner(cfg, tmp_path / "abl", trainer, fake_evaluator([])).run(only=["SFT only"])
    assert [k for k, _ in trainer.calls] == ["sft"]
    trainer2 = FakeTrainer()
    out = AblationRunner(cfg, tmp_path / "abl", trainer2, fake_evaluator([])).run(only=["SFT+RL"])
    assert [k for k, _ in trainer2.calls] == ["grpo"]  # the SFT run is shared, not repeated
    assert "| SFT only |" in out["markdown"] and "| SFT+RL |" in out["markdown"] and "| RL only |" not in out["markdown"]
    assert cli_main(["ablate", "--grid", str(grid), "--out", str(tmp_path / "abl"), "--cell", "No such cell"]) == 2


def test_with_grpo_tasks_unsolved_every_grpo_cell_trains_on_what_the_shared_sft_leaves_unsolved(grid, tmp_path, monkeypatch):
    """A data pipeline with `grpo_tasks: unsolved`: the shared SFT is evaluated once on the GRPO
    training tasks (never the held-out ones) and every GRPO cell, RL only included, gets the id file."""
    pipe = tmp_path / "pipe.yaml"
    pipe.write_text(yaml.safe_dump({
        "data": "canvascraft", "grpo_tasks": "unsolved", "eval_samples": 2,
        "cc_mix": {"single": 0, "hard": 0, "Flip": 1}, "cc_sft_n": 2, "cc_rl_n": 3, "cc_eval_n": 2,
        "sft_overrides": {}, "grpo_overrides": {"tools.config": "offline_small"},
    }))
    g = yaml.safe_load(grid.read_text())
    g["data"] = str(pipe)
    g["cells"] = g["cells"][:3]  # SFT only, RL only, SFT+RL
    path = tmp_path / "grid_unsolved.yaml"
    path.write_text(yaml.safe_dump(g))
    seen = []

    def evaluate_checkpoint(checkpoint, tasks, scorer, toolbox, tool_fns, out, **kw):
        # Every task passes but the first training task (whose sampled episodes fail).
        seen.append((str(out), [t.id for t in tasks]))
        res = [TaskResult(t.id, scores={"hybrid": 0.5, "align/passed": 1.0}, n_turns=1, valid_replies=1) for t in tasks]
        failing = [TaskResult(t.id, scores={"hybrid": 0.5, "align/passed": 0.0 if t.id == tasks[0].id and "rl-train" in t.id else 1.0},
                              n_turns=1, valid_replies=1) for t in tasks]
        return {"greedy": EvalResult(policy_metrics(res), res),
                **({"sampled": EvalResult(policy_metrics(failing), failing)} if kw.get("samples") else {})}

    monkeypatch.setattr("canvasagent.training.evaluate.evaluate_checkpoint", evaluate_checkpoint)
    out_dir = tmp_path / "abl"
    runner = AblationRunner(AblationConfig.load(path), out_dir, FakeTrainer())
    plan = runner.plan()
    assert not runner.problems() and any(step.startswith("unsolved_tasks:") for step in plan)
    assert not any(step.endswith("[done]") for step in plan)
    trainer = runner.trainer
    runner.run()
    # --dry-run on the finished grid: every stage it listed is marked done (a rerun skips it).
    assert runner.plan() == [f"{step}  [done]" for step in plan]
    ids_file = out_dir / "unsolved_tasks" / "task_ids.txt"
    ids = [x for x in ids_file.read_text().splitlines() if not x.startswith("#")]
    from canvasagent.evaluation.tasks_io import load_tasks

    train = load_tasks(out_dir / "data" / "canvascraft" / "rl", split="train")
    assert ids == [train[0].id]
    assert [(k, o.get("data.task_ids")) for k, o in trainer.calls] == [("sft", None), ("grpo", str(ids_file)), ("grpo", str(ids_file))]
    # The SFT was evaluated on the training split once, then the three cells on the held-out one.
    assert [len(t) for o, t in seen if o.endswith("unsolved_tasks")] == [3]
    assert sum(1 for o, _ in seen if "cells" in o) == 3


def test_grid_data_from_a_pipeline_config_trains_and_evaluates_on_its_build(grid, tmp_path, monkeypatch):
    """`data: <pipeline>` builds that pipeline's CanvasCraft data once (real offline build) and
    points every run, the eval split and the policy's tool list at it."""
    pipe = tmp_path / "pipe.yaml"
    pipe.write_text(yaml.safe_dump({
        "data": "canvascraft", "cc_chains": ["chains", "chains_offline"],
        "cc_mix": {"single": 0, "hard": 0, "offline": 0, "Flip": 1}, "cc_rl_mix": {"single": 0, "hard": 0, "offline": 0, "Rotate+Flip": 1},
        "cc_sft_n": 2, "cc_rl_n": 2, "cc_eval_n": 2,
        "sft_overrides": {}, "grpo_overrides": {"tools.config": "offline_small", "optim.max_steps": 3},
    }))
    g = yaml.safe_load(grid.read_text())
    g["data"] = str(pipe)
    g["eval"]["policy_options"]["layout"] = "train"
    g["cells"] = g["cells"][:3]
    path = tmp_path / "grid_data.yaml"
    path.write_text(yaml.safe_dump(g))
    cfg = AblationConfig.load(path)
    trainer, seen = FakeTrainer(), []

    def evaluate_checkpoint(checkpoint, tasks, scorer, toolbox, tool_fns, out, **kw):
        # The pipeline's evaluator, given what the pipeline would give it for the grid's data.
        seen.append({"tasks": tasks, "tools": [f.__name__ for f in tool_fns], "out": out, **kw})
        res = [TaskResult(t.id, scores={"hybrid": 0.5, "align/passed": 1.0}, n_turns=1, valid_replies=1) for t in tasks]
        return {"greedy": EvalResult(policy_metrics(res), res)}

    monkeypatch.setattr("canvasagent.training.evaluate.evaluate_checkpoint", evaluate_checkpoint)
    out_dir = tmp_path / "abl"
    res = AblationRunner(cfg, out_dir, trainer).run()
    cc = out_dir / "data" / "canvascraft"
    sft_over = trainer.calls[0][1]
    assert sft_over["data.format"] == "canvascraft" and sft_over["data.path"] == str(cc / "sft")
    assert all(o["data.path"] == str(cc / "rl") and o["tools.config"] == "offline_small" and o["optim.max_steps"] == 3
               for k, o in trainer.calls if k == "grpo")
    assert "tools.config" not in sft_over  # only the GRPO runs get the pipeline's GRPO overrides
    assert sft_over["tools.names"] == ["Rotate", "Flip"]  # registry order, the tools of both mixes
    from canvasagent.evaluation.tasks_io import load_tasks

    assert len(seen) == 3 and all([t.id for t in s["tasks"]] == [t.id for t in load_tasks(cc / "rl")] for s in seen)
    assert [t.expected_tools for t in seen[0]["tasks"]] == [["Rotate", "Flip"]] * 2
    assert seen[0]["tools"] == ["Flip", "Rotate"]  # the training tool functions, in TRL's (sorted) order
    assert seen[0]["samples"] == 0 and seen[0]["temperature"] == 1.0 and seen[0]["max_new_tokens"] == 8
    assert seen[0]["out"] == out_dir / "cells" / "sft-only" / "eval"
    assert res["cells"]["SFT only"]["success_rate"] == 1.0
    assert (out_dir / "cells" / "sft-only" / "eval" / "greedy" / "report.md").exists()


def test_grid_data_from_a_mixed_pipeline_evaluates_every_source(grid, tmp_path, monkeypatch):
    """A pipeline of two sources (scripted + CanvasCraft) feeds the grid as it feeds the pipeline:
    the runs get its data fields, and every cell is evaluated on the held-out tasks of both, its
    replies as long as the GRPO runs' (max_new_tokens null: max_completion_length)."""
    from canvasagent.pipeline import Pipeline, PipelineConfig

    pipe = tmp_path / "pipe.yaml"
    pipe.write_text(yaml.safe_dump({
        "data": "mixed", "n_eval": 2, "cc_chains": ["chains", "chains_offline"],
        "cc_mix": {"single": 0, "hard": 0, "offline": 0, "Flip": 1}, "cc_sft_n": 2, "cc_rl_n": 2, "cc_eval_n": 2,
        "sft_overrides": {}, "grpo_overrides": {},
    }))
    g = yaml.safe_load(grid.read_text())
    g["data"], g["cells"] = str(pipe), g["cells"][:1]
    g["eval"]["policy_options"]["max_new_tokens"] = None  # as the pipeline's eval_max_new_tokens: null
    path = tmp_path / "grid_mixed.yaml"
    path.write_text(yaml.safe_dump(g))
    seen, limits = [], []

    def evaluate_checkpoint(checkpoint, tasks, scorer, toolbox, tool_fns, out, **kw):
        seen.append(tasks)
        limits.append(kw["max_new_tokens"])
        res = [TaskResult(t.id, scores={"hybrid": 0.5}, n_turns=1, valid_replies=1) for t in tasks]
        return {"greedy": EvalResult(policy_metrics(res), res)}

    monkeypatch.setattr("canvasagent.training.evaluate.evaluate_checkpoint", evaluate_checkpoint)
    out_dir = tmp_path / "abl"
    trainer = FakeTrainer()
    AblationRunner(AblationConfig.load(path), out_dir, trainer).run()
    expected = Pipeline(PipelineConfig.load(pipe, out=str(out_dir)))
    assert trainer.calls[0][1]["data.format"] == "mixed"
    assert trainer.calls[0][1]["data.path"] == str(out_dir / "data" / "canvascraft" / "sft")
    tasks, sources = expected.eval_tasks()
    assert sources == ["scripted"] * 2 + ["canvascraft"] * 2
    assert [t.id for t in seen[0]] == [t.id for t in tasks]
    assert limits == [expected.grpo.grpo.max_completion_length] == [384]


def test_cell_records_written_by_earlier_code_are_read(grid, tmp_path):
    # A finished cell recorded with the legacy total name and no peak RSS; a reused SFT run with a note.
    out = tmp_path / "abl"
    old = {"name": "SFT only", "metrics": {"overall": 0.5, "align": 0.4, "aes": 0.3, "traj": 0.2, "rule": 0.1, "calls": 1.0},
           "success_rate": 0.25, "valid_reply_rate": 0.75, "checkpoint": str(out / "sft" / "final"), "seconds": 60.0}
    (out / "cells" / "sft-only").mkdir(parents=True)
    (out / "cells" / "sft-only" / "done.json").write_text(json.dumps(old, indent=2))
    (out / "sft").mkdir()
    (out / "sft" / "done.json").write_text(json.dumps({"final": str(out / "sft" / "final"), "seconds": 0, "note": "reused"}))
    trainer = FakeTrainer()
    res = AblationRunner(AblationConfig.load(grid), out, trainer, fake_evaluator([])).run(only=["SFT only", "SFT+RL"])
    assert [k for k, _ in trainer.calls] == ["grpo"]  # neither the cell nor the SFT run again
    assert "| SFT only | 0.500 | 0.400 |" in res["markdown"] and "| SFT only | 0.250 | 0.750 | 1.0 |" in res["markdown"]


def test_sampled_evaluations_get_their_own_table_and_paired_rows(grid, tmp_path):
    """With sampled results (eval.samples), table.md adds the sampled metrics, success and the
    sampled paired differences against SFT+RL; a rerun reads them back from the done markers."""
    def evaluate(checkpoint, out, title):
        res = {}
        for mode, shift in (("greedy", 0.0), ("sampled", -0.1)):
            value = {"SFT only": 0.55, "RL only": 0.05, "SFT+RL": 0.82, "w/o outcome reward": 0.63, "w/o process reward": 0.38}[title] + shift
            tasks = [TaskResult(f"t{i}", scores={"hybrid": value + 0.01 * i, "align": value, "aes": 0.7, "traj": value, "rule": value},
                                n_turns=2, valid_replies=2) for i in range(3)]
            res[mode] = EvalResult(policy_metrics(tasks), tasks)
            (out / mode).mkdir(parents=True, exist_ok=True)
            (out / mode / "report.json").write_text(json.dumps({"tasks": [{"task_id": t.task_id, "scores": t.scores} for t in tasks]}))
        return res

    cfg = AblationConfig.load(grid)
    cfg.eval.samples = 4
    first = AblationRunner(cfg, tmp_path / "abl", FakeTrainer(), evaluate).run()
    again = AblationRunner(cfg, tmp_path / "abl", FakeTrainer(), evaluate).run()  # every cell from its done.json
    for out in (first, again):
        md = out["markdown"]
        sampled_part = md.split("Sampled (4 episodes a task", 1)[1]
        assert "| SFT+RL | 0.730 |" in sampled_part and "| SFT only | 0.460 |" in sampled_part
        rows = out["paired_vs_reference"]["cells_sampled"]
        assert rows["SFT only"]["hybrid"]["mean_diff"] == pytest.approx(-0.27)
        assert rows["w/o process reward"]["rule"]["mean_diff"] == pytest.approx(-0.44)
        assert out["cells"]["SFT+RL"]["metrics_sampled"]["hybrid"] == pytest.approx(0.73)
        # The Table-5 claims, per mode: every one holds here (each gap is the same on every task).
        for mode in ("greedy", "sampled"):
            claims = {(c["higher"], c["lower"], c["column"]): c for c in out["table5_shape"][mode]}
            assert len(claims) == 5 and all(c["holds"] and c["beyond_2se"] for c in claims.values())
            assert claims[("SFT only", "RL only", "hybrid")]["mean_diff"] == pytest.approx(0.5)
            assert f"Against paper Table 5's shape ({mode};" in md
        assert "| SFT+RL > w/o process reward | rule | +0.440 ± 0.000 | yes | yes |" in md
