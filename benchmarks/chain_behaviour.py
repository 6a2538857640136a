"""How a trained policy ends held-out chains: the saved evaluation episodes, sorted into endings.

    python benchmarks/chain_behaviour.py RUN [RUN ...] [--stages eval_sft eval_grpo] [--results FILE]

RUN is a pipeline run folder (`canvasagent pipeline --out RUN`, or a seed folder of
`benchmarks/train_evidence.py`). Every saved episode of a held-out task whose reference solution
has two or more calls, greedy and sampled, falls into the first ending that applies:

* **no call**: it ended without a successful tool call;
* **a call failed**: some call was malformed or failed (and the chain was not finished);
* **stopped early**: some expected tool never ran;
* **finished, other flow**: every expected tool ran, but some call read a different asset than
  the reference's call of that tool (e.g. the second step applied to the input image);
* **finished, reference flow**: every expected tool ran on the assets the reference uses.

The table gives the share of episodes per ending and stage, pooled over the runs, so a change
from SFT to GRPO reads as a shift between endings (which the mean reward hides). A second table
measures parameter precision: for each argument of a reference call that is not an asset (Rotate's
angle, Crop's box, Flip's direction, Overlay's text and position, ...), among the episodes whose
call of that tool (same occurrence) ran, the share that passed exactly the reference's value. A
last line says whether GRPO's own groups paid a second call: in the dumped training rollouts, the
mean hybrid difference between rollouts with two or more tool calls (failed ones count) and
those with one; and a line on whether they paid a success (passing minus failing rollouts of a group).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path
from typing import Iterator

from rewards.judges.base import CallSummary
from rewards.judges.offline import data_flow, is_asset_id, reference_arguments

ENDINGS = ("no call", "a call failed", "stopped early", "finished, other flow", "finished, reference flow")


def ending(record: dict) -> str | None:
    """The ending of one saved episode (`trajectory.json` as a dict); None when its task has no
    reference solution of two or more calls."""
    task = record.get("task") or {}
    reference = (task.get("meta") or {}).get("reference_calls") or []
    if len(reference) < 2:
        return None
    calls = _calls(record)
    ran = {c.tool for c in calls if c.status == "ok"}
    expected = set(task.get("expected_tools") or [r.get("name") for r in reference])
    if not ran:
        return "no call"
    finished = expected <= ran
    if not finished and any(t.get("status") in ("error", "parse_error") for t in record.get("turns", [])):
        return "a call failed"
    if not finished:
        return "stopped early"
    inputs = {a["id"] for a in record.get("assets", []) if not (a.get("provenance") or {}).get("tool")}
    matched, compared = data_flow(calls, reference, inputs)
    return "finished, reference flow" if matched == compared else "finished, other flow"


def episodes(run: Path, stage: str, mode: str) -> Iterator[dict]:
    """The saved episodes (`trajectory.json` as dicts) of one stage and decoding mode of a run folder."""
    for path in sorted((run / stage / mode).rglob("trajectory.json")):
        yield json.loads(path.read_text(encoding="utf-8"))


def count(run: Path, stage: str, mode: str) -> Counter:
    """Endings of the saved episodes of one stage and decoding mode of a run folder."""
    found: Counter = Counter()
    for record in episodes(run, stage, mode):
        e = ending(record)
        if e is not None:
            found[e] += 1
    return found


def _calls(record: dict) -> list[CallSummary]:
    return [CallSummary(t.get("index", i), t["call"].get("name"), t["call"].get("arguments"), t.get("status"),
                        t.get("output_id"), t.get("error")) for i, t in enumerate(record.get("turns", [])) if t.get("call")]


_QUOTES = (("'", "'"), ('"', '"'), ("\u2018", "\u2019"), ("\u201c", "\u201d"))


def stated(value, instruction: str) -> bool:
    """Whether a reference argument's value is written in the instruction so the policy can copy
    it: a number as a whole number (90, not inside 190, 90.5 or -90; 90.0 reads as 90), a box or
    other list as passed ("[280, 190, 770, 520]"), a string in quotes ('Grand Opening'). Anything
    else is to be inferred: a named region ("the top half"), the angle that makes a picture
    upright, a word that happens to occur ("text" in "fix the mirrored text")."""
    if isinstance(value, bool):
        return False
    if isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?", value.strip()):
        value = float(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, (int, float)):
        return re.search(rf"(?<![\w.\-]){re.escape(str(value))}(?!\w|\.\d)", instruction) is not None
    text = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
    if text.startswith("[") and text.endswith("]"):
        return text in instruction
    return bool(text) and any(f"{a}{text}{b}" in instruction for a, b in _QUOTES)


def precision(record: dict, by_statement: bool = False) -> dict[str, tuple[int, int]]:
    """`Tool.argument` -> (exact, compared) for one saved episode: each non-asset argument of each
    reference call whose tool ran at that occurrence, and whether the run call passed the same value.
    With `by_statement` the key ends in ` (stated)` or ` (inferred)` (`stated`)."""
    task = record.get("task") or {}
    reference = (task.get("meta") or {}).get("reference_calls") or []
    inputs = {a["id"] for a in record.get("assets", []) if not (a.get("provenance") or {}).get("tool")}
    out: dict[str, tuple[int, int]] = {}
    for tool, key, value, ran, passed in reference_arguments(_calls(record), reference):
        if ran and not is_asset_id(value, inputs):
            name = f"{tool}.{key}"
            if by_statement:
                name += " (stated)" if stated(value, task.get("instruction", "")) else " (inferred)"
            exact, compared = out.get(name, (0, 0))
            out[name] = (exact + (passed == value), compared + 1)
    return out


def precision_table(runs: list[Path], stages: tuple[str, ...] = ("eval_sft", "eval_grpo"), by_statement: bool = False) -> list[str]:
    """Markdown rows: per stage and mode, each reference argument's exact share over the episodes
    that ran its tool (`exact/compared`), pooled over `runs`; with `by_statement`, apart for values
    the instruction states and values it leaves to infer (`precision`)."""
    totals: dict[tuple[str, str], dict[str, list[int]]] = {}
    for stage in stages:
        for mode in ("greedy", "sampled"):
            acc = totals.setdefault((stage, mode), {})
            for run in runs:
                for record in episodes(run, stage, mode):
                    for arg, (exact, compared) in precision(record, by_statement).items():
                        cell = acc.setdefault(arg, [0, 0])
                        cell[0] += exact
                        cell[1] += compared
    args = sorted({a for acc in totals.values() for a in acc})
    if not args:
        return ["No saved episode ran a call of a reference solution."]
    lines = ["| stage | mode | " + " | ".join(args) + " |", "|---|---|" + "---|" * len(args)]
    for (stage, mode), acc in totals.items():
        if acc:
            cells = [f"{acc[a][0] / acc[a][1]:.2f} ({acc[a][0]}/{acc[a][1]})" if acc.get(a, [0, 0])[1] else "–" for a in args]
            lines.append(f"| {stage} | {mode} | " + " | ".join(cells) + " |")
    return lines


def statement_table(runs: list[Path], stages: tuple[str, ...] = ("eval_sft", "eval_grpo")) -> list[str]:
    """`precision_table` apart for stated and inferred values, under its heading line."""
    return ["The same, apart for values the instruction states (the policy can copy them) and values it must infer:", "",
            *precision_table(runs, stages, by_statement=True)]


def table(runs: list[Path], stages: tuple[str, ...] = ("eval_sft", "eval_grpo")) -> list[str]:
    """Markdown rows: the share of episodes per ending, per stage and mode, pooled over `runs`."""
    lines = ["| stage | mode | episodes | " + " | ".join(ENDINGS) + " |", "|---|---|---|" + "---|" * len(ENDINGS)]
    for stage in stages:
        for mode in ("greedy", "sampled"):
            total: Counter = Counter()
            for run in runs:
                total.update(count(run, stage, mode))
            n = sum(total.values())
            if n:
                lines.append(f"| {stage} | {mode} | {n} | " + " | ".join(f"{total[e] / n:.3f}" for e in ENDINGS) + " |")
    return lines


def grpo_groups(runs: list[Path]) -> list[list[dict]]:
    """The dumped GRPO training rollouts (`grpo/trajectories/rollouts.jsonl`, whose `tools` lists
    every call made, failed ones too) of every run, grouped by (run, step, task); a run without
    the file adds none."""
    groups: list[list[dict]] = []
    for run in runs:
        by_key: dict[tuple, list[dict]] = {}
        path = run / "grpo" / "trajectories" / "rollouts.jsonl"
        for line in path.read_text().splitlines() if path.exists() else []:
            r = json.loads(line)
            by_key.setdefault((r["step"], r["task_id"]), []).append(r)
        groups.extend(by_key.values())
    return groups


def _mean_hybrid(rollouts: list[dict]) -> float:
    return sum(r["scores"]["hybrid"] for r in rollouts) / len(rollouts)


def group_preference(groups: list[list[dict]]) -> list[str]:
    """What GRPO's groups (`grpo_groups`) paid for a second call: the groups holding both a
    rollout with one call and one with two or more; the mean hybrid difference (two or more minus
    one) and how many groups paid the longer more."""
    diffs: list[float] = []
    for rs in groups:
        one = [r for r in rs if len(r["tools"]) == 1]
        more = [r for r in rs if len(r["tools"]) >= 2]
        if one and more:
            diffs.append(_mean_hybrid(more) - _mean_hybrid(one))
    if not diffs:
        return ["No dumped GRPO group held both a one-call and a longer rollout."]
    return [f"GRPO groups with both a one-call and a longer rollout: {len(diffs)}; hybrid of two or more "
            f"calls minus one call: {sum(diffs) / len(diffs):+.3f} on average, higher in {sum(d > 0 for d in diffs)}."]


def success_signal(groups: list[list[dict]]) -> list[str]:
    """Whether GRPO's groups (`grpo_groups`) paid a success: the groups holding both a rollout
    that passed every check (`align/passed` 1) and one that made a call and did not; per set of
    tools the passing rollouts called, how many such groups and the mean hybrid difference
    (passing minus failing). Groups without both give no success signal."""
    diffs: dict[str, list[float]] = {}
    for rs in groups:
        passed = [r for r in rs if r["scores"].get("align/passed") == 1.0]
        failed = [r for r in rs if r["scores"].get("align/passed") != 1.0 and r["tools"]]
        if passed and failed:
            tools = "+".join(sorted({t for r in passed for t in r["tools"]}))
            diffs.setdefault(tools, []).append(_mean_hybrid(passed) - _mean_hybrid(failed))
    if not diffs:
        return [f"No dumped GRPO group (of {len(groups)}) held both a rollout that passed every check and one that failed."]
    n = sum(len(v) for v in diffs.values())
    parts = [f"{tools} {len(v)} ({sum(v) / len(v):+.3f})" for tools, v in sorted(diffs.items(), key=lambda kv: -len(kv[1]))]
    return [f"GRPO groups with both a rollout that passed every check and one that failed: {n} of {len(groups)} dumped; "
            f"by the passing rollouts' tools, groups (mean hybrid passing minus failing): {', '.join(parts)}."]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--stages", nargs="+", default=["eval_sft", "eval_grpo"])
    ap.add_argument("--results", default=None, help="also write the table here (markdown)")
    args = ap.parse_args(argv)
    missing = [str(r) for r in args.runs if not r.is_dir()]
    if missing:
        ap.error(f"not a run folder: {', '.join(missing)}")
    groups = grpo_groups(args.runs)
    lines = [f"# How held-out chains end ({', '.join(str(r) for r in args.runs)})", "",
             "Share of saved evaluation episodes per ending (tasks whose reference has two or more calls).", "",
             *table(args.runs, tuple(args.stages)), "",
             "Parameter precision: per argument of the reference calls that is not an asset, the share of the "
             "episodes that ran that call which passed exactly the reference's value (exact/compared).", "",
             *precision_table(args.runs, tuple(args.stages)), "",
             *statement_table(args.runs, tuple(args.stages)), "", *group_preference(groups),
             *success_signal(groups)]
    text = "\n".join(lines) + "\n"
    if args.results:
        Path(args.results).parent.mkdir(parents=True, exist_ok=True)
        Path(args.results).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
