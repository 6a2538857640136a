"""The image budget renders one conversation identically for SFT, a GRPO rollout and evaluation.

A real one-step GRPO run of the tiny Qwen3-VL (the sampler replays four Flip calls and a
<Terminate>, as the other GRPO tests do) executes the calls with the offline toolbox; the same
replies then run through evaluation (`run_episode` + `LayoutPolicy` + `HFLocalPolicy.render`) and
the GRPO trajectory becomes an SFT row. Under K=2 (and K=all) the token ids of the three agree.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trl.data_utils import prepare_multimodal_messages

from toolserver.client import make_toolbox
from canvasagent.core.episode import EpisodeConfig, run_episode
from canvasagent.core.image_budget import omitted_text
from canvasagent.core.policies.hf_local import HFLocalPolicy
from canvasagent.training.config import TrainConfig
from canvasagent.training.env import tool_functions, trajectory_of
from canvasagent.training.grpo import build_grpo_trainer
from canvasagent.training.messages import (
    LayoutPolicy,
    fill_images,
    sft_example,
    system_text,
)
from tests.training.conftest import record_scored_batches

CALL = '<reason>Mirror {a}.</reason>\n<tool_call>\n{{"name": "Flip", "arguments": {{"image": "{a}"}}}}\n</tool_call>'
REPLIES = [CALL.format(a=a) for a in ("img_1", "Flip_0", "Flip_1", "Flip_2")] + ["<reason>Done.</reason><Terminate>"]
TOOLS = ["Crop", "Flip", "Rotate"]


def _grpo(tmp_path: Path, tiny_dir: Path, budget):
    cfg = TrainConfig.load("grpo_tiny_cpu", {
        "run.output_dir": str(tmp_path / "grpo"), "model.name_or_path": str(tiny_dir), "run.init_from": None,
        "data.n_train": 1, "optim.max_steps": 1, "optim.per_device_train_batch_size": 2,
        "grpo.num_generations": 2, "grpo.max_turns": 5, "grpo.max_completion_length": 2048,
        "run.save_steps": 0, "run.dump_every": 0, "image_budget": budget,
    })
    trainer, processor, _ = build_grpo_trainer(cfg)
    tok = processor.tokenizer
    calls = {"n": 0}

    def generate(**kw):  # the k-th generation of the step replays REPLIES[k] for every rollout
        reply = tok.encode(REPLIES[calls["n"] % len(REPLIES)] + "<|im_end|>", add_special_tokens=False)
        calls["n"] += 1
        ids = kw["input_ids"]
        return torch.cat([ids, torch.tensor([reply] * ids.shape[0], dtype=ids.dtype)], dim=1)

    trainer.model.generate = generate
    batches = record_scored_batches(trainer)
    trainer.train()
    assert calls["n"] == len(REPLIES)
    return trainer, processor, batches[0]


class _Recorder(HFLocalPolicy):
    """The real HF policy's prompt rendering; replies replayed."""

    def __init__(self, path, replies):
        super().__init__(path)
        self.replies, self.seen = list(replies), []

    def act(self, messages, episode=None):
        self.seen.append(self.render(messages))
        return self.replies[len(self.seen) - 1]


def _unpad(batch, tok, row=0) -> list[int]:
    ids = torch.cat([batch["prompt_ids"][row][batch["prompt_mask"][row].bool()], batch["completion_ids"][row]])
    ids = ids.tolist()
    while ids and ids[-1] == tok.pad_token_id:
        ids.pop()
    return ids


@pytest.mark.parametrize("budget", [2, None])
def test_sft_grpo_and_evaluation_render_the_same_tokens(tiny_qwen3vl_dir, tmp_path, budget):
    trainer, processor, batch = _grpo(tmp_path, tiny_qwen3vl_dir, budget)
    tok = processor.tokenizer
    env = trainer.environments[0]
    traj = env._trajectory or env.episode.trajectory
    assert traj.tool_sequence == ["Flip"] * 4 and traj.stop_reason == "terminate"
    grpo_ids = _unpad(batch, tok)

    # Consistent image counts for the processor: placeholders in the ids == images passed.
    n_images = 1 + (4 if budget is None else budget)
    grid = batch["image_grid_thw"]
    assert grid.shape[0] == n_images * batch["prompt_ids"].shape[0]
    img_pad = tok.convert_tokens_to_ids("<|image_pad|>")
    per_row = grid.prod(-1).reshape(-1, n_images).sum(-1) // 4
    full = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    assert (full == img_pad).sum(-1).tolist() == per_row.tolist()
    assert (full == tok.convert_tokens_to_ids("<|vision_start|>")).sum(-1).tolist() == [n_images] * full.shape[0]
    # The tool mask covers exactly the tool turns: model tokens are the replies, nothing else.
    own = batch["completion_ids"][0][(batch["completion_mask"][0] * batch["tool_mask"][0]).bool()]
    assert tok.decode(own).replace("<|im_end|>", "") == "".join(REPLIES)

    # SFT: the GRPO trajectory as a row, rendered and tokenized by the processor.
    system = system_text(processor, tool_functions(TOOLS))
    row = sft_example(traj, system, budget)
    filled = fill_images({"messages": [row["messages"]], "images": [row["images"]]})
    # As TRL's VLM collator: the user images fill the remaining placeholders.
    msgs = prepare_multimodal_messages(filled["messages"][0], images=filled["images"][0])
    sft = processor.apply_chat_template(msgs, tokenize=True, return_dict=True, return_tensors="pt")
    sft_ids = sft["input_ids"][0].tolist()
    assert sft_ids[: len(grpo_ids)] == grpo_ids  # the SFT text ends with "<|im_end|>\n" after the last reply
    assert sft["image_grid_thw"].shape[0] == n_images

    # Evaluation: the same replies through the episode runner and the HF policy's rendering.
    rec = _Recorder(tiny_qwen3vl_dir, REPLIES)
    cfg = EpisodeConfig(max_turns=5, tools_in_system_prompt=False, end_without_call=True, image_budget=budget)
    ev = run_episode(LayoutPolicy(rec, system), traj.task, make_toolbox("offline"), cfg)
    assert ev.tool_sequence == traj.tool_sequence and ev.stop_reason == "terminate"
    last = rec.seen[-1]["input_ids"][0].tolist()  # the prompt of the final turn
    assert grpo_ids[: len(last)] == last
    assert tok.decode(grpo_ids[len(last):]) == REPLIES[-1] + "<|im_end|>"
    assert rec.seen[-1]["image_grid_thw"].shape[0] == n_images
    text = tok.decode(last)
    for k in range(4 - n_images + 1):
        assert omitted_text(f"Flip_{k}") in text
    if budget is not None:
        # Each turn's prompt in the rollout is what evaluation showed the policy at that turn:
        # the budget never leaves more than K tool images in a prompt.
        assert all(p["image_grid_thw"].shape[0] <= 1 + budget for p in rec.seen)
