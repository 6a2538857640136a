"""Held-out EASEL episodes of local checkpoints in the training layout (the EASEL SFT -> GRPO chain).

    python benchmarks/train_easel.py --ckpt base=DIR --ckpt sft=DIR --ckpt grpo=DIR --out /tmp/x

Each checkpoint plays the held-out reconstruction tasks (`--seed`, default 2: neither the bench's
seed 0 nor the training seed 1) through the bench's episode runner (`canvasagent.easel.agent.play`:
the same CanvasSession, budget and tool replies), greedy, seeing the system text SFT and GRPO train
on (`training.messages.system_text` + `easel_env.with_coords`). Replies are recorded raw, before
the int1000 coordinates are rescaled, so format validity is measured on what the model wrote.
Writes `results.json` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

for _k, _v in (("OMP_NUM_THREADS", "1"), ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TRL_EXPERIMENTAL_SILENCE", "1")):
    os.environ.setdefault(_k, _v)

log = logging.getLogger("train_easel")


class RawReplies:
    """Records each reply as the model wrote it."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.name = inner.name
        self.replies: list[str] = []

    def act(self, messages: list[dict[str, Any]], episode: Any = None) -> str:
        reply = self.inner.act(messages, episode)
        self.replies.append(reply)
        return reply


class OneSource:
    def __init__(self, policy: Any):
        self.policy = policy
        self.name = policy.name

    def for_task(self, easel_task: Any, task: Any, budget: int) -> Any:
        return self.policy


def evaluate(ckpt: str, cfg: Any, out: Path, max_new_tokens: int) -> dict[str, Any]:
    from canvasagent.easel import agent, metrics
    from canvasagent.core.policies.hf_local import HFGenerationConfig, HFLocalPolicy
    from canvasagent.core.protocol import parse_reply
    from canvasagent.training import easel_env
    from canvasagent.training.common import workspace
    from canvasagent.training.messages import LayoutPolicy, system_text

    hf = HFLocalPolicy(ckpt, HFGenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0))
    # The training workspace's tool list (GRPO's order), so the system text is the trained bytes.
    tool_fns = workspace(cfg, build_model=False).tool_fns
    system = easel_env.with_coords(system_text(hf.processor, tool_fns, "easel"), cfg.easel.coords)
    raw = RawReplies(LayoutPolicy(hf, system))
    policy = agent.Int1000Coords(raw) if cfg.easel.coords == "int1000" else raw
    acfg = agent.AgentConfig(budget=cfg.easel.budget, coords=cfg.easel.coords, image_budget=cfg.image_budget)
    rows, t0 = [], time.perf_counter()
    for spec in easel_env.task_specs(cfg.easel):
        task = easel_env.easel_task(spec)
        n0 = len(raw.replies)
        ep = agent.play(OneSource(policy), task, acfg, out)
        replies = raw.replies[n0:]
        traj = json.loads((Path(ep.trajectory_dir) / "trajectory.json").read_text())
        turns = traj["turns"]
        strokes_ok = sum(1 for t in turns if t.get("status") == "ok" and (t.get("call") or {}).get("name") == "brush_stroke")
        well_formed = sum(1 for r in replies if not parse_reply(r).findings)
        rows.append({
            "task": ep.task_id, "turns": len(turns), "stop": ep.stop_reason, "strokes_ok": strokes_ok,
            "well_formed": well_formed, "s": ep.session.similarity().s,
            "s_blank": metrics.similarity(task.reference, task.initial_canvas()).s,
        })
    n_turns = sum(r["turns"] for r in rows)
    return {
        "ckpt": ckpt, "tasks": len(rows), "turns": n_turns,
        "format_validity": sum(r["well_formed"] for r in rows) / max(1, n_turns),
        "valid_call_rate": sum(r["strokes_ok"] for r in rows) / max(1, n_turns),
        "mean_s": sum(r["s"] for r in rows) / len(rows),
        "mean_s_blank": sum(r["s_blank"] for r in rows) / len(rows),
        "seconds": time.perf_counter() - t0, "episodes": rows,
    }


def main() -> None:
    from canvasagent.training.config import TrainConfig

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", action="append", required=True, help="LABEL=DIR")
    ap.add_argument("--config", default="grpo_easel_from_sft_tiny_cpu")
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--n-per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg = TrainConfig.load(a.config, {"easel.seed": a.seed, "easel.n_per_category": a.n_per_category,
                                      "run.output_dir": str(Path(a.out) / "workspace")})
    out = Path(a.out)
    results = {}
    for item in a.ckpt:
        label, path = item.split("=", 1)
        results[label] = evaluate(path, cfg, out / label, a.max_new_tokens)
        log.info("%s: %s", label, {k: v for k, v in results[label].items() if k != "episodes"})
    (out / "results.json").write_text(json.dumps(results, indent=1))
    lines = ["| policy | tasks | turns | format validity | valid brush_stroke calls / turn | mean S | blank S |",
             "|---|---|---|---|---|---|---|"]
    for label, r in results.items():
        lines.append(f"| {label} | {r['tasks']} | {r['turns']} | {r['format_validity']:.3f} | {r['valid_call_rate']:.3f} "
                     f"| {r['mean_s']:.3f} | {r['mean_s_blank']:.3f} |")
    log.info("table:\n%s", "\n".join(lines))
    (out / "table.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
