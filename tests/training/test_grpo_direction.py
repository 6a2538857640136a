"""One real GRPO step of the tiny Qwen3-VL moves the policy towards the turns the reward prefers.

The rollouts are replayed, so which turn is better is known by construction: in a group of four,
three rollouts call Flip and one breaks its call; after the call, two stop and one rambles. The
step's update is taken from the trainer's own optimizer and loss, then every rollout's turns are
scored again under the weights before and after it. A turn the reward ranks higher must gain
log-probability against a turn it ranks lower, under both credits. It fails when the trainer's
advantages are negated or reach the wrong rows (both checked by changing CanvasGRPOTrainer),
faults that the reward curve of a short run cannot tell from slow learning.
"""

from __future__ import annotations

import copy

import pytest
import torch

from canvasagent.training.turn_credit import model_turns


def _token_logps(trainer, model, batch: dict) -> torch.Tensor:
    """(rollouts, completion tokens): each completion token's log-probability under `model`."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    extra = {k: batch[k] for k in ("pixel_values", "image_grid_thw", "num_images", "mm_token_type_ids", "token_type_ids")
             if batch.get(k) is not None}
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, batch["completion_ids"].size(1), **extra)
    return logps


@pytest.mark.parametrize("credit", ["turn", "sequence"])
def test_a_step_raises_the_better_turns_against_the_worse(credit, tiny_qwen3vl_dir, tmp_path):
    from tests.training.conftest import replayed_group_trainer

    trainer, batches = replayed_group_trainer(tmp_path / credit, tiny_qwen3vl_dir, credit, **{
        "data.n_train": 1, "optim.learning_rate": 1e-3, "grpo.beta": 0.0})
    before = copy.deepcopy(trainer.model).eval()
    trainer.train()
    assert len(batches) == 1
    batch = batches[0]
    index, n_turns = model_turns(batch["completion_mask"], batch["tool_mask"])
    assert n_turns.tolist() == [2, 2, 2, 1]  # the replay went as scripted

    token_gain = _token_logps(trainer, trainer.model.eval(), batch) - _token_logps(trainer, before, batch)
    gain = torch.stack([(token_gain * (index == t)).sum(dim=1) for t in (0, 1)], dim=1)  # (rollouts, turn)
    # First turn: a well-formed call over the broken one (each call shares the broken reply's
    # prefix, whose tokens see advantages that sum to zero over the group).
    for caller in (0, 1, 2):
        assert gain[caller, 0] > gain[3, 0], (credit, gain)
    # Second turn, after the same call: stopping over rambling.
    for stopper in (0, 2):
        assert gain[stopper, 1] > gain[1, 1], (credit, gain)
