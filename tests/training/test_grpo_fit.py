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
    ids_file = run / "unsolved_tasks" / "task_ids.txt"
    ids = [x for x in ids_file.read_text().splitlines() if not x.startswith("#")]
    train = load_tasks(run / "data" / "canvascraft" / "rl", split="train")
    assert ids and set(ids) <= {t.id for t in train}
    # GRPO ran with that file, and the report says so and counts only those tasks per chain.
    assert json.loads((run / "pipeline_config.json").read_text())["grpo_tasks"] == "unsolved"
    assert train_evidence.grpo_pool(run) is not None and (run / "grpo" / "done.json").exists()
    text = Path("ev/train_evidence.md").read_text()
    assert "`--grpo-on-unsolved`" in text and f"seed 0 {len(ids)} of 3" in text
    summary = json.loads(Path("ev/train_evidence.json").read_text())
    assert summary["grpo_tasks"] == "unsolved" and summary["rows"][0]["unsolved_tasks"] == {"unsolved": len(ids), "of": 3}
    assert sum(v.get("grpo_tasks", 0) for v in summary["rows"][0]["by_chain"].values()) <= len(ids)
    assert train_evidence.grpo_pool(run) == train_evidence.Counter(
        train_evidence.chain_key(t.meta, t.expected_tools) for t in train if t.id in set(ids))
