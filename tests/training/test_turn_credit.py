"""Per-turn GRPO credit (canvasagent/training/turn_credit.py and CanvasGRPOTrainer's credit="turn").

The functions on hand-made masks and rewards (and hypothesis over groups of rollouts), then one
real TRL step of the tiny Qwen3-VL on replayed rollouts: with `grpo.credit: turn` the first
turn's tokens keep GRPO's advantage, the turn after the tool call is judged against the rollouts
that made a call, and tool-result tokens get none.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from canvasagent.training.config import TrainConfig
from canvasagent.training.turn_credit import model_turns, token_advantages, turn_table


def test_model_turns_splits_at_tool_results_and_skips_padding():
    completion = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0]])
    tool = torch.tensor([[1, 1, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    index, n = model_turns(completion, tool)
    assert index.tolist() == [[0, 0, -1, -1, 1, 1, -1], [0, 0, 0, -1, -1, -1, -1]]
    assert n.tolist() == [2, 1]
    with pytest.raises(ValueError, match="differ"):
        model_turns(completion, tool[:, :3])


def test_turn_table_by_hand():
    # one group of four: two rollouts went on after a tool call (rewards 0.9, 0.5), two stopped
    rewards = torch.tensor([0.9, 0.0, 0.5, 0.2])
    table = turn_table(rewards, torch.tensor([2, 1, 3, 1]), group_size=4)
    expected = [
        [0.9 - 0.4, 0.9 - 0.7, 0.0],  # turn 0 against all four; turn 1 against rollouts 0 and 2
        [0.0 - 0.4, 0.0, 0.0],
        [0.5 - 0.4, 0.5 - 0.7, 0.0],  # its turn 2: no other rollout got there
        [0.2 - 0.4, 0.0, 0.0],
    ]
    assert torch.allclose(table, torch.tensor(expected, dtype=torch.float64))
    index = torch.tensor([[0, -1, 1], [0, 0, -1], [0, 1, 2], [0, -1, -1]])
    tokens = token_advantages(index, table)
    assert torch.allclose(tokens, torch.tensor([[0.5, 0.0, 0.2], [-0.4, -0.4, 0.0], [0.1, -0.2, 0.0], [-0.2, 0.0, 0.0]],
                                               dtype=torch.float64))


def test_unscorable_rollouts_are_left_out_and_bad_shapes_refused():
    table = turn_table(torch.tensor([1.0, float("nan"), 0.0, 0.5]), torch.tensor([1, 2, 2, 2]), group_size=4)
    assert table[1].abs().sum() == 0  # NaN reward: no advantage, and not in any baseline
    assert table[:, 0].tolist() == pytest.approx([0.5, 0.0, -0.5, 0.0])
    assert table[:, 1].tolist() == pytest.approx([0.0, 0.0, -0.25, 0.25])
    with pytest.raises(ValueError, match="do not fit"):
        turn_table(torch.zeros(6), torch.ones(6, dtype=torch.long), group_size=4)
    with pytest.raises(ValueError, match="scale"):
        turn_table(torch.zeros(4), torch.ones(4, dtype=torch.long), group_size=4, scale="rank")
    with pytest.raises(ValueError, match="turns"):
        token_advantages(torch.tensor([[0, 3]]), torch.zeros((1, 2)))


groups = st.integers(min_value=2, max_value=6).flatmap(
    lambda g: st.tuples(
        st.just(g),
        st.integers(min_value=1, max_value=3).flatmap(
            lambda k: st.tuples(
                st.lists(st.floats(0, 1, allow_nan=False), min_size=g * k, max_size=g * k),
                st.lists(st.integers(1, 4), min_size=g * k, max_size=g * k),
            )
        ),
    )
)


@settings(max_examples=80, deadline=None)
@given(groups, st.sampled_from(["none", "group", "batch"]))
def test_turn_zero_is_grpo_and_later_turns_sum_to_zero(case, scale):
    g, (rewards, turns) = case
    r, n = torch.tensor(rewards, dtype=torch.float64), torch.tensor(turns)
    table = turn_table(r, n, g, scale)
    grouped = r.view(-1, g)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).flatten()
    if scale == "group":
        centred = centred / (grouped.std(dim=1) + 1e-4).repeat_interleave(g)
    elif scale == "batch":
        centred = centred / (r.std() + 1e-4)
    assert torch.allclose(table[:, 0], centred)  # every rollout has turn 0: GRPO's advantage
    for t in range(table.shape[1]):
        reached = n > t
        assert not table[~reached, t].any()  # no turn t: no advantage for it
        for start in range(0, len(rewards), g):
            block = slice(start, start + g)
            # a centred baseline: each turn's advantages over the rollouts that reached it sum to 0
            assert abs(float(table[block, t][reached[block]].sum())) < 1e-9


def _scored_batch(out: Path, tiny_dir: Path, credit: str) -> dict:
    from tests.training.conftest import replayed_group_trainer

    # turn 1: rollouts 0-2 call Flip, 3 breaks its call; turn 2 (rollouts 0-2): stop, ramble, stop
    trainer, batches = replayed_group_trainer(out, tiny_dir, credit)
    trainer.train()
    assert len(batches) == 1
    return batches[0]


def test_trainer_gives_each_turn_its_own_baseline(tiny_qwen3vl_dir, tmp_path):
    seq = _scored_batch(tmp_path / "sequence", tiny_qwen3vl_dir, "sequence")
    turn = _scored_batch(tmp_path / "turn", tiny_qwen3vl_dir, "turn")
    assert torch.equal(seq["completion_ids"], turn["completion_ids"])
    a, per_token = seq["advantages"], turn["advantages"]
    assert a.dim() == 1 and per_token.shape == turn["completion_ids"].shape
    index, n_turns = model_turns(turn["completion_mask"], turn["tool_mask"])
    assert n_turns.tolist() == [2, 2, 2, 1]
    # rewards minus the group mean; the three callers' mean is the baseline of their second turn
    later = a[:3] - a[:3].mean()
    assert later.abs().max() > 0.01, a  # stopping and rambling score apart
    for i in range(4):
        first, second = per_token[i][index[i] == 0], per_token[i][index[i] == 1]
        assert torch.allclose(first, a[i].expand_as(first), atol=1e-6)
        if i < 3:
            assert second.numel() and torch.allclose(second, later[i].expand_as(second), atol=1e-6)
    assert per_token[index < 0].abs().max() == 0  # tool results and padding carry no advantage


def test_unknown_credit_is_refused():
    with pytest.raises(ValueError, match="grpo.credit"):
        TrainConfig.load("grpo_tiny_cpu", {"grpo.credit": "token"})
