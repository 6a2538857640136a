"""The GRPO training tasks a policy does not solve yet, as the task-id file GRPO then trains on.

GRPO learns only from groups whose rollouts differ in reward. Where the SFT policy solves a task
in its greedy episode and in every sampled one, that task's group carries no pass/fail signal, so
the pipeline's `grpo_tasks: unsolved` evaluates the SFT checkpoint on the GRPO training tasks and
trains GRPO on the rest only (`data.task_ids`). Only training tasks are read: the held-out split
never decides what GRPO sees.

`find_unsolved` takes a checkpoint, the training tasks (`Source.train_tasks`) and the evaluation
inputs of the pipeline's SFT evaluation; it evaluates into `folder` (resumable per task, like every
evaluation), and writes `folder/task_ids.txt` (one id per line, a `#` header) and `folder/report.md`
(tasks and unsolved tasks per chain). It returns a JSON-able record. Refused (ValueError): no
tasks, fewer than 1 sampled episode, and a policy that solves every task (the report is written
first: there is nothing for GRPO to learn from on these tasks).
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


def find_unsolved(checkpoint: Path, tasks: list, folder: Path, scorer: Any, toolbox: Any, tool_fns: Any,
                  inputs: dict[str, Any]) -> dict[str, Any]:
    """Evaluate `checkpoint` on `tasks` (greedy, and `inputs["samples"]` episodes a task at
    `inputs["temperature"]`; tokens, turns, seed and image budget from `inputs` as well) into
    `folder`, then write the ids of the tasks it does not solve (`solved`) and the per-chain report."""
    from canvasagent.training.evaluate import evaluate_checkpoint

    if not tasks:
        raise ValueError("no training tasks to evaluate")
    if inputs["samples"] < 1:
        raise ValueError(f"finding unsolved tasks needs at least 1 sampled episode a task, not {inputs['samples']}")
    res = evaluate_checkpoint(checkpoint, tasks, scorer, toolbox, tool_fns, folder, max_turns=inputs["max_turns"],
                              max_new_tokens=inputs["max_new_tokens"], temperature=inputs["temperature"],
                              samples=inputs["samples"], seed=inputs["seed"], image_budget=inputs["image_budget"])
    left = [t for t, g, s in zip(tasks, res["greedy"].scores, res["sampled"].scores, strict=True) if not solved(g, s)]
    total, unsolved = (Counter(chain_key(t.meta, t.expected_tools) for t in ts) for ts in (tasks, left))
    how = f"the greedy episode or one of {inputs['samples']} sampled at T {inputs['temperature']} failed a check"
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
    return {"n_tasks": len(tasks), "unsolved": [t.id for t in left], "samples": inputs["samples"],
            "temperature": inputs["temperature"], "chains": {k: [total[k], unsolved[k]] for k in sorted(total)},
            "task_ids": str(folder / "task_ids.txt")}
