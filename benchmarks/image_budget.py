"""Prompt tokens and peak RSS of a rollout forward pass, every tool image (K=all) against the last 2 (K=2).

Setup: scikit-image's 512x512 astronaut as the task's input, a 12-turn trajectory (Rotate 90,
Flip, Crop of the whole frame, four times over, each on the previous output, so every tool image
is 512x512) executed with the real offline toolbox through the episode runner. The final turn's
prompt (system with the tool block, the user turn, 12 assistant calls and 12 tool observations)
is rendered in the training layout with the tiny offline Qwen3-VL's processor, under K=all and
K=2 (`canvasagent.core.image_budget`). The tiny checkpoint is built here with its image resize bound
raised to 512x512 so each image costs what it costs Qwen3-VL (16 px patches, 2x2 merge: 256
tokens); the stock tiny model caps images at 128x128.

Each K runs in a fresh process (peak RSS is a process-lifetime maximum): it builds the
trajectory, renders the prompt, records RSS, then runs one forward pass of the tiny policy over
the prompt (images included, as the GRPO loss forward does) and records the peak RSS.

    python benchmarks/image_budget.py [--turns 12] [--size 512] [--out benchmarks/results/image_budget.md]

The last line is `K=all/K=2 prompt tokens: R x`, with R measured in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

TOOLS = ["Crop", "Flip", "Rotate"]


def _replies(turns: int) -> list[str]:
    calls = [("Rotate", {"angle": 90}, "Rotate {a} by 90 degrees."), ("Flip", {}, "Mirror {a}."),
             ("Crop", {"bbox": [0, 0, 1000, 1000]}, "Crop {a} to the whole frame.")]
    counters: dict[str, int] = {}
    src, out = "img_1", []
    for t in range(turns):
        name, args, reason = calls[t % len(calls)]
        call = {"name": name, "arguments": {"image": src, **args}}
        out.append(f"<reason>{reason.format(a=src)}</reason>\n<tool_call>\n{json.dumps(call)}\n</tool_call>")
        src = f"{name}_{counters.get(name, 0)}"
        counters[name] = counters.get(name, 0) + 1
    return out + ["<reason>Done.</reason><Terminate>"]


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def worker(model_dir: str, budget: int | None, turns: int, size: int) -> dict:
    import numpy as np
    import skimage.data
    import torch
    from PIL import Image

    from toolserver.client import make_toolbox
    from canvasagent.core.episode import Episode, EpisodeConfig
    from canvasagent.core.image_budget import apply_image_budget, count_images
    from canvasagent.core.models import load_policy, load_processor
    from canvasagent.core.tasks import Task
    from canvasagent.training.env import tool_functions
    from canvasagent.training.messages import policy_messages, system_text

    img = Image.fromarray(np.asarray(skimage.data.astronaut())[..., :3]).resize((size, size))
    task = Task("Rotate, mirror and crop the photo, twelve times over.", [img], id="image_budget_bench")
    replies = _replies(turns)
    # The final turn's prompt: the conversation before the <Terminate> reply.
    ep = Episode(make_toolbox("offline"), EpisodeConfig(max_turns=turns + 1, image_budget=budget))
    ep.reset(task)
    for r in replies[:-1]:
        ep.step(r)
    ok = [t for t in ep.trajectory.turns if t.status == "ok"]
    assert len(ok) == turns and all(ep.assets.get(t.output_id).image.size == (size, size) for t in ok), \
        [t.error for t in ep.trajectory.turns]
    processor = load_processor(model_dir)
    messages = policy_messages(ep.context(), system_text(processor, tool_functions(TOOLS)))
    assert ep.context() == apply_image_budget(ep.messages, budget)[0]
    inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                           return_tensors="pt")
    model = load_policy(model_dir)
    model.eval()
    rss_before = _rss_kb()
    with torch.no_grad():
        model(**inputs)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {
        "budget": "all" if budget is None else budget,
        "prompt_tokens": int(inputs["input_ids"].shape[1]),
        "images": count_images(messages),
        "image_tokens": int((inputs["input_ids"] == processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")).sum()),
        "rss_before_forward_mb": rss_before / 1024,
        "peak_rss_mb": peak / 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--budget", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/image_budget.md")
    ap.add_argument("--worker", nargs=2, metavar=("MODEL_DIR", "BUDGET"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        model_dir, b = args.worker
        print(json.dumps(worker(model_dir, None if b == "all" else int(b), args.turns, args.size)))
        return

    from canvasagent.core.models.tiny import TinyQwen3VLSpec, build_tiny_qwen3vl

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_qwen3vl(Path(tmp) / "tiny", spec=TinyQwen3VLSpec(max_pixels=args.size * args.size))
        rows = []
        for b in ("all", str(args.budget)):
            cmd = [sys.executable, __file__, "--worker", str(model_dir), b, "--turns", str(args.turns), "--size", str(args.size)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    full, small = rows
    ratio = full["prompt_tokens"] / small["prompt_tokens"]
    lines = [
        "# Image-context budget: prompt tokens and peak RSS",
        "",
        (f"`python benchmarks/image_budget.py` — {args.size}x{args.size} astronaut, {args.turns} tool turns "
         "(Rotate 90 / Flip / whole-frame Crop, real offline toolbox), final-turn prompt in the training layout, "
         "tiny Qwen3-VL (random weights, image bound raised to 512x512: 256 tokens per image), one forward pass "
         "per process."),
        "",
        "| K | images in prompt | prompt tokens | image tokens | RSS before forward (MB) | peak RSS (MB) | forward's rise (MB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['budget']} | {r['images']} | {r['prompt_tokens']} | {r['image_tokens']} | "
                     f"{r['rss_before_forward_mb']:.0f} | {r['peak_rss_mb']:.0f} | "
                     f"{r['peak_rss_mb'] - r['rss_before_forward_mb']:.0f} |")
    lines += ["", (f"K=all/K={args.budget} prompt tokens: {ratio:.2f} x; peak RSS: "
                   f"{full['peak_rss_mb'] / small['peak_rss_mb']:.2f} x (the tiny model's weights are ~2 MB: the rest "
                   "of the process is Python, torch and the processor; at 8B the activations scale with the tokens).")]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    for r in rows:
        print(json.dumps(r))
    print(f"K=all/K={args.budget} peak RSS of the forward pass: {full['peak_rss_mb']:.0f} MB / {small['peak_rss_mb']:.0f} MB "
          f"= {full['peak_rss_mb'] / small['peak_rss_mb']:.2f} x")
    print(f"K=all/K={args.budget} prompt tokens: {ratio:.2f} x")


if __name__ == "__main__":
    main()
