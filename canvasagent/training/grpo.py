"""GRPO with TRL: multi-turn tool rollouts through `environment_factory`, hybrid reward per component."""

from __future__ import annotations

import logging
from typing import Any

from canvasagent.training.callbacks import CompleteCheckpoints, RewardCurves, ToolCollapse, TrajectoryDumper
from canvasagent.training.common import (
    common_trl_args,
    last_checkpoint,
    load_model_and_processor,
    peft_config,
    save_final,
    workspace,
)
from canvasagent.training.config import TrainConfig
from canvasagent.training.data import grpo_dataset
from canvasagent.training.preflight import require_ready
from canvasagent.training.rewarding import TRLRewards
from canvasagent.training.sources import source_of
from toolserver.backends._base import return_freed_memory

log = logging.getLogger(__name__)


def _return_freed_heap() -> Any:
    """A TrainerCallback that hands freed heap pages back to the OS after every step
    (`return_freed_memory`: glibc's `malloc_trim(0)`, a few ms; elsewhere a no-op). A GRPO step
    allocates and frees hundreds of MB natively; glibc keeps the freed pages in its arenas, so
    RSS would ratchet up over the run though the live heap barely grows."""
    from transformers import TrainerCallback

    class ReturnFreedHeap(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            return_freed_memory()

    return ReturnFreedHeap()


def grpo_args(cfg: TrainConfig, reward_weights: list[float], with_deepspeed: bool = True):
    from trl import GRPOConfig

    g = cfg.grpo
    extra: dict[str, Any] = {}
    if g.loss_type:
        extra["loss_type"] = g.loss_type
    if g.use_vllm:
        extra.update(use_vllm=True, vllm_mode=g.vllm_mode)
        if g.vllm_server_base_url:
            extra["vllm_server_base_url"] = g.vllm_server_base_url
    return GRPOConfig(
        **{
            **common_trl_args(cfg, with_deepspeed),
            "num_generations": g.num_generations,
            "beta": g.beta,
            "max_completion_length": g.max_completion_length,
            # One tool call per turn in our protocol, so tool-calling iterations = turns.
            "max_tool_calling_iterations": g.max_turns,
            "temperature": g.temperature,
            "scale_rewards": g.scale_rewards,
            "reward_weights": reward_weights,
            # TRL's completion table cannot hold mixed image/text tool messages; TrajectoryDumper logs rollouts.
            "log_completions": False,
            **extra,
            **cfg.trl_args,
        }
    )


def require_enough_tasks(args: Any, n_tasks: int) -> None:
    """Refuse a task set smaller than one generation batch's prompts (its groups need distinct
    prompts): TRL's sampler drops the incomplete batch, so such a run would train 0 steps and
    still save a "final" checkpoint equal to its start."""
    prompts = args.generation_batch_size // args.num_generations
    if n_tasks < prompts:
        raise ValueError(
            f"GRPO has {n_tasks} training task(s) but one generation batch samples {prompts} distinct prompts "
            f"({args.generation_batch_size} rollouts in groups of {args.num_generations}); TRL would train 0 steps. "
            "Add tasks, or lower optim.per_device_train_batch_size / optim.gradient_accumulation_steps, or raise "
            "grpo.num_generations")


def build_grpo_trainer(cfg: TrainConfig, callbacks: list | None = None):
    # CanvasGRPOTrainer, not TRL's: it never scores a sampled vision placeholder (see trl_multimodal).
    from canvasagent.training.env import load_tools_config
    from canvasagent.training.trl_multimodal import CanvasGRPOTrainer, ToolConcurrency

    require_ready(cfg)  # missing data, packages or services fail here, before any weights load
    ws = workspace(cfg)
    model, processor = load_model_and_processor(ws, padding_side="left")
    scorer = source_of(cfg).scorer(cfg, ws.env_cls.toolbox())
    dumper = TrajectoryDumper(ws.output_dir / "trajectories", cfg.run.dump_every)
    train_dataset = grpo_dataset(cfg, ws.toolbox_factory)
    rewards = TRLRewards(scorer, on_scored=dumper, group_size=cfg.grpo.num_generations,
                         sources=TRLRewards.sources_in(train_dataset["task"]))  # per-source reward curves
    log.info("GRPO reward: %s, components %s, weights %s", scorer.source, rewards.names, rewards.weights())
    args = grpo_args(cfg, rewards.weights())
    require_enough_tasks(args, len(train_dataset))
    trainer = CanvasGRPOTrainer(
        model=model,
        reward_funcs=rewards.functions(),
        args=args,
        train_dataset=train_dataset,
        processing_class=processor,
        environment_factory=ws.env_cls,
        peft_config=peft_config(cfg),
        callbacks=[RewardCurves(ws.output_dir, collapse=ToolCollapse(cfg.grpo.tool_collapse_share, cfg.grpo.tool_collapse_steps)), CompleteCheckpoints(ws.model_path), _return_freed_heap(), *(callbacks or [])],
        tool_concurrency=ToolConcurrency.from_tools_config(load_tools_config(cfg)),
        image_budget=cfg.image_budget,
        credit=cfg.grpo.credit,
        greedy_members=cfg.grpo.greedy_members,
    )
    return trainer, processor, ws


def run_grpo(cfg: TrainConfig, callbacks: list | None = None) -> dict[str, Any]:
    trainer, processor, ws = build_grpo_trainer(cfg, callbacks)
    ckpt = last_checkpoint(ws.output_dir) if cfg.run.resume else None
    if ckpt:
        log.info("resuming GRPO from %s", ckpt)
    trainer.train(resume_from_checkpoint=ckpt)
    final = save_final(trainer, processor, ws.model_path, ws.output_dir / "final")
    log.info("GRPO done: %d steps -> %s", trainer.state.global_step, final)
    return {"final": str(final), "global_step": trainer.state.global_step, "log_history": trainer.state.log_history}
