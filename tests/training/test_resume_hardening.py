"""Resume picks the newest complete checkpoint; a kill during a save does not break later resumes.

Chaos: a real SFT run is SIGKILLed inside the Trainer's checkpoint save (weights and optimizer
written, RNG and trainer state not yet), the way a kill or an OOM leaves a folder. The resume
must skip that folder with a warning, continue from the previous checkpoint and end where an
uninterrupted run ends, with `train_loss` averaged over all steps.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from canvasagent.training import run
from canvasagent.training.common import (
    checkpoint_problem,
    checkpoint_state,
    last_checkpoint,
    whole_run_loss,
)
from canvasagent.training.config import TrainConfig

REPO = Path(__file__).resolve().parents[2]


# -- which folder counts as complete (synthetic checkpoints, no training) ------------------------


def _fake_ckpt(out: Path, step: int) -> Path:
    d = out / f"checkpoint-{step}"
    d.mkdir(parents=True)
    save_file({"w": torch.arange(64, dtype=torch.float32)}, str(d / "model.safetensors"))
    torch.save({"state": {0: torch.zeros(16)}}, d / "optimizer.pt")
    torch.save({"python": 1}, d / "rng_state.pth")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    return d


def _truncate(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


DAMAGE = {
    "no_state": (lambda d: (d / "trainer_state.json").unlink(), "no trainer_state.json"),
    "torn_state": (lambda d: _truncate(d / "trainer_state.json", 0.5), "unreadable"),
    "wrong_step": (lambda d: (d / "trainer_state.json").write_text('{"global_step": 3}'), "step 3"),
    "torn_weights": (lambda d: _truncate(d / "model.safetensors", 0.8), "model.safetensors is cut short"),
    "torn_header": (lambda d: _truncate(d / "model.safetensors", 0.01), "model.safetensors"),
    "no_weights": (lambda d: (d / "model.safetensors").unlink(), "no model weights"),
    "torn_optimizer": (lambda d: _truncate(d / "optimizer.pt", 0.6), "optimizer.pt is torn"),
    "missing_shard": (lambda d: (d / "model.safetensors.index.json").write_text('{"weight_map": {"w": "model-00002.safetensors"}}'),
                      "model-00002.safetensors"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_resume_skips_a_partial_newest_checkpoint(tmp_path, caplog, damage):
    good = _fake_ckpt(tmp_path, 2)
    bad = _fake_ckpt(tmp_path, 10)  # 10 > 2 numerically, though "checkpoint-10" < "checkpoint-2" as text
    assert checkpoint_problem(bad) is None and last_checkpoint(tmp_path) == str(bad)
    hurt, why = DAMAGE[damage]
    hurt(bad)
    assert why in (checkpoint_problem(bad) or "")
    with caplog.at_level(logging.WARNING):
        assert last_checkpoint(tmp_path) == str(good)
    assert "not resuming from" in caplog.text and "checkpoint-10" in caplog.text


def test_no_complete_checkpoint_means_a_fresh_start(tmp_path, caplog):
    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "checkpoint-x").mkdir()
    assert last_checkpoint(tmp_path / "missing") is None
    with caplog.at_level(logging.WARNING):
        assert last_checkpoint(tmp_path) is None
    assert "no complete checkpoint" in caplog.text


def test_whole_run_loss_weights_logged_intervals(tmp_path):
    d = _fake_ckpt(tmp_path, 4)
    # Logged every 2 steps before the save: steps 1-2 averaged 3.0, steps 3-4 averaged 1.0.
    (d / "trainer_state.json").write_text(json.dumps({"global_step": 4, "log_history": [
        {"loss": 3.0, "step": 2}, {"loss": 1.0, "step": 4}, {"train_loss": 9.0, "step": 4}]}))

    class State:
        global_step = 6

    # The resumed call trained steps 5-6 at a mean of 0.5: (3*2 + 1*2 + 0.5*2) / 6.
    assert whole_run_loss(State(), checkpoint_state(str(d)), 0.5) == pytest.approx(1.5)
    assert whole_run_loss(State(), checkpoint_state(None), 0.5) == 0.5


@pytest.mark.slow
def test_resume_survives_its_checkpoint_being_rotated_away(tiny_qwen3vl_dir, tmp_path):
    # A run resumed with more steps saves new checkpoints; with save_total_limit 1 the one it
    # resumed from is deleted before the run ends, and the whole-run loss must not need it then.
    out = tmp_path / "run"
    first = run(TrainConfig.load("sft_tiny_cpu", {**_overrides(out, tiny_qwen3vl_dir), "optim.max_steps": 2,
                                                  "run.save_steps": 1, "run.save_total_limit": 1}))
    more = run(TrainConfig.load("sft_tiny_cpu", {**_overrides(out, tiny_qwen3vl_dir), "optim.max_steps": 4, "run.save_steps": 1,
                                                 "run.save_total_limit": 1, "run.resume": True}))
    assert not (out / "checkpoint-2").exists() and more["global_step"] == 4
    losses = {h["step"]: h["loss"] for h in [*first["log_history"], *more["log_history"]] if "loss" in h}
    assert sorted(losses) == [1, 2, 3, 4]
    assert more["train_loss"] == pytest.approx(sum(losses.values()) / 4, rel=1e-4)


# -- chaos: SIGKILL inside a real checkpoint save, then resume ----------------------------------


def _overrides(out: Path, tiny_dir: Path) -> dict:
    return {
        "run.output_dir": str(out), "model.name_or_path": str(tiny_dir), "data.n_train": 8,
        "optim.max_steps": 4, "optim.per_device_train_batch_size": 2, "run.save_steps": 2,
        "run.logging_steps": 1, "run.save_total_limit": None,
    }


# Dies inside `_save_checkpoint` at step 4: after the weights, optimizer and scheduler are on
# disk, before the RNG state and trainer_state.json, as a kill during the save leaves it.
_KILL_IN_SAVE = textwrap.dedent(
    """
    import json, os, signal, sys
    from transformers import Trainer
    from canvasagent.training import run
    from canvasagent.training.config import TrainConfig

    real = Trainer._save_rng_state

    def save_rng_then_die(self, output_dir):
        if self.state.global_step == 4:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, output_dir)

    Trainer._save_rng_state = save_rng_then_die
    run(TrainConfig.load("sft_tiny_cpu", json.loads(sys.argv[1])))
    """
)


@pytest.mark.slow
def test_kill_during_checkpoint_save_then_resume(tiny_qwen3vl_dir, tmp_path, caplog):
    ref = run(TrainConfig.load("sft_tiny_cpu", _overrides(tmp_path / "ref", tiny_qwen3vl_dir)))
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _KILL_IN_SAVE, json.dumps(_overrides(out, tiny_qwen3vl_dir))],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    partial = out / "checkpoint-4"
    assert (partial / "model.safetensors").is_file() and not (partial / "trainer_state.json").exists()
    from transformers.trainer_utils import get_last_checkpoint

    assert get_last_checkpoint(str(out)) == str(partial)  # the stock picker would resume from the partial folder
    assert "trainer_state.json" in checkpoint_problem(partial)

    with caplog.at_level(logging.WARNING):
        resumed = run(TrainConfig.load("sft_tiny_cpu", {**_overrides(out, tiny_qwen3vl_dir), "run.resume": True}))
    assert "not resuming from" in caplog.text and "checkpoint-4" in caplog.text
    assert resumed["global_step"] == 4
    ref_losses = [h["loss"] for h in ref["log_history"] if "loss" in h]
    got = [h for h in resumed["log_history"] if "loss" in h]
    assert [h["step"] for h in got] == [1, 2, 3, 4]
    assert [h["loss"] for h in got] == pytest.approx(ref_losses, rel=1e-4)
    # train_loss covers steps 1-4, as the uninterrupted run's does, not only the resumed 3-4.
    assert resumed["train_loss"] == pytest.approx(ref["train_loss"], rel=1e-4)
    assert resumed["train_loss"] == pytest.approx(sum(ref_losses) / 4, rel=1e-4)
    a = load_file(str(Path(ref["final"]) / "model.safetensors"))
    b = load_file(str(out / "final" / "model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    # The re-run save rewrote the partial folder into a complete checkpoint.
    assert checkpoint_problem(partial) is None and last_checkpoint(out) == str(partial)
    shutil.rmtree(tmp_path / "ref")
