"""The main-job command end to end with minimal budgets (the real budgets run in benchmarks/)."""

from __future__ import annotations

import json

import pytest

from canvasagent.cli import main


@pytest.mark.slow
def test_pipeline_command_runs_and_resumes(tmp_path, capsys):
    argv = ["pipeline", "--out", str(tmp_path / "main"), "--n-eval", "2",
            "--sft-set", "optim.max_steps=2", "--sft-set", "data.n_train=4", "--sft-set", "run.save_steps=0", "--sft-set", "run.logging_steps=1",
            "--grpo-set", "optim.max_steps=1", "--grpo-set", "data.n_train=2", "--grpo-set", "run.save_steps=0",
            "--grpo-set", "grpo.max_completion_length=64", "--grpo-set", "grpo.max_turns=2", "--n-eval-base", "1"]
    assert main(argv) == 0
    out = tmp_path / "main"
    for stage in ("data", "eval_base", "sft", "eval_sft", "grpo", "eval_grpo", "report"):
        assert (out / stage / "done.json").exists(), stage
    metrics = json.loads((out / "report" / "metrics.json").read_text())["metrics"]
    assert {"before SFT (base)", "after SFT", "after GRPO", "after SFT [sampled]", "after GRPO [sampled]"} == set(metrics)
    assert (out / "report" / "report.md").read_text().count("|") > 10
    assert (out / "report" / "sft_curves.png").exists() and (out / "report" / "grpo_curves.png").exists()
    capsys.readouterr()
    # A rerun skips every finished stage (and only redraws the report).
    assert main(argv) == 0
    assert json.loads((out / "sft" / "done.json").read_text())["global_step"] == 2
