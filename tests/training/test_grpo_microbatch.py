"""A GRPO step over micro-batches (gradient accumulation) is the step over the whole batch.

The pipeline runs GRPO's loss on 4 of a step's 16 rollouts at a time to lower its memory peak
(configs/pipeline/default.yaml). Here the tiny Qwen3-VL takes one real TRL step on the same 4
rollouts (replayed at the sampler: two valid Flip calls, two broken replies, so the advantages
are not zero) as one batch of 4 and as 2 micro-batches of 2: the rollouts, rewards, loss and
gradient norm must agree.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from canvasagent.training.config import TrainConfig
from canvasagent.training.grpo import build_grpo_trainer
from tests.training.conftest import record_scored_batches, replay_turns

FLIP = '<reason>Mirror img_1.</reason>\n<tool_call>\n{"name": "Flip", "arguments": {"image": "img_1"}}\n</tool_call><|im_end|>'
BROKEN = '<reason>Mirror img_1.</reason>\n<tool_call>\n{"name": "Flip", "arguments": {"image": <|im_end|>'
STOP = "<reason>Flip_0 is the final image.</reason><Terminate><|im_end|>"
N = 4


def _step(out: Path, tiny_dir: Path, micro: int) -> tuple[list[dict], dict]:
    cfg = TrainConfig.load("grpo_tiny_cpu", {
        "run.output_dir": str(out), "model.name_or_path": str(tiny_dir), "run.init_from": None,
        "data.n_train": 2, "optim.max_steps": 1, "optim.per_device_train_batch_size": micro,
        "optim.gradient_accumulation_steps": N // micro, "grpo.num_generations": N, "grpo.max_turns": 2,
        "grpo.max_completion_length": 256, "run.save_steps": 0, "run.dump_every": 0, "run.logging_steps": 1,
    })
    trainer, processor, _ = build_grpo_trainer(cfg)
    # turn 1: rollouts 0 and 2 call Flip, 1 and 3 break the call; turn 2: the callers stop
    replay_turns(trainer, processor.tokenizer, [[FLIP, BROKEN], [STOP]])
    batches = record_scored_batches(trainer)
    trainer.train()
    logged = next(h for h in trainer.state.log_history if "loss" in h)
    return batches, logged


def test_micro_batches_give_the_whole_batch_step(tiny_qwen3vl_dir, tmp_path):
    whole, whole_log = _step(tmp_path / "whole", tiny_qwen3vl_dir, micro=N)
    split, split_log = _step(tmp_path / "split", tiny_qwen3vl_dir, micro=N // 2)
    assert len(whole) == len(split) == 1  # one generation of all N rollouts either way
    assert torch.equal(whole[0]["completion_ids"], split[0]["completion_ids"])
    adv = whole[0]["advantages"]
    assert adv.abs().max() > 0.1, adv  # valid and broken replies score apart
    assert torch.allclose(adv, split[0]["advantages"])
    assert split_log["loss"] == pytest.approx(whole_log["loss"], rel=1e-4, abs=1e-7)
    assert split_log["grad_norm"] == pytest.approx(whole_log["grad_norm"], rel=1e-4)
