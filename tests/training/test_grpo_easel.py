"""GRPO with EASEL as the task source: brush tools over the bench's canvas session, S as the reward."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests.training.conftest import record_scored_batches
from canvasagent.easel import metrics, tasks
from canvasagent.training import easel_env
from canvasagent.training.common import workspace
from canvasagent.training.config import TrainConfig
from canvasagent.training.data import grpo_rows
from canvasagent.training.grpo import build_grpo_trainer
from canvasagent.training.rewarding import TRLRewards
from canvasagent.training.sources import source_of

STROKE = {"xs": 0.1, "ys": 0.2, "xc": 0.5, "yc": 0.9, "xe": 0.9, "ye": 0.3, "rs": 0.15, "os": 0.9,
          "re": 0.1, "oe": 0.8, "cr": 0.8, "cg": 0.2, "cb": 0.1}


def _forced(args: dict) -> str:
    call = json.dumps({"name": "brush_stroke", "arguments": args})
    return f"<reason>One stroke.</reason>\n<tool_call>\n{call}\n</tool_call><|im_end|>"


# The random tiny model almost never writes a valid call, so the first turn of each rollout is
# forced: even rollouts paint a valid stroke, odd ones send xs=2.0 (outside [0, 1]). Everything
# after it (the env, post-tool generation, masks, rewards, loss) is TRL's and our own real path.
VALID, INVALID = _forced(STROKE), _forced({**STROKE, "xs": 2.0})


def _cfg(out: Path, tiny_dir: Path, **extra) -> TrainConfig:
    return TrainConfig.load("grpo_easel_tiny_cpu", {
        "run.output_dir": str(out), "model.name_or_path": str(tiny_dir), "run.init_from": None,
        "easel.categories": ["programmatic", "spatial"], "easel.n_per_category": 1, "easel.budget": 2,
        "optim.max_steps": 2, "optim.per_device_train_batch_size": 4, "grpo.num_generations": 2,
        "grpo.max_turns": 3, "grpo.max_completion_length": 320, "run.dump_every": 1, **extra,
    })


@pytest.fixture(scope="module")
def easel_run(tmp_path_factory, tiny_qwen3vl_dir):
    out = tmp_path_factory.mktemp("grpo_easel")
    trainer, processor, ws = build_grpo_trainer(_cfg(out, tiny_qwen3vl_dir))
    tok = processor.tokenizer
    valid_ids = tok.encode(VALID, add_special_tokens=False)
    invalid_ids = tok.encode(INVALID, add_special_tokens=False)
    orig_single = trainer._generate_single_turn

    def single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if not has_tool_images:  # every EASEL tool result carries the canvas: only first turns get here
            return [list(valid_ids if i % 2 == 0 else invalid_ids) for i in range(len(prompt_ids))], None
        return orig_single(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)

    trainer._generate_single_turn = single_turn
    seen = record_scored_batches(trainer)
    trainer.train()
    return out, trainer, tok, seen


def test_easel_grpo_steps_have_finite_loss_and_rewards(easel_run):
    out, trainer, _, _ = easel_run
    logs = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logs) == 2
    for h in logs:
        assert h["tools/call_frequency"] >= 1.0
        assert h["tools/failure_frequency"] == 0.0  # the invalid stroke was an observation, not an exception
        for k in ("easel_s", "format", "action", "rule"):
            assert math.isfinite(h[f"rewards/{k}/mean"])
        assert 0.0 < h["rewards/easel_s/mean"] <= 1.0
        assert math.isfinite(h["reward"]) and math.isfinite(h["loss"])
    lines = (out / "trajectories" / "rollouts.jsonl").read_text().splitlines()
    assert lines and "easel_s" in json.loads(lines[0])["scores"]


def test_easel_s_reward_is_metrics_s_of_the_final_canvas(easel_run):
    _, trainer, _, _ = easel_run
    envs = trainer.environments
    assert envs and all(isinstance(e, easel_env.EaselEnv) for e in envs)
    for i, env in enumerate(envs):
        expected = metrics.similarity(env.easel_task.reference, env.session.canvas).s
        assert env.scores["easel_s"] == pytest.approx(expected, abs=1e-12)
        first = env.session.history[0] if env.session.history else None
        if i % 2 == 0:  # the forced valid stroke really painted the canvas
            assert first is not None and first.tool == "brush_stroke" and first.ok
        traj = env._trajectory
        if i % 2 == 1:  # the forced invalid one was refused before the canvas, as in the bench
            assert traj.turns[0].status == "error" and "xs" in traj.turns[0].error
    # The logged mean is the mean over these environments (the last step's rollouts).
    last = [h for h in trainer.state.log_history if "reward" in h][-1]
    assert last["rewards/easel_s/mean"] == pytest.approx(float(np.mean([e.scores["easel_s"] for e in envs])), abs=1e-5)


def test_tool_results_are_masked_and_carry_the_canvas(easel_run):
    _, _, tok, seen = easel_run
    batch = seen[0]
    n_masked = 0
    for j, (ids, cm, tm) in enumerate(zip(batch["completion_ids"], batch["completion_mask"], batch["tool_mask"])):
        ids, tm = ids[cm.bool()], tm[cm.bool()]
        masked, trained = tok.decode(ids[tm == 0]), tok.decode(ids[tm == 1])
        forced = VALID if j % 2 == 0 else INVALID
        assert trained.startswith(forced.removesuffix("<|im_end|>"))  # the policy's own call is trained
        assert "<tool_response>" in masked and "<|image_pad|>" in masked  # the canvas comes back, masked
        assert ("stroke applied" if j % 2 == 0 else "must be in [0, 1]") in masked
        # What the environment answered is never trained on (the random policy may itself sample the
        # <tool_response> tag, which is its own text and rightly trained).
        assert "stroke applied" not in trained and "must be in [0, 1]" not in trained
        n_masked += int((tm == 0).sum())
    assert n_masked > 0


def test_s_reward_is_one_for_a_reference_identical_canvas(tmp_path, monkeypatch):
    cfg = TrainConfig.load("grpo_easel_tiny_cpu", {"run.output_dir": str(tmp_path), "easel.n_per_category": 1,
                                                   "easel.categories": ["programmatic"]})
    ws = workspace(cfg, build_model=False)
    row = grpo_rows(cfg, ws.toolbox_factory)[0]
    # A white reference: the blank canvas is identical to it, so S must be exactly 1.
    white = tasks.reference_task(np.ones((32, 32, 3), np.float32), budget=2, task_id="white")
    monkeypatch.setattr(easel_env, "easel_task", lambda spec: white)
    env = ws.env_cls()
    env.reset(**row)
    obs = env.brush_stroke(**{**STROKE, "cr": "red"})  # a malformed call: an observation, the canvas untouched
    assert obs[0]["type"] == "image" and "Error" in obs[1]["text"]
    env.submit()
    rewards = TRLRewards(source_of(cfg).scorer(cfg, ws.env_cls.toolbox()))
    completion = [{"role": "assistant", "content": [{"type": "text", "text": "<reason>Done.</reason>"}]}]
    by_name = {fn.__name__: fn(completions=[completion], environments=[env])[0] for fn in rewards.functions()}
    assert by_name["easel_s"] == 1.0
    assert env._trajectory.stop_reason == "submit" and env._trajectory.meta["easel"]["s"] == 1.0


def test_easel_config_validation(tmp_path):
    with pytest.raises(ValueError, match="unknown categories"):
        TrainConfig.load("grpo_easel_tiny_cpu", {"easel.categories": ["portraits"]})
    with pytest.raises(ValueError, match="reward_weights"):
        TrainConfig.load("grpo_easel_tiny_cpu", {"easel.reward_weights": {"align": 1.0}})
    with pytest.raises(ValueError, match="tools.family"):
        TrainConfig.load("grpo_easel_tiny_cpu", {"tools.family": "canvasagent"})
    # Rows at the category's Table 1 size are the bench's own references.
    cfg = TrainConfig.load("grpo_easel_tiny_cpu", {"run.output_dir": str(tmp_path), "easel.resolution": None,
                                                   "easel.budget": None, "easel.n_per_category": 1})
    rows = grpo_rows(cfg, workspace(cfg, build_model=False).toolbox_factory)
    meta = json.loads(rows[0]["task"])["meta"]["easel"]
    assert meta["budget"] == tasks.CATEGORIES["programmatic"].budget and rows[0]["images"][0].size == (64, 64)
    ref = tasks.make_reconstruction("programmatic", meta["seed"]).reference
    assert np.array_equal(easel_env.easel_task(meta).reference, ref)


def test_semantic_rows_reward_the_task_score(tmp_path):
    cfg = TrainConfig.load("grpo_easel_tiny_cpu", {"run.output_dir": str(tmp_path), "easel.categories": [],
                                                   "easel.semantic": ["circle_outline"]})
    ws = workspace(cfg, build_model=False)
    [row] = grpo_rows(cfg, ws.toolbox_factory)
    env = ws.env_cls()
    env.reset(**row)
    env.brush_stroke(**STROKE)  # appearance arguments are required by the registry, ignored here
    env.submit()
    rewards = TRLRewards(source_of(cfg).scorer(cfg, ws.env_cls.toolbox()))
    completion = [{"role": "assistant", "content": [{"type": "text", "text": "<reason>Done.</reason>"}]}]
    s = rewards.functions()[0](completions=[completion], environments=[env])[0]
    assert env.session.budget == 4 and env.session.history[0].ok
    assert s == pytest.approx(env.easel_task.score(env.session.canvas)) and 0.0 < s < 1.0
