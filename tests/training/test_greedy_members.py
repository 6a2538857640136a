"""Greedy group members in GRPO (`grpo.greedy_members`): which rollouts decode greedily, on every
turn, with the real tiny Qwen3-VL policy and TRL's own generation and tool loop."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from canvasagent.training.config import TrainConfig
from canvasagent.training.trl_multimodal import _ArgmaxRows

CALL = '<reason>Mirror img_1.</reason>\n<tool_call>\n{"name": "Flip", "arguments": {"image": "img_1"}}\n</tool_call><|im_end|>'
STOP = "<reason>img_1 is the final image.</reason><Terminate><|im_end|>"


def _trainer(out: Path, tiny_dir: Path, greedy: int, **over):
    from canvasagent.training.grpo import build_grpo_trainer

    cfg = TrainConfig.load("grpo_tiny_cpu", {
        "run.output_dir": str(out), "model.name_or_path": str(tiny_dir), "run.init_from": None,
        "data.n_train": 2, "optim.max_steps": 1, "optim.per_device_train_batch_size": 8,
        "optim.gradient_accumulation_steps": 1, "grpo.num_generations": 4, "grpo.max_turns": 2,
        "grpo.max_completion_length": 256, "grpo.greedy_members": greedy,
        "run.save_steps": 0, "run.dump_every": 0, "run.logging_steps": 1, **over,
    })
    trainer, processor, _ = build_grpo_trainer(cfg)
    return trainer, processor.tokenizer


def test_argmax_rows_leave_only_the_top_score_on_their_rows():
    scores = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 1.0], [0.5, 0.4, 0.6]])
    out = _ArgmaxRows([0, 2])(torch.zeros(3, 1, dtype=torch.long), scores)
    inf = float("inf")
    assert torch.equal(out, torch.tensor([[-inf, 2.0, -inf], [3.0, 0.0, 1.0], [-inf, -inf, 0.6]]))
    assert torch.equal(scores[0], torch.tensor([0.1, 2.0, -1.0]))  # the caller's scores are not changed
    torch.manual_seed(0)
    picks = torch.multinomial(torch.softmax(out / 5.0, -1), 200, replacement=True)  # sampling at a high temperature
    assert (picks[0] == 1).all() and (picks[2] == 2).all() and picks[1].unique().numel() > 1


@pytest.mark.parametrize("image_budget", [None, 1])
def test_the_first_member_of_each_group_is_greedy_on_every_turn(tiny_qwen3vl_dir, tmp_path, image_budget):
    """Two groups of 4: rollouts 0 and 4 are the greedy members. Turn 1: rollout 0 stops, the
    others call Flip; turn 2 serves rollouts 1-7 in TRL's order, so rollout 4 is row 3. The
    greedy rows are the ones the logits processor reduces to their argmax, and the trainer logs
    the greedy members' reward and margin."""
    trainer, tok = _trainer(tmp_path / "g", tiny_qwen3vl_dir, 1, image_budget=image_budget)
    seen: list[list[int]] = []

    def generate(**kw):  # TRL's call, answered from a script; which rows decode greedily is read off the processor
        ids = kw["input_ids"]
        procs = kw.get("logits_processor") or []
        scores = torch.randn(ids.shape[0], 50)
        for p in procs:
            scores = p(ids, scores)
        seen.append([r for r in range(ids.shape[0]) if torch.isfinite(scores[r]).sum() == 1])
        turn = len(seen)
        replies = [STOP if (turn == 1 and r == 0) or turn == 2 else CALL for r in range(ids.shape[0])]
        enc = [tok.encode(x, add_special_tokens=False) for x in replies]
        new = torch.full((ids.shape[0], max(map(len, enc))), tok.pad_token_id, dtype=ids.dtype)
        for r, e in enumerate(enc):
            new[r, : len(e)] = torch.tensor(e)
        return torch.cat([ids, new], dim=1)

    trainer.model.generate = generate
    trainer.train()
    assert seen == [[0, 4], [3]]
    assert trainer.model.generate is generate  # the stand-in is put back
    logged = next(h for h in trainer.state.log_history if "greedy/reward" in h)
    assert 0 <= logged["greedy/reward"] <= 1 and abs(logged["greedy/minus_sampled"]) <= 1


def test_greedy_members_decode_the_same_tokens_however_the_rest_sample(tiny_qwen3vl_dir, tmp_path):
    """The real generate, twice on one batch with the same weights: the greedy members' tokens
    repeat, the sampled ones (temperature 5) do not; with no greedy member nothing repeats."""

    def twice(greedy: int) -> tuple[torch.Tensor, torch.Tensor]:
        trainer, _ = _trainer(tmp_path / f"r{greedy}", tiny_qwen3vl_dir, greedy,
                              **{"grpo.temperature": 5.0, "grpo.max_completion_length": 24, "grpo.max_turns": 1})
        batch = [trainer.train_dataset[i // 4] for i in range(8)]
        trainer.model.train()
        a = trainer._generate_and_score_completions(batch)["completion_ids"]
        b = trainer._generate_and_score_completions(batch)["completion_ids"]
        return a, b

    a, b = twice(1)
    same = [bool(torch.equal(a[i], b[i])) for i in range(8)]
    assert same[0] and same[4], same
    assert not any(same[i] for i in (1, 2, 3, 5, 6, 7)), same
    a0, b0 = twice(0)
    assert not torch.equal(a0[0], b0[0]) and not torch.equal(a0[4], b0[4])


def test_greedy_members_must_leave_a_sample_and_need_transformers_generation():
    with pytest.raises(ValueError, match="grpo.greedy_members must be 0 to grpo.num_generations - 1"):
        TrainConfig.load("grpo_tiny_cpu", {"grpo.greedy_members": 8})
    with pytest.raises(ValueError, match="grpo.greedy_members must be 0"):
        TrainConfig.load("grpo_tiny_cpu", {"grpo.greedy_members": -1})
    with pytest.raises(ValueError, match="not vLLM"):
        TrainConfig.load("grpo_tiny_cpu", {"grpo.greedy_members": 1, "grpo.use_vllm": True})
