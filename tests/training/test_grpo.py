"""`python -m canvasagent.train grpo` on the tiny config: tool rollouts, masks, rewards, checkpoints."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.training.conftest import record_scored_batches
from canvasagent.core.models import load_policy, load_processor
from canvasagent.training.config import TrainConfig
from canvasagent.training.grpo import build_grpo_trainer, run_grpo

# The random tiny model almost never writes a valid call, so the first turn of every rollout is
# forced to this reply: the tool really runs in the env and its image comes back, and everything
# after it (post-tool generation, masks, rewards, loss) is TRL's own path.
FORCED = '<reason>Mirror img_1.</reason>\n<tool_call>\n{"name": "Flip", "arguments": {"image": "img_1"}}\n</tool_call><|im_end|>'


def _cfg(out: Path, tiny_dir: Path) -> TrainConfig:
    return TrainConfig.load("grpo_tiny_cpu", {
        "run.output_dir": str(out), "model.name_or_path": str(tiny_dir), "run.init_from": None,
        "data.n_train": 4, "optim.max_steps": 2, "optim.per_device_train_batch_size": 4,
        "grpo.num_generations": 4, "grpo.max_turns": 2, "grpo.max_completion_length": 96,
        "run.save_steps": 1, "run.dump_every": 1, "run.logging_steps": 1,
    })


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory, tiny_qwen3vl_dir):
    out = tmp_path_factory.mktemp("grpo")
    cfg = _cfg(out, tiny_qwen3vl_dir)
    trainer, processor, ws = build_grpo_trainer(cfg)
    tok = processor.tokenizer
    forced_ids = tok.encode(FORCED, add_special_tokens=False)

    orig_single = trainer._generate_single_turn
    calls = {"n": 0}

    def single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        calls["n"] += 1
        if not has_tool_images and calls["n"] % 2 == 1:  # the first turn of each generation round
            return [list(forced_ids) for _ in prompt_ids], None
        return orig_single(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)

    trainer._generate_single_turn = single_turn
    seen = record_scored_batches(trainer)
    trainer.train()
    from canvasagent.training.common import save_final

    final = save_final(trainer, processor, ws.model_path, out / "final")
    return out, trainer, tok, seen, final


def test_grpo_rollouts_call_tools_and_rewards_are_finite(grpo_run):
    out, trainer, _, _, _ = grpo_run
    logs = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logs) == 2
    for h in logs:
        assert h["tools/call_frequency"] >= 1.0 and h["tools/failure_frequency"] == 0.0
        for k in ("align", "aes", "traj", "rule"):
            assert math.isfinite(h[f"rewards/{k}/mean"])  # each hybrid component is its own logged function
        assert math.isfinite(h["reward"]) and math.isfinite(h["loss"])
    assert (out / "curves.png").stat().st_size > 0


def test_tool_result_tokens_are_masked(grpo_run):
    _, _, tok, seen, _ = grpo_run
    batch = seen[0]
    assert "tool_mask" in batch
    n_masked = 0
    for ids, cm, tm in zip(batch["completion_ids"], batch["completion_mask"], batch["tool_mask"]):
        ids, tm = ids[cm.bool()], tm[cm.bool()]
        masked, trained = tok.decode(ids[tm == 0]), tok.decode(ids[tm == 1])
        assert trained.startswith(FORCED.removesuffix("<|im_end|>"))  # the policy's own call is trained
        assert "<tool_response>" in masked and "Flip_0" in masked and "<|image_pad|>" in masked
        assert "<tool_response>" not in trained and "imglist" not in trained
        n_masked += int((tm == 0).sum())
    assert n_masked > 0
    # The tool image reaches the loss forward: prompt image + tool image per rollout.
    assert batch["image_grid_thw"].shape[0] == 2 * batch["completion_ids"].shape[0]


def test_trajectory_dump_and_checkpoints(grpo_run, tiny_qwen3vl_dir):
    out, _, _, _, final = grpo_run
    lines = [json.loads(x) for x in (out / "trajectories" / "rollouts.jsonl").read_text().splitlines()]
    assert lines and lines[0]["tools"][:1] == ["Flip"] and "hybrid" in lines[0]["scores"]
    saved = out / "trajectories" / lines[0]["path"]
    assert saved.exists() and (saved.parent / "assets" / "Flip_0.png").exists()
    for ckpt in (out / "checkpoint-1", out / "checkpoint-2", final):
        load_processor(ckpt)
        load_policy(ckpt)


def test_grpo_resume_continues_from_checkpoint(grpo_run, tiny_qwen3vl_dir, tmp_path):
    """A run stopped after checkpoint-1 resumes there: step 1's logs are kept, step 2 is redone."""
    import shutil

    out, trainer, *_ = grpo_run
    shutil.copytree(out / "checkpoint-1", tmp_path / "checkpoint-1")
    cfg = _cfg(tmp_path, tiny_qwen3vl_dir)
    cfg.run.resume = True
    cfg.run.dump_every = 0
    summary = run_grpo(cfg)
    assert summary["global_step"] == 2
    rewards = [h["reward"] for h in summary["log_history"] if "reward" in h]
    assert len(rewards) == 2 and rewards[0] == [h["reward"] for h in trainer.state.log_history if "reward" in h][0]


def test_a_task_set_smaller_than_a_generation_batch_is_refused(tiny_qwen3vl_dir, tmp_path):
    """TRL's sampler drops an incomplete batch of distinct prompts, so fewer tasks than one
    generation batch's prompts would train 0 steps and still save a final checkpoint."""
    from canvasagent.training.grpo import grpo_args, require_enough_tasks

    cfg = TrainConfig.load("grpo_tiny_cpu", {"run.output_dir": str(tmp_path), "optim.per_device_train_batch_size": 16,
                                            "optim.gradient_accumulation_steps": 4, "grpo.num_generations": 8})
    args = grpo_args(cfg, [1.0])
    require_enough_tasks(args, 8)  # 64 rollouts in groups of 8: 8 prompts
    with pytest.raises(ValueError, match="7 training task.*8 distinct prompts"):
        require_enough_tasks(args, 7)
    # build_grpo_trainer refuses it before training.
    small = _cfg(tmp_path / "small", tiny_qwen3vl_dir)
    small.data.n_train, small.optim.gradient_accumulation_steps = 1, 2  # 8 rollouts, 2 prompts
    with pytest.raises(ValueError, match="1 training task"):
        build_grpo_trainer(small)
    assert not (tmp_path / "small" / "final").exists()
