"""Per-turn GRPO advantages: each model turn of a multi-turn rollout is judged against the
rollouts of its group that reached the same turn.

GRPO gives every token of a rollout one advantage, its reward minus its group's mean. In a
tool-use group some rollouts make no tool call at all and score near 0, which pulls the group
mean below the value of having made a first call. Every token after a first call then carries a
positive advantage whatever it does, and a policy sampled mostly into one ending (stop after the
first call) is pushed further into it (the committal effect of a too-low baseline).

`credit: turn` keeps the first turn's advantage as GRPO's (all rollouts reach it) and gives the
tokens of turn t the rollout's reward minus the mean reward of the group's rollouts that have a
turn t. The baseline of turn t depends only on what happened before turn t, the choice the turn
makes is compared with the other choices made from the same point. A turn no other rollout of
the group reached has advantage 0 (no comparison, no signal), as has every token outside a model
turn (tool results, padding).

Inputs (torch tensors): `completion_mask` and `tool_mask` (B, T) as TRL's tool loop builds them
(tool_mask 0 on tool-result tokens), `rewards` (N,) over every process's rollouts in group order
(NaN: unscorable, excluded from baselines, advantage 0), `n_turns` (N,). Output: (B, T) token
advantages, as TRL's loss accepts them in place of its (B,) ones.
"""

from __future__ import annotations

import torch

SCALES = ("none", "group", "batch")


def model_turns(completion_mask: torch.Tensor, tool_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(turn index per token, -1 outside the model's own tokens; turns per rollout)."""
    if completion_mask.shape != tool_mask.shape:
        raise ValueError(f"completion_mask {tuple(completion_mask.shape)} and tool_mask {tuple(tool_mask.shape)} differ")
    own = (completion_mask * tool_mask).bool()
    before = torch.zeros_like(own)
    before[:, 1:] = own[:, :-1]
    starts = own & ~before
    index = torch.cumsum(starts.long(), dim=1) - 1
    index = torch.where(own, index, torch.full_like(index, -1))
    return index, starts.sum(dim=1)


def _std(x: torch.Tensor) -> torch.Tensor:
    """Standard deviation over the non-NaN values (Bessel-corrected, as TRL's); 0 for fewer than 2."""
    x = x[~torch.isnan(x)]
    return x.std() if x.numel() > 1 else torch.zeros((), dtype=x.dtype)


def turn_table(rewards: torch.Tensor, n_turns: torch.Tensor, group_size: int, scale: str = "none") -> torch.Tensor:
    """(N, max turns) advantages: entry [i, t] is rollout i's reward minus the mean reward of its
    group's rollouts with more than t turns (0 where i has no turn t or none of its peers has one);
    divided by the group's (or the batch's) reward std, plus 1e-4, as TRL scales, unless
    `scale` is none."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    n = rewards.shape[0]
    if group_size < 1 or n % group_size or n_turns.shape != rewards.shape:
        raise ValueError(f"{n} rewards, {tuple(n_turns.shape)} turn counts and group size {group_size} do not fit")
    rewards = rewards.double()
    width = max(int(n_turns.max().item()) if n else 0, 1)
    table = torch.zeros((n, width), dtype=torch.float64)
    scaled = rewards.new_ones(n)
    if scale == "batch":
        scaled[:] = _std(rewards) + 1e-4
    for g in range(0, n, group_size):
        r, k = rewards[g:g + group_size], n_turns[g:g + group_size]
        if scale == "group":
            scaled[g:g + group_size] = _std(r) + 1e-4
        scored = ~torch.isnan(r)
        for t in range(width):
            reached = (k > t) & scored
            if reached.sum() < 2:
                continue  # no other rollout to compare this turn with
            table[g:g + group_size, t] = torch.where(reached, r - r[reached].mean(), torch.zeros_like(r))
    if scale != "none":
        table = table / scaled.unsqueeze(1)
    return table


def token_advantages(turn_index: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """(B, T) advantages of a process's rollouts: each token gets its turn's entry of `table`
    (its rows, (B, turns)); tokens outside a model turn get 0."""
    if turn_index.shape[0] != table.shape[0]:
        raise ValueError(f"{turn_index.shape[0]} rollouts but {table.shape[0]} rows of turn advantages")
    if turn_index.numel() and int(turn_index.max()) >= table.shape[1]:
        raise ValueError(f"a rollout has turn {int(turn_index.max())} but the table has {table.shape[1]} turns")
    picked = table.gather(1, turn_index.clamp(min=0))
    return torch.where(turn_index >= 0, picked, torch.zeros_like(picked))
