"""Issue #5: GRPO on Qwen3-VL must not crash in `get_rope_index` ('NoneType' object is not an iterator).

Root cause (TRL 1.16.0): the policy can *sample* vision placeholder tokens (`<|video_pad|>`; TRL only
suppresses `<|image_pad|>`). Once any tool returned an image, TRL labels every placeholder id in the
whole sequence, sampled ones included, as a vision token (`mm_token_type_ids`); a sampled
`<|video_pad|>` becomes a video with no `video_grid_thw` and Qwen3-VL's rope index calls
`next(None)`: in the tool loop's generate when another turn follows, else in the loss forward.
`image_in_every_observation=True` made every tool call take that path, hence the crash "moving".

The tiny random policy samples almost uniformly over the vocabulary, so these runs are real TRL
runs: first turns are forced (a random model never writes a valid call) and, where a test needs
the bad token deterministically, either the real sampler is biased towards it or a sampling backend
that ignores `suppress_tokens` (as vLLM does) is stood in for by replaying fixed token ids.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import pytest
import torch

from tests.training.conftest import record_scored_batches
from canvasagent.training.config import TrainConfig
from canvasagent.training.env import CanvasEnv
from canvasagent.training.grpo import build_grpo_trainer

CALL = '<reason>Mirror {a}.{extra}</reason>\n<tool_call>\n{{"name": "Flip", "arguments": {{"image": "{a}"}}}}\n</tool_call><|im_end|>'


def flip(asset: str, extra: str = "") -> str:
    return CALL.format(a=asset, extra=extra)


def _cfg(out: Path, tiny_dir: Path, **over) -> TrainConfig:
    return TrainConfig.load("grpo_tiny_cpu", {
        "run.output_dir": str(out), "model.name_or_path": str(tiny_dir), "run.init_from": None,
        "data.n_train": 4, "optim.max_steps": 1, "optim.per_device_train_batch_size": 4,
        "grpo.num_generations": 4, "grpo.max_turns": 2, "grpo.max_completion_length": 160,
        "run.save_steps": 0, "run.dump_every": 0, "run.logging_steps": 1, **over,
    })


def _run(cfg: TrainConfig, script: list[list[str] | None]):
    """Train `cfg`; the k-th generation call of a step replays `script[k]` (one reply per rollout,
    cycled) at the sampler (`model.generate`), or samples from the real tiny policy where None.

    Returns the trainer, its tokenizer and every generation batch TRL built for the loss.
    """
    trainer, processor, _ = build_grpo_trainer(cfg)
    tok = processor.tokenizer
    model = trainer.model
    real_generate = model.generate
    calls = {"n": 0}

    def generate(**kw):
        k = calls["n"] % len(script)
        calls["n"] += 1
        if script[k] is None:
            return real_generate(**kw)
        ids = kw["input_ids"]
        replies = [tok.encode(script[k][i % len(script[k])], add_special_tokens=False) for i in range(ids.shape[0])]
        width = max(map(len, replies))
        new = torch.full((ids.shape[0], width), tok.pad_token_id, dtype=ids.dtype)
        for i, r in enumerate(replies):
            new[i, : len(r)] = torch.tensor(r)
        return torch.cat([ids, new], dim=1)

    model.generate = generate
    batches = record_scored_batches(trainer)
    trainer.train()
    assert calls["n"] >= len(script)  # the replayed turns really went through the sampler hook
    return trainer, tok, batches


# Makes the real tiny policy sample `<|video_pad|>` (id 7 in the tiny tokenizer) almost surely.
BIAS_TO_VIDEO = {"generation_kwargs": {"sequence_bias": [[[7], 30.0]]}}


def _vision_ids(tok) -> dict[str, int]:
    return {t: tok.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")}


def _check_batch(batch, tok, images_per_row: int) -> None:
    """Image tokens, grids and pixels agree, and the policy's own tokens hold no vision placeholder."""
    vis = _vision_ids(tok)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    n_rows = ids.shape[0]
    grid = batch["image_grid_thw"]
    assert grid.shape[0] == images_per_row * n_rows  # no image silently dropped ("truncation safety")
    assert batch["pixel_values"].shape[0] == int(grid.prod(-1).sum())
    merge = 2 * 2  # the tiny image processor merges 2x2 patches into one image token
    per_row = grid.prod(-1).reshape(n_rows, images_per_row).sum(-1) // merge
    assert (ids == vis["<|image_pad|>"]).sum(-1).tolist() == per_row.tolist()
    assert not (ids == vis["<|video_pad|>"]).any()
    own = batch["completion_ids"][(batch["completion_mask"] * batch["tool_mask"]).bool()]
    assert not torch.isin(own, torch.tensor(list(vis.values()))).any()


