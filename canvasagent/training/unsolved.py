"""The GRPO training tasks a policy does not solve yet, as the task-id file GRPO then trains on.

GRPO learns only from groups whose rollouts differ in reward. Where the SFT policy solves a task
in its greedy episode and in every sampled one, that task's group carries no pass/fail signal, so
the pipeline's `grpo_tasks: unsolved` evaluates the SFT checkpoint on the GRPO training tasks and
trains GRPO on the rest only (`data.task_ids`). Only training tasks are read: the held-out split
never decides what GRPO sees.

`write_unsolved` takes the evaluation of a checkpoint on the training tasks (`Source.train_tasks`;
the pipeline's `unsolved_tasks` stage runs it under the SFT evaluation's inputs) and writes
`folder/task_ids.txt` (one id per line, a `#` header) and `folder/report.md` (tasks and unsolved
tasks per chain). It returns a JSON-able record. Refused (ValueError): no tasks, no sampled
episodes, and a policy that solves every task (the report is written first: there is nothing for
GRPO to learn from on these tasks).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any


def solved(greedy: dict[str, float], sampled: dict[str, float]) -> bool:
    """A task is solved when its greedy episode and every sampled one passed every check
    (`align/passed` is the passed share of a task's episodes; no verdict is no pass)."""
    return greedy.get("align/passed", 0.0) >= 1.0 and sampled.get("align/passed", 0.0) >= 1.0


def chain_key(meta: dict, expected_tools: list[str]) -> str:
    """A task's row in a per-chain table: its chain (else its expected tools) and tone."""
    return f"{meta.get('chain') or '+'.join(expected_tools)} ({meta.get('tone', '-')})"


def write_unsolved(checkpoint: Path, tasks: list, res: dict[str, Any], folder: Path, samples: int,
                   temperature: float) -> dict[str, Any]:
    """From `res`, `evaluate_checkpoint`'s results of `checkpoint` on `tasks` (greedy, and `samples`
    episodes a task at `temperature`), write the ids of the tasks it does not solve (`solved`) and
    the per-chain report into `folder`."""
    if not tasks:
        raise ValueError("no training tasks to evaluate")
    if samples < 1 or "sampled" not in res:
        raise ValueError(f"finding unsolved tasks needs at least 1 sampled episode a task, not {samples}")
    left = [t for t, g, s in zip(tasks, res["greedy"].scores, res["sampled"].scores, strict=True) if not solved(g, s)]
    total, unsolved = (Counter(chain_key(t.meta, t.expected_tools) for t in ts) for ts in (tasks, left))
    how = f"the greedy episode or one of {samples} sampled at T {temperature} failed a check"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.md").write_text("\n".join([
        f"# Training tasks `{checkpoint}` does not solve yet", "",
        f"{len(left)} of {len(tasks)} unsolved: {how}. Ids: `task_ids.txt`.", "",
        "| chain (tone) | training tasks | unsolved |", "|---|---|---|",
        *[f"| {k} | {total[k]} | {unsolved[k]} |" for k in sorted(total)], ""]))
    if not left:
        raise ValueError(f"{checkpoint} solves all {len(tasks)} training tasks ({folder / 'report.md'}): "
                         "no group would carry a pass/fail signal, so there is no unsolved task to train GRPO on")
    (folder / "task_ids.txt").write_text(f"# training tasks {checkpoint} does not solve ({how})\n"
                                         + "".join(t.id + "\n" for t in left))
    return {"n_tasks": len(tasks), "unsolved": [t.id for t in left], "samples": samples,
            "temperature": temperature, "chains": {k: [total[k], unsolved[k]] for k in sorted(total)},
            "task_ids": str(folder / "task_ids.txt")}
