"""`python -m canvasagent.train sft` on the tiny config: a few steps, masks, checkpoints, kill + resume."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from canvasagent.core.models import load_policy, load_processor
from canvasagent.training import run
from canvasagent.training.config import TrainConfig

REPO = Path(__file__).resolve().parents[2]


def _cfg(out: Path, tiny_dir: Path, **extra) -> TrainConfig:
    return TrainConfig.load("sft_tiny_cpu", {
        "run.output_dir": str(out), "model.name_or_path": str(tiny_dir), "data.n_train": 8,
        "optim.max_steps": 4, "optim.per_device_train_batch_size": 2, "run.save_steps": 2,
        "run.logging_steps": 1, "run.save_total_limit": None, **extra,
    })


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory, tiny_qwen3vl_dir):
    """Through the command line: `python -m canvasagent.train sft --config ... --set ...`."""
    from canvasagent.train import main

    out = tmp_path_factory.mktemp("sft")
    sets = {"model.name_or_path": str(tiny_qwen3vl_dir), "data.n_train": 8, "optim.max_steps": 4,
            "optim.per_device_train_batch_size": 2, "run.save_steps": 2, "run.logging_steps": 1, "run.save_total_limit": "null"}
    argv = ["sft", "--config", "sft_tiny_cpu", "--output-dir", str(out)]
    for k, v in sets.items():
        argv += ["--set", f"{k}={v}"]
    assert main(argv) == 0
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    losses = [h["loss"] for h in state["log_history"] if "loss" in h]
    summary = {"global_step": state["global_step"], "log_history": state["log_history"], "final": str(out / "final"),
               "train_loss": sum(losses) / len(losses)}
    return out, summary


def test_sft_runs_with_finite_loss(sft_run):
    out, summary = sft_run
    assert summary["global_step"] == 4
    losses = [h["loss"] for h in summary["log_history"] if "loss" in h]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    assert (out / "curves.png").stat().st_size > 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) >= 4


def test_only_assistant_tokens_are_trained(tiny_qwen3vl_dir, tmp_path):
    from canvasagent.training.sft import build_sft_trainer

    trainer, processor, _ = build_sft_trainer(_cfg(tmp_path, tiny_qwen3vl_dir))
    batch = trainer.data_collator([trainer.train_dataset[0]])
    ids, labels = batch["input_ids"][0], batch["labels"][0]
    tok = processor.tokenizer
    trained = tok.decode(ids[labels != -100])
    masked = tok.decode(ids[labels == -100])
    assert "<reason>" in trained and "<Terminate>" in trained and "<tool_call>" in trained
    for not_trained in ("<tool_response>", "imglist", "img_1:", "# Tools", "<|image_pad|>", "<|vision_start|>"):
        assert not_trained not in trained, not_trained
    assert "<tool_response>" in masked and "<|image_pad|>" in masked  # tool turns carry their image
    assert batch["pixel_values"].shape[0] > 0 and batch["image_grid_thw"].shape[0] >= 2  # input + tool images


def test_shipped_schedule_warms_up_then_decays_to_zero(tiny_qwen3vl_dir, tmp_path):
    """The shipped SFT config reaches TRL's scheduler as warmup + decay over the full run: a
    constant rate left the final weights wherever the last noisy step put them (issue 5)."""
    from canvasagent.training.sft import build_sft_trainer

    shipped = TrainConfig.load("sft_tiny_cpu").optim
    n = shipped.max_steps
    trainer, _, _ = build_sft_trainer(_cfg(tmp_path, tiny_qwen3vl_dir, **{"optim.max_steps": n}))
    trainer.create_optimizer_and_scheduler(num_training_steps=n)
    factor = trainer.lr_scheduler.lr_lambdas[0]  # multiplier of the peak rate at a step
    warmup = trainer.args.get_warmup_steps(n)
    assert 0 < warmup < n // 4
    assert factor(0) == 0.0 and factor(warmup) == pytest.approx(1.0)
    after = [factor(s) for s in range(warmup, n + 1)]
    assert all(b <= a for a, b in zip(after, after[1:]))
    assert factor(n - 1) < 0.01 and trainer.optimizer.defaults["lr"] == shipped.learning_rate


def test_checkpoints_and_final_reload(sft_run):
    out, summary = sft_run
    for ckpt in (out / "checkpoint-2", out / "checkpoint-4", Path(summary["final"])):
        load_processor(ckpt)
        model = load_policy(ckpt)
        assert sum(p.numel() for p in model.parameters()) > 0
    last = load_file(str(out / "checkpoint-4" / "model.safetensors"))
    final = load_file(str(Path(summary["final"]) / "model.safetensors"))
    assert all(torch.equal(last[k], final[k]) for k in final)


_KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from transformers import TrainerCallback
    from canvasagent.training import run
    from canvasagent.training.config import TrainConfig

    class Kill(TrainerCallback):
        def on_log(self, args, state, control, **kw):
            if state.global_step == 3:  # step 3 logged, after checkpoint-2 was saved, before checkpoint-4
                os.kill(os.getpid(), signal.SIGKILL)

    cfg = TrainConfig.load("sft_tiny_cpu", __import__("json").loads(sys.argv[1]))
    run(cfg, callbacks=[Kill()])
    """
)


def test_killed_run_resumes_without_loss(sft_run, tiny_qwen3vl_dir, tmp_path):
    ref_out, ref = sft_run
    out = tmp_path / "killed"
    overrides = {
        "run.output_dir": str(out), "model.name_or_path": str(tiny_qwen3vl_dir), "data.n_train": 8,
        "optim.max_steps": 4, "optim.per_device_train_batch_size": 2, "run.save_steps": 2,
        "run.logging_steps": 1, "run.save_total_limit": None,
    }
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _KILLER, json.dumps(overrides)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert (out / "checkpoint-2").is_dir() and not (out / "checkpoint-4").exists()
    killed_log = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in killed_log if "loss" in r] == [1, 2, 3]  # step 3: trained again after the resume

    resumed = run(_cfg(out, tiny_qwen3vl_dir, **{"run.resume": True}))
    assert resumed["global_step"] == 4
    # Nothing before the last save is lost: the history keeps steps 1-2, and the resumed run
    # ends exactly where the uninterrupted one did (same data order, same RNG, same weights).
    ref_losses = [h["loss"] for h in ref["log_history"] if "loss" in h]
    got_losses = [h["loss"] for h in resumed["log_history"] if "loss" in h]
    assert [h["step"] for h in resumed["log_history"] if "loss" in h] == [1, 2, 3, 4]
    assert got_losses == pytest.approx(ref_losses, rel=1e-4)
    # metrics.jsonl as the uninterrupted run's: the abandoned step-3 log is gone, not listed twice.
    got_log = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in got_log if "loss" in r] == [1, 2, 3, 4]
    assert [r["loss"] for r in got_log if "loss" in r] == pytest.approx(ref_losses, rel=1e-4)
    a = load_file(str(Path(ref["final"]) / "model.safetensors"))
    b = load_file(str(out / "final" / "model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def test_lora_variant_trains_and_merges(tiny_qwen3vl_dir, tmp_path):
    summary = run(_cfg(tmp_path, tiny_qwen3vl_dir, **{
        "lora.enabled": True, "lora.r": 4, "lora.alpha": 8, "lora.modules_to_save": ["lm_head"],
        "optim.max_steps": 2, "run.save_steps": 0,
    }))
    assert math.isfinite(summary["train_loss"])
    model = load_policy(summary["final"])  # merged: loads as a plain checkpoint
    assert not any("lora" in n for n, _ in model.named_parameters())