def _finite(trainer) -> dict:
    logs = [h for h in trainer.state.log_history if "loss" in h and "reward" in h]
    assert logs and all(math.isfinite(h["loss"]) and math.isfinite(h["reward"]) for h in logs)
    return logs[-1]


def test_sampled_video_token_after_a_tool_image_trains(tiny_qwen3vl_dir, tmp_path):
    """Variant (b), the loss forward: the real policy, biased towards `<|video_pad|>`, samples its
    post-tool turn after a Flip image came back. Stock TRL: TypeError in `_get_per_token_logps_and_entropies`."""
    cfg = _cfg(tmp_path, tiny_qwen3vl_dir, trl_args=BIAS_TO_VIDEO)
    trainer, tok, batches = _run(cfg, [[flip("img_1")], None])
    assert tok.convert_tokens_to_ids("<|video_pad|>") == 7
    h = _finite(trainer)
    assert h["tools/call_frequency"] == 1.0
    _check_batch(batches[0], tok, images_per_row=2)  # prompt image + Flip image


def test_backend_ignoring_suppression_in_the_tool_loop(tiny_qwen3vl_dir, tmp_path):
    """Variant (a), the tool loop: a turn that sampled `<|video_pad|>` (a backend that does not honour
    `suppress_tokens`, e.g. vLLM) and still called a tool; after the Flip images come back the next
    turn is generated. Stock TRL: TypeError in the tool loop's `generate`."""
    cfg = _cfg(tmp_path, tiny_qwen3vl_dir, **{"grpo.max_turns": 3, "grpo.max_completion_length": 320})
    first = [flip("img_1")] * 4
    second = [flip("Flip_0", extra="<|video_pad|>")] + [flip("Flip_0")] * 3
    trainer, tok, batches = _run(cfg, [first, second, None])
    _finite(trainer)
    b = batches[0]
    video = tok.convert_tokens_to_ids("<|video_pad|>")
    texts = [tok.decode(r[m.bool()]) for r, m in zip(b["completion_ids"], b["completion_mask"])]
    # Row 0's second turn ends where the placeholder was sampled: nothing after it ran.
    assert texts[0].count('"name": "Flip"') == 1 and texts[0].rstrip().endswith("Mirror Flip_0.")
    assert all(t.count('"name": "Flip"') == 2 for t in texts[1:])
    assert not (b["completion_ids"] == video).any()
    assert b["image_grid_thw"].shape[0] == 2 + 3 * 3  # row 0: prompt + 1 Flip, rows 1-3: prompt + 2 Flips


@pytest.mark.parametrize("image_in_every_observation", [False, True])
def test_text_only_tool_results_across_the_whole_turn(tiny_qwen3vl_dir, tmp_path, monkeypatch, image_in_every_observation):
    """The reported scenario: every rollout's tool call fails (missing asset -> text-only error), then
    the real policy samples on (biased towards `<|video_pad|>`, which the random policy samples now and
    then). Text-only observations alone never crashed stock TRL; with the latest image attached to
    them, the sampled placeholder crashed it in the loss forward."""
    monkeypatch.setattr(CanvasEnv, "image_in_every_observation", image_in_every_observation)
    cfg = _cfg(tmp_path, tiny_qwen3vl_dir, trl_args=BIAS_TO_VIDEO, **{"optim.max_steps": 2, "grpo.max_turns": 3})
    trainer, tok, batches = _run(cfg, [[flip("img_9")], None])
    h = _finite(trainer)
    assert h["tools/call_frequency"] >= 1.0
    assert len(batches) == 2
    for b in batches:
        masked = [tok.decode(r[(m * (1 - t)).bool()]) for r, m, t in zip(b["completion_ids"], b["completion_mask"], b["tool_mask"])]
        assert all("Error" in s for s in masked)  # each rollout got the error observation
        _check_batch(b, tok, images_per_row=2 if image_in_every_observation else 1)


def test_trl_compat_check_refuses_a_changed_signature():
    from canvasagent.training.trl_multimodal import CanvasGRPOTrainer, check_trl_compat
    from trl import GRPOTrainer

    check_trl_compat(GRPOTrainer)  # the installed TRL is one the override was checked against

    class Changed(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids, images, num_generations):  # a future TRL reshuffle
            raise AssertionError

    with pytest.raises(RuntimeError, match="_generate_single_turn"):
        check_trl_compat(Changed)
    assert "has_tool_images" in inspect.signature(CanvasGRPOTrainer._generate_single_turn).parameters
