"""SFT with TRL's SFTTrainer: multi-turn tool trajectories, assistant-only loss, full FT or LoRA."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from canvasagent.training.callbacks import CompleteCheckpoints, RewardCurves
from canvasagent.training.common import (
    checkpoint_state,
    common_trl_args,
    last_checkpoint,
    load_model_and_processor,
    load_tools_config,
    peft_config,
    save_final,
    whole_run_loss,
    workspace,
)
from canvasagent.training.config import TrainConfig
from canvasagent.training.data import sft_rows
from canvasagent.training.preflight import require_ready
from canvasagent.training.messages import fill_images, system_text
from canvasagent.training.tiny_warmup import warm_up
from toolserver.validation import Profile

log = logging.getLogger(__name__)


def sft_args(cfg: TrainConfig, with_deepspeed: bool = True):
    from trl import SFTConfig

    return SFTConfig(
        **common_trl_args(cfg, with_deepspeed),
        # Loss only on assistant turns: TRL swaps in its qwen3_vl training template, whose
        # generation markers exclude system, user and tool turns (tool images included).
        assistant_only_loss=True,
        max_length=cfg.max_length,
    )


def build_sft_trainer(cfg: TrainConfig, callbacks: list | None = None):
    from datasets import Dataset
    from trl import SFTTrainer

    from canvasagent.core.models import load_processor

    require_ready(cfg)  # missing data, packages or services fail here, before any weights load
    ws = workspace(cfg)
    # The warmed folder carries the base's processor files, so one processor serves both.
    processor = load_processor(ws.model_path)
    system = system_text(processor, ws.tool_fns, cfg.tools.family)
    rows = sft_rows(cfg, system, ws.toolbox_factory)
    if cfg.model.tiny_warmup_steps:
        warm = warm_up(
            ws.model_path, rows, cfg.model.tiny_warmup_steps, ws.output_dir / "tiny_warm",
            seed=cfg.model.tiny_seed, processor=processor, box_share=float(cfg.model.tiny_warmup_box_share),
            angle_share=float(cfg.model.tiny_warmup_angle_share), profile=Profile(load_tools_config(cfg).profile),
        )
        ws = replace(ws, model_path=str(warm))
    model, processor = load_model_and_processor(ws, processor=processor)
    train = Dataset.from_list(rows).with_transform(fill_images)
    trainer = SFTTrainer(
        model=model,
        args=sft_args(cfg),
        train_dataset=train,
        processing_class=processor,
        peft_config=peft_config(cfg),
        callbacks=[RewardCurves(ws.output_dir), CompleteCheckpoints(ws.model_path), *(callbacks or [])],
    )
    return trainer, processor, ws


def run_sft(cfg: TrainConfig, callbacks: list | None = None) -> dict[str, Any]:
    trainer, processor, ws = build_sft_trainer(cfg, callbacks)
    ckpt = last_checkpoint(ws.output_dir) if cfg.run.resume else None
    if ckpt:
        log.info("resuming SFT from %s", ckpt)
    before = checkpoint_state(ckpt)
    result = trainer.train(resume_from_checkpoint=ckpt)
    final = save_final(trainer, processor, ws.model_path, ws.output_dir / "final")
    # Over every step of the run: the Trainer's own figure covers only the steps after a resume.
    train_loss = whole_run_loss(trainer.state, before, result.training_loss)
    log.info("SFT done: %d steps, loss %.4f -> %s", trainer.state.global_step, train_loss, final)
    return {"final": str(final), "global_step": trainer.state.global_step, "train_loss": train_loss,
            "log_history": trainer.state.log_history}
