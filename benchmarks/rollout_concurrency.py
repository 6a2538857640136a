"""Tool wait per GRPO turn, serial (TRL's loop) against concurrent (CanvasGRPOTrainer's pool).

Setup: the tiny Qwen3-VL policy, one GRPO step of 16 rollouts x 3 tool turns, every call an
ImageEdit served by the `latency` backend (0.5 s a call), first in-process
(configs/tools/latency.yaml), then through Ray Serve (a local Serve app whose ImageEdit
deployment batches up to 16 calls, `@serve.batch`). The policy's turns are replayed at the
sampler (`model.generate`), so every rollout really calls a tool on each turn (a random tiny
model never writes a valid call); everything after the sampler is the real TRL step: parsing,
the env, the episode, the toolbox, masks, the loss forward and backward.

Tool wait = wall time during which at least one tool call was in flight (the union of the call
intervals seen at the toolbox), divided by the number of tool turns. Step time = one
`training_step`, generation included. The no-latency step (latency 0, concurrent) is the base.
The step-time target is read from pairs: one trainer alternates latency 0 and `--latency` on
consecutive steps (after a warm-up step), and the median of (latency step - no-latency step)
over `--pairs` pairs is what the tools add to a step. Steps of separate runs differ by several
seconds with the load of a shared machine; the two steps of a pair see about the same load.

    .venv/bin/python benchmarks/rollout_concurrency.py [--rollouts 16] [--turns 3] [--latency 0.5] [--pairs 4] [--no-ray]

The last line is `serial/concurrent tool wait per turn: R x` (in-process R).
"""

from __future__ import annotations

import argparse
import statistics
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

