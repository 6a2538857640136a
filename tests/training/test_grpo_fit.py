"""benchmarks/grpo_fit.py evaluates a finished run's SFT and GRPO checkpoints on the run's own GRPO
training tasks, paired per task, beside its held-out numbers."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from canvasagent.cli import main as cli_main
from tests.training.conftest import benchmark_script
DEFAULT_YAML = Path(__file__).parents[2] / "configs" / "pipeline" / "default.yaml"


@pytest.fixture(scope="module")
def grpo_fit():
    yield from benchmark_script("grpo_fit")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A CanvasCraft-only pipeline run with minimal budgets: 2 GRPO training tasks, 2 held out."""
    tmp = tmp_path_factory.mktemp("fit")
    cfg = yaml.safe_load(DEFAULT_YAML.read_text())
    cfg.update(data="canvascraft", cc_sft_n=3, cc_rl_n=2, cc_eval_n=2, eval_samples=2,
               cc_mix={"single": 0, "hard": 0, "Flip": 1, "OCR": 1})
    (tmp / "pipe.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp / "run"
    argv = ["pipeline", "--out", str(out), "--config", str(tmp / "pipe.yaml"), "--n-eval-base", "1",
            "--sft-set", "optim.max_steps=2", "--sft-set", "run.save_steps=0",
            "--grpo-set", "optim.max_steps=1", "--grpo-set", "run.save_steps=0",
            "--grpo-set", "grpo.max_completion_length=64", "--grpo-set", "grpo.max_turns=2"]
    assert cli_main(argv) == 0
    return out


@pytest.mark.slow
def test_the_training_split_is_evaluated_paired_beside_the_held_out_one(grpo_fit, finished_run, tmp_path):
    md = tmp_path / "fit.md"
    assert grpo_fit.main(["--run", str(finished_run), "--md", str(md)]) == 0
    report = json.loads((finished_run / "fit_train" / "report.json").read_text())
    assert report["n_tasks"] == 2
    assert set(report["train"]) == {"greedy", "sampled"} and set(report["held_out"]) == {"greedy", "sampled"}
    assert report["train"]["greedy"]["paired"]["hybrid"]["n"] == 2
    # The episodes are those of the GRPO train split, not the held-out one.
    ids = {json.loads(p.read_text())["task"]["id"] for p in (finished_run / "fit_train" / "sft" / "greedy").rglob("trajectory.json")}
    assert len(ids) == 2 and all(i.startswith("rl-train") for i in ids), ids
    held = {json.loads(line)["id"] for line in (finished_run / "data" / "eval_tasks.jsonl").read_text().splitlines()}
    assert not ids & held
    text = md.read_text()
    assert "| train | greedy |" in text and "| held out | sampled |" in text


@pytest.mark.slow
def test_one_checkpoint_against_itself_differs_by_nothing(grpo_fit, finished_run, tmp_path):
    # Same weights, same tasks, same sampling seed: every paired difference is exactly zero, so the
    # evaluation of the two checkpoints is deterministic and any difference reported comes from the
    # weights. (With two tasks this does not prove the pairing; the order is evaluate_checkpoint's.)
    run = tmp_path / "same"
    shutil.copytree(finished_run, run, ignore=shutil.ignore_patterns("fit_train*"))
    shutil.rmtree(run / "grpo" / "final")
    shutil.copytree(run / "sft" / "final", run / "grpo" / "final")
    assert grpo_fit.main(["--run", str(run)]) == 0
    train = json.loads((run / "fit_train" / "report.json").read_text())["train"]
    for mode in ("greedy", "sampled"):
        for key in ("hybrid", "success", "pass_rate"):
            d = train[mode]["paired"][key]
            assert d["mean_diff"] == 0 and d["wins"] == d["losses"] == 0, (mode, key, d)


@pytest.mark.slow
def test_a_limit_measures_in_a_folder_of_its_own(grpo_fit, finished_run):
    assert grpo_fit.main(["--run", str(finished_run), "--limit", "1"]) == 0
    report = json.loads((finished_run / "fit_train_first1" / "report.json").read_text())
    assert report["n_tasks"] == 1 and report["train"]["sampled"]["paired"]["hybrid"]["n"] == 1
    assert len(list((finished_run / "fit_train_first1" / "sft" / "greedy").rglob("trajectory.json"))) == 1
    with pytest.raises(SystemExit):
        grpo_fit.main(["--run", str(finished_run), "--limit", "0"])


@pytest.mark.slow
def test_episodes_of_another_checkpoint_are_not_reused(grpo_fit, finished_run, tmp_path):
    run = tmp_path / "retrained"
    shutil.copytree(finished_run, run, ignore=shutil.ignore_patterns("fit_train*"))
    assert grpo_fit.main(["--run", str(run), "--limit", "1"]) == 0
    weights = next((run / "grpo" / "final").glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    with pytest.raises(SystemExit, match="other checkpoints or evaluation inputs"):
        grpo_fit.main(["--run", str(run), "--limit", "1"])


def test_a_run_without_its_grpo_checkpoint_is_refused(grpo_fit, tmp_path):
    (tmp_path / "sft" / "final").mkdir(parents=True)
    with pytest.raises(SystemExit, match="grpo/final is missing"):
        grpo_fit.main(["--run", str(tmp_path)])


@pytest.fixture(scope="module")
def unsolved_tasks():
    yield from benchmark_script("unsolved_tasks")


def test_a_task_is_solved_only_when_every_episode_passed(unsolved_tasks):
    ok = {"align/passed": 1.0}
    assert unsolved_tasks.solved(ok, ok)
    assert not unsolved_tasks.solved(ok, {"align/passed": 0.75})  # one sampled episode of four failed
    assert not unsolved_tasks.solved({"align/passed": 0.0}, ok)
    assert not unsolved_tasks.solved({}, ok)  # no verdict is no pass


@pytest.mark.slow
def test_unsolved_training_tasks_become_a_grpo_task_id_file(unsolved_tasks, finished_run, tmp_path, monkeypatch):
    from canvasagent.training.common import toolbox_factory
    from canvasagent.training.config import TrainConfig
    from canvasagent.training.data import grpo_rows

    ids_file = tmp_path / "ids.txt"
    assert unsolved_tasks.main(["--run", str(finished_run), "--samples", "2", "--ids", str(ids_file)]) == 0
    folder = finished_run / "unsolved_tasks" / "rl"
    ids = [x for x in ids_file.read_text().splitlines() if not x.startswith("#")]
    # The 2-step SFT policy solves nothing: both training tasks are listed, no held-out one.
    assert len(ids) == 2 and all(i.startswith("rl-train") for i in ids), ids
    assert len(list((folder / "sampled").rglob("trajectory.json"))) == 4  # 2 tasks x 2 samples
    rows = [line.split("|")[1:4] for line in (folder / "report.md").read_text().splitlines() if line.startswith("| ") and line.endswith(" |") and line.split("|")[2].strip().isdigit()]
    assert sum(int(r[1]) for r in rows) == 2 and sum(int(r[2]) for r in rows) == 2  # per chain: tasks, unsolved
    # The file is what GRPO's data.task_ids reads.
    run_cfg = json.loads((finished_run / "pipeline_config.json").read_text())
    cfg = TrainConfig.load("grpo_tiny_cpu", {"data.format": "canvascraft", "data.path": str(finished_run / "data" / "canvascraft" / "rl"),
                                             "tools.config": run_cfg["grpo_overrides"].get("tools.config", "offline"), "data.task_ids": str(ids_file)})
    assert sorted(json.loads(r["task"])["id"] for r in grpo_rows(cfg, toolbox_factory(cfg))) == sorted(ids)
    # A rerun reports from the record; other evaluation inputs are refused, not pooled.
    assert unsolved_tasks.main(["--run", str(finished_run), "--samples", "2", "--ids", str(ids_file)]) == 0
    with pytest.raises(SystemExit, match="another checkpoint, build or evaluation inputs"):
        unsolved_tasks.main(["--run", str(finished_run), "--samples", "3"])
    monkeypatch.setattr(unsolved_tasks, "solved", lambda g, s: True)
    with pytest.raises(SystemExit, match="solves all 2 training tasks"):
        unsolved_tasks.main(["--run", str(finished_run), "--samples", "2", "--ids", str(tmp_path / "none.txt")])
    assert not (tmp_path / "none.txt").exists()


def test_unsolved_tasks_refuses_a_run_without_sft_and_zero_samples(unsolved_tasks, tmp_path):
    with pytest.raises(SystemExit, match="sft/final is missing"):
        unsolved_tasks.main(["--run", str(tmp_path)])
    with pytest.raises(SystemExit):
        unsolved_tasks.main(["--run", str(tmp_path), "--samples", "0"])


@pytest.fixture(scope="module")
def train_evidence():
    yield from benchmark_script("train_evidence")


@pytest.mark.slow
def test_train_evidence_trains_grpo_on_the_tasks_its_sft_leaves_unsolved(train_evidence, tmp_path, monkeypatch):
    from canvasagent.evaluation.tasks_io import load_tasks

    cfg = yaml.safe_load(DEFAULT_YAML.read_text())
    cfg.update(data="canvascraft", cc_sft_n=3, cc_rl_n=3, cc_eval_n=2, eval_samples=1, n_eval_base=1,
               cc_mix={"single": 0, "hard": 0, "Flip": 1, "OCR": 1})
    (tmp_path / "pipe.yaml").write_text(yaml.safe_dump(cfg))
    monkeypatch.chdir(tmp_path)  # --out is relative, as on the command line
    argv = ["--out", "ev", "--config", str(tmp_path / "pipe.yaml"), "--seeds", "0", "--grpo-on-unsolved",
            "--sft-set", "optim.max_steps=2", "--sft-set", "run.save_steps=0",
            "--grpo-set", "optim.max_steps=1", "--grpo-set", "run.save_steps=0",
            "--grpo-set", "grpo.max_completion_length=64", "--grpo-set", "grpo.max_turns=2"]
    assert train_evidence.main(argv) == 0
    run = Path("ev/seed_0")
    ids_file = run / "unsolved_tasks" / "rl" / "task_ids.txt"
    ids = [x for x in ids_file.read_text().splitlines() if not x.startswith("#")]
    train = load_tasks(run / "data" / "canvascraft" / "rl", split="train")
    assert ids and set(ids) <= {t.id for t in train}
    # GRPO ran with that file, and the report says so and counts only those tasks per chain.
    assert json.loads((run / "pipeline_config.json").read_text())["grpo_overrides"]["data.task_ids"] == str(ids_file)
    assert (run / "grpo" / "done.json").exists()
    assert "`--grpo-on-unsolved`" in Path("ev/train_evidence.md").read_text()
    summary = json.loads(Path("ev/train_evidence.json").read_text())
    assert sum(v.get("grpo_tasks", 0) for v in summary["rows"][0]["by_chain"].values()) <= len(ids)
    assert train_evidence.grpo_pool(run) == train_evidence.Counter(
        train_evidence.chain_key(t.meta, t.expected_tools) for t in train if t.id in set(ids))