for _k, _v in (("OMP_NUM_THREADS", "1"), ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TRL_EXPERIMENTAL_SILENCE", "1")):
    os.environ.setdefault(_k, _v)

import torch
import yaml

from canvasagent.training.config import TrainConfig
from canvasagent.training.grpo import build_grpo_trainer

EDIT = ('<reason>Edit {a}.</reason>\n<tool_call>\n{{"name": "ImageEdit", "arguments": '
        '{{"image": "{a}", "edit_prompt": "brighter"}}}}\n</tool_call><|im_end|>')
STOP = "<reason>Done.</reason><Terminate><|im_end|>"
APP = "bench_concurrency"


def script(turns: int) -> list[list[str]]:
    assets = ["img_1"] + [f"ImageEdit_{k}" for k in range(turns - 1)]
    return [[EDIT.format(a=a)] for a in assets] + [[STOP]]


class CallClock:
    """Records (start, end) of every toolbox call, and the Serve batch sizes results report."""

    def __init__(self, box: Any):
        self.intervals: list[tuple[float, float]] = []
        self.batch_sizes: list[int] = []
        self._lock = threading.Lock()
        inner = box.call

        def call(request):
            t0 = time.perf_counter()
            res = inner(request)
            with self._lock:
                self.intervals.append((t0, time.perf_counter()))
                if isinstance(res.data, dict) and "batch_size" in res.data:
                    self.batch_sizes.append(int(res.data["batch_size"]))
            return res

        box.call = call

    def busy_s(self) -> float:
        total, end = 0.0, float("-inf")
        for a, b in sorted(self.intervals):
            if a > end:
                total += b - a
                end = b
            elif b > end:
                total += b - end
                end = b
        return total

    def max_overlap(self) -> int:
        events = sorted([(a, 1) for a, _ in self.intervals] + [(b, -1) for _, b in self.intervals], key=lambda e: (e[0], e[1]))
        cur = best = 0
        for _, d in events:
            cur += d
            best = max(best, cur)
        return best


def train_cfg(out: Path, tools_config: str, rollouts: int, turns: int, steps: int) -> TrainConfig:
    return TrainConfig.load("grpo_tiny_cpu", {
        "run.output_dir": str(out), "model.name_or_path": "tiny", "run.init_from": None,
        "tools.config": tools_config, "tools.names": ["ImageEdit"],
        "data.n_train": 4, "optim.max_steps": steps, "optim.per_device_train_batch_size": rollouts,
        "grpo.num_generations": rollouts, "grpo.max_turns": turns, "grpo.max_completion_length": 384,
        "run.save_steps": 0, "run.dump_every": 0, "run.logging_steps": 1,
    })


def one_step(cfg: TrainConfig, concurrent: bool, latency_s: float | None | list[float], turns: int,
             served: bool = False) -> dict[str, Any]:
    """Run `cfg`'s GRPO steps; `latency_s` is the in-process tool latency (None: served
    elsewhere), or a list giving step k the latency `latency_s[k % len]`."""
    trainer, processor, ws = build_grpo_trainer(cfg)
    if not concurrent:
        trainer.tool_runner = None  # TRL's serial loop
    box = ws.env_cls.toolbox()
    schedule = latency_s if isinstance(latency_s, list) else None

    def set_latency(value: float) -> None:  # rebuilds the lazily built backend with this latency
        lazy = box.backends["ImageEdit"]
        lazy._fn, lazy.params = None, {**lazy.params, "latency_s": value}

    if latency_s is not None and schedule is None:
        set_latency(latency_s)
    clock = CallClock(box)
    tok = processor.tokenizer
    replies = script(turns)
    calls = {"n": 0}

    def generate(**kw):
        # The k-th sampler call of a step: first turn, then one per tool turn, then the stop.
        k = min(calls["n"] % (turns + 1), len(replies) - 1)
        calls["n"] += 1
        ids = kw["input_ids"]
        enc = [tok.encode(replies[k][0], add_special_tokens=False)] * ids.shape[0]
        new = torch.full((ids.shape[0], max(map(len, enc))), tok.pad_token_id, dtype=ids.dtype)
        for i, r in enumerate(enc):
            new[i, : len(r)] = torch.tensor(r)
        return torch.cat([ids, new], dim=1)

    trainer.model.generate = generate
    step_s: list[float] = []
    inner_step = trainer.training_step

    step_latency: list[float | None] = []

    def timed_step(*a, **kw):
        if schedule is not None:
            step_latency.append(schedule[len(step_s) % len(schedule)])
            set_latency(step_latency[-1])
        t0 = time.perf_counter()
        out = inner_step(*a, **kw)
        step_s.append(time.perf_counter() - t0)
        return out

    trainer.training_step = timed_step
    trainer.train()
    n_steps = len(step_s)
    sizes = sorted(set(clock.batch_sizes))
    return {
        "calls": len(clock.intervals) / n_steps,
        "tool_wait_per_turn_s": clock.busy_s() / (turns * n_steps),
        "max_in_flight": clock.max_overlap(),
        "serve_batches": {b: clock.batch_sizes.count(b) // b for b in sizes} if served else {},
        # The fastest step: on a shared machine the others carry other jobs' load.
        "step_s": min(step_s),
        "steps_s": step_s,
        "step_latency_s": step_latency,
    }


def start_serve(latency_s: float, rollouts: int) -> None:
    import ray

    from toolserver.serve_app import deploy
    from toolserver.serve_config import ServeConfig

    cfg = ServeConfig.from_dict({
        "app_name": APP, "pure_mode": "caller", "http": {"enabled": False},
        "defaults": {"ray_actor_options": {"num_cpus": 0.05}, "num_replicas": 1, "timeout_s": 60},
        "tools": {"ImageEdit": {
            "backend": "latency", "params": {"latency_s": latency_s},
            # One replica takes every rollout's call of a turn as one batch, as a tool GPU would;
            # calls that arrive after a batch started run in a second one rather than behind it.
            "max_batch_size": rollouts, "batch_wait_timeout_s": 0.2, "max_ongoing_requests": 2 * rollouts,
            "max_concurrent_batches": 2,
        }},
    })
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    deploy(cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=16)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--latency", type=float, default=0.5)
    ap.add_argument("--steps", type=int, default=2, help="GRPO steps per run (the fastest is reported)")
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray Serve runs")
    ap.add_argument("--pairs", type=int, default=4, help="paired (no latency, latency) steps for the step-time target; 0 skips")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="rollout_conc_"))
    local = "latency"
    rows: dict[str, dict[str, Any]] = {}
    cfg = lambda name, tools, steps=args.steps: train_cfg(tmp / name, tools, args.rollouts, args.turns, steps)
    rows["in-process, no latency"] = one_step(cfg("base", local), True, 0.0, args.turns)
    rows["in-process, serial"] = one_step(cfg("serial", local), False, args.latency, args.turns)
    rows["in-process, concurrent"] = one_step(cfg("conc", local), True, args.latency, args.turns)
    if not args.no_ray:
        start_serve(args.latency, args.rollouts)
        ray_tools = tmp / "ray_tools.yaml"
        ray_tools.write_text(yaml.safe_dump({"profile": "canvascraft", "client": "ray", "ray_app": APP, "max_pixels": 40_000_000}))
        rows["Ray Serve, serial"] = one_step(cfg("rserial", str(ray_tools)), False, None, args.turns, served=True)
        rows["Ray Serve, concurrent"] = one_step(cfg("rconc", str(ray_tools)), True, None, args.turns, served=True)

    # Step time against the no-latency step, paired: one trainer alternates latency 0 and
    # --latency on consecutive steps, so both halves of a pair carry about the same machine load.
    paired = one_step(cfg("paired", local, 2 * args.pairs + 1), True, [0.0, args.latency], args.turns) if args.pairs else None
    base = rows["in-process, no latency"]["step_s"]
    print(f"{args.rollouts} rollouts x {args.turns} tool turns, ImageEdit at {args.latency:g} s a call (latency backend), "
          f"{args.steps} GRPO steps per run")
    print(f"{'run':<24} {'calls/step':>10} {'tool wait/turn s':>16} {'max in flight':>13} {'step s (all)':>22}  Serve batches (size: count)")
    for name, r in rows.items():
        steps = "/".join(f"{x:.2f}" for x in r["steps_s"])
        print(f"{name:<24} {r['calls']:>10.0f} {r['tool_wait_per_turn_s']:>16.3f} {r['max_in_flight']:>13} "
              f"{r['step_s']:>7.2f} ({steps:>12})  {r['serve_batches'] or '-'}")
    for where in ("in-process", "Ray Serve"):
        s, c = rows.get(f"{where}, serial"), rows.get(f"{where}, concurrent")
        if not (s and c):
            continue
        ratio = s["tool_wait_per_turn_s"] / c["tool_wait_per_turn_s"]
        print(f"{where}: concurrent tool wait/turn {c['tool_wait_per_turn_s']:.3f} s = {c['tool_wait_per_turn_s'] / args.latency:.2f} x latency "
              f"(target <= 1.5); serial/concurrent {ratio:.1f}x (target >= 10); step {c['step_s']:.2f} s vs no-latency "
              f"{base:.2f} s + {args.turns} x 0.75 s = {base + args.turns * 0.75:.2f} s "
              f"({'met' if c['step_s'] <= base + args.turns * 0.75 else 'NOT met'})")
    if paired:
        # Step 0 carries the trainer's warm-up; the pairs are the steps after it.
        st, lat = paired["steps_s"][1:], paired["step_latency_s"][1:]
        by_latency = [dict(zip(lat[i:i + 2], st[i:i + 2])) for i in range(0, len(st) - 1, 2)]
        pairs = [(p[0.0], p[args.latency]) for p in by_latency]  # (no-latency step s, latency step s)
        added = sorted(b - a for a, b in pairs)
        median = statistics.median(added)
        allowed = args.turns * 0.75
        print(f"paired steps (no latency / {args.latency:g} s): " + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in pairs))
        print(f"in-process, concurrent: median step time added by the tools {median:.2f} s over {len(pairs)} pairs "
              f"(range {added[0]:.2f} to {added[-1]:.2f}); target <= {args.turns} x 0.75 s = {allowed:.2f} s "
              f"({'met' if median <= allowed else 'NOT met'})")
    s, c = rows["in-process, serial"], rows["in-process, concurrent"]
    print(f"serial/concurrent tool wait per turn: {s['tool_wait_per_turn_s'] / c['tool_wait_per_turn_s']:.1f} x")
    if not args.no_ray:
        import ray
        from ray import serve

        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
