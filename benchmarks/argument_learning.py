"""Whether the tiny policy reads a tool call's free arguments out of the instruction, and what in
the prompt keeps it from learning to: two measurements on one pipeline run folder.

    python benchmarks/argument_learning.py RUN [--steps 200] [--prefixes none system filler] [--warm-steps N]
        [--probe [--checkpoint DIR]] [--results FILE]

RUN is a pipeline run folder (`canvasagent pipeline --out RUN`, or a seed folder of
`benchmarks/train_evidence.py`) with its data, `sft/tiny_base` and, for `--probe`, `sft/final`.
The arguments are those of Overlayer text calls: `content` (the quoted words of the instruction)
and `position` (its place words, e.g. "top-left corner" -> "[220, 140]"), the two that the
evidence run's parameter-precision table shows near chance after SFT. Examples: every SFT row with
such a call (its instruction and the call's two values); held out: the evaluation and GRPO tasks'
reference calls of that kind (never in an SFT row).

* **learn** (each of `--prefixes`): text only, from the run's untrained tiny base, train the whole
  model on `<prefix><instruction>\\n{"content": "...", "position": "..."}` with the loss on the
  answer alone (AdamW, batches of 8, constant rate), and measure on the held-out examples, four
  times along the way, the teacher-forced answer-token accuracy (argmax) and the share of exact
  answers (every answer token right). Prefix `none`: the instruction alone; `system`: the system
  turn that SFT, GRPO and evaluation render (our prompt and the chat template's tool block, about
  1,600 tokens), the same in every example; `filler`: as many tokens of random words, also the same
  in every example. So `none` against `system` says whether the long constant prompt is what slows
  the learning, and `filler` whether its length alone does. `--warm-steps N` adds a run with the
  system prefix after N steps without any (what `model.tiny_warmup_steps` does before SFT).
* **probe** (`--probe`): the run's SFT checkpoint, in the training layout with the task's image, on
  the first turn of single-call Overlay tasks (`--probe-n` SFT rows and as many held-out tasks), ranks the 10 contents
  (and 7 positions) by the summed log-probability of each as the next tokens of its reply; top-1
  accuracy is reported for the content in the reason and in the call (after a neutral reason and
  after a reason that names the right content), and for the position after the right content.
  Chance is 1/10 and 1/7.

Prints a markdown report and writes it to `--results`.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

Example = tuple[str, dict[str, str]]  # (instruction, {"content": ..., "position": ...})
BATCH = 8


def overlay_text_args(calls: list[dict[str, Any]]) -> dict[str, str] | None:
    """The content and position of the first Overlayer text call among `calls`, or None."""
    for c in calls:
        a = c.get("arguments") or {}
        if c.get("name") == "Overlayer" and a.get("overlay_type") == "text":
            return {"content": str(a["content"]), "position": str(a["position"])}
    return None


def _sft_rows(run: Path):
    import pandas as pd

    shards = sorted((run / "data" / "canvascraft" / "sft" / "shards").glob("*.parquet"))
    if not shards:
        raise SystemExit(f"{run}: no SFT rows under data/canvascraft/sft/shards")
    return pd.concat(pd.read_parquet(f) for f in shards)


def held_out_tasks(run: Path) -> list:
    from canvasagent.evaluation.tasks_io import load_tasks

    root = run / "data" / "canvascraft" / "rl"
    return [t for split in ("eval", "train") for t in load_tasks(root, split=split)]


def examples(run: Path) -> tuple[list[Example], list[Example]]:
    """(SFT examples, held-out examples) of Overlayer text calls; refuses a run without either."""
    train = []
    for _, r in _sft_rows(run).iterrows():
        turns = json.loads(r.trajectory)["turns"]
        args = overlay_text_args([t["call"] for t in turns if t.get("call")])
        if args:
            train.append((str(r.instruction), args))
    held = [(t.instruction, a) for t in held_out_tasks(run) if (a := overlay_text_args(t.meta.get("reference_calls") or []))]
    if not train or not held:
        raise SystemExit(f"{run}: {len(train)} SFT and {len(held)} held-out Overlayer text calls; need both")
    return train, held


def system_prompt(run: Path, processor: Any) -> str:
    """The system turn as SFT, GRPO and evaluation render it for this run's tools."""
    from canvasagent.training.env import tool_functions
    from canvasagent.training.messages import system_text

    cfg = json.loads((run / "pipeline_config.json").read_text()) if (run / "pipeline_config.json").exists() else {}
    names = (cfg.get("sft_overrides") or {}).get("tools.names")
    return system_text(processor, tool_functions(names), "canvasagent")


def prefix_text(kind: str, tokenizer: Any, system: str, seed: int = 1) -> str:
    if kind == "none":
        return ""
    if kind == "system":
        return system + "\n"
    if kind == "filler":
        words = sorted(w[1:] for w in tokenizer.get_vocab() if w.startswith("\u0120") and w[1:].isalpha() and len(w) > 3)
        rng, target = random.Random(seed), len(tokenizer(system)["input_ids"])
        text = ""
        while len(tokenizer(text)["input_ids"]) < target:
            text += "".join(" " + rng.choice(words) for _ in range(64))
        return tokenizer.decode(tokenizer(text)["input_ids"][:target]) + "\n"
    raise SystemExit(f"unknown prefix {kind!r}: none, system or filler")


def encode(tokenizer: Any, prefix: str, ex: Example) -> tuple[list[int], list[int]]:
    """Token ids and labels (-100 outside the answer) of one example."""
    head = f'{prefix}{ex[0]}\n{{"content":'
    answer = f' "{ex[1]["content"]}", "position": "{ex[1]["position"]}"}}'
    ids_head = tokenizer(head)["input_ids"]
    ids = tokenizer(head + answer)["input_ids"]
    if ids[: len(ids_head)] != ids_head:
        raise ValueError("the answer's first token merges with the prompt's last one")
    return ids, [-100] * len(ids_head) + ids[len(ids_head):]


def answer_accuracy(model: Any, encoded: list[tuple[list[int], list[int]]]) -> tuple[float, float]:
    """(answer-token accuracy, share of exact answers), teacher-forced argmax."""
    import torch

    model.eval()
    right = total = exact = 0
    with torch.inference_mode():
        for x, y in encoded:
            pred = model(input_ids=torch.tensor([x])).logits[0].argmax(-1)
            hits = [int(pred[i - 1]) == y[i] for i in range(len(y)) if y[i] != -100]
            right, total, exact = right + sum(hits), total + len(hits), exact + all(hits)
    model.train()
    return right / total, exact / len(encoded)


def learn(run: Path, kind: str, steps: int, lr: float, seed: int, n_eval: int, warm: int = 0) -> list[tuple[int, float, float, float]]:
    """[(step, answer-token accuracy, exact share, seconds)] on held-out examples, from the tiny base;
    with `warm`, that many steps without a prefix come first (not counted in `step`)."""
    import torch
    from transformers import AutoModelForImageTextToText

    from canvasagent.core.models.loading import load_processor
    from canvasagent.training.tiny_warmup import train_step

    base = run / "sft" / "tiny_base"
    processor = load_processor(str(base))
    tok = processor.tokenizer
    model = AutoModelForImageTextToText.from_pretrained(str(base))
    train, held = examples(run)
    prefix = prefix_text(kind, tok, system_prompt(run, processor))
    train_enc = [encode(tok, prefix, e) for e in train]
    held_enc = [encode(tok, prefix, e) for e in held[:n_eval]]
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()

    def step_on(pool: list) -> float:
        return train_step(model, opt, [rng.choice(pool) for _ in range(BATCH)], tok.pad_token_id or 0)

    points, t0 = [], time.perf_counter()
    bare = [encode(tok, "", e) for e in train]
    for _ in range(warm):
        step_on(bare)
    if warm:
        acc, exact = answer_accuracy(model, held_enc)
        points.append((0, acc, exact, time.perf_counter() - t0))
    marks = {round(steps * q / 4) for q in (1, 2, 3, 4)}
    for step in range(1, steps + 1):
        loss = step_on(train_enc)
        if step in marks:
            acc, exact = answer_accuracy(model, held_enc)
            points.append((step, acc, exact, time.perf_counter() - t0))
            print(f"  {kind}: step {step}, loss {loss:.3f}, held-out answer tokens {acc:.3f}, exact {exact:.3f}", file=sys.stderr, flush=True)
    return points


def probe(run: Path, n: int, ckpt: Path | None = None) -> dict[str, dict[str, tuple[int, int]]]:
    """{"SFT rows"|"held-out": {probe: (top-1 right, count)}} for the run's SFT checkpoint, on the
    first `n` single-call Overlay examples of each (`ckpt`: another checkpoint than `sft/final`)."""
    import torch
    from PIL import Image

    from canvasagent.core.episode import user_message
    from canvasagent.core.models.loading import load_policy, load_processor
    from canvasagent.core.tasks import Task

    ckpt = ckpt or run / "sft" / "final"
    processor, model = load_processor(str(ckpt)), load_policy(str(ckpt))
    model.eval()
    system = system_prompt(run, processor)
    train, _ = examples(run)
    contents = sorted({a["content"] for _, a in train})
    positions = sorted({a["position"] for _, a in train})

    def top1(messages: list, images: list, prefix: str, cands: list[str], fmt: str) -> str:
        head = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) + prefix
        n = processor(text=[head], images=images, return_tensors="pt")["input_ids"].shape[1]
        best, best_lp = "", float("-inf")
        for c in cands:
            enc = processor(text=[head + fmt.format(c)], images=images, return_tensors="pt")
            with torch.inference_mode():
                lp = model(**enc).logits[0].float().log_softmax(-1)
            ids = enc["input_ids"][0]
            total = float(sum(lp[i - 1, ids[i]] for i in range(n, len(ids))))
            if total > best_lp:
                best, best_lp = c, total
        return best

    def call_head(reason: str) -> str:
        return (f"<reason>{reason}</reason>\n<tool_call>\n"
                '{"name": "Overlayer", "arguments": {"base_image": "img_1", "overlay_type": "text", "content":')

    items: dict[str, list] = {"SFT rows": [], "held-out": []}
    for _, r in _sft_rows(run).iterrows():
        if r.chain != "Overlay":
            continue
        turns = json.loads(r.trajectory)["turns"]
        args = overlay_text_args([turns[0]["call"]] if turns and turns[0].get("call") else [])
        if args:
            image = Image.open(io.BytesIO(r.images[0]["bytes"])).convert("RGB")
            items["SFT rows"].append((Task(id=str(r.id), instruction=str(r.instruction), images=[image]), args))
    for t in held_out_tasks(run):
        refs = t.meta.get("reference_calls") or []
        if t.meta.get("chain") == "Overlay" and (args := overlay_text_args(refs[:1])):
            items["held-out"].append((t, args))
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for split, pairs in items.items():
        pairs = pairs[:n]
        hits = dict.fromkeys(("content in the reason", "content in the call, neutral reason",
                              "content in the call, reason names it", "position in the call, right content"), 0)
        for task, a in pairs:
            messages = [{"role": "system", "content": [{"type": "text", "text": system}]}, user_message(task)]
            images = list(task.images)
            right = a["content"]
            hits["content in the reason"] += top1(messages, images, "<reason>Now I write", contents, " '{}'") == right
            hits["content in the call, neutral reason"] += top1(messages, images, call_head("I add the caption."), contents, ' "{}"') == right
            hits["content in the call, reason names it"] += top1(
                messages, images, call_head(f"Now I write '{right}' on img_1."), contents, ' "{}"') == right
            hits["position in the call, right content"] += top1(
                messages, images, call_head("I add the caption.") + f' "{right}", "position":', positions, ' "{}"') == a["position"]
        out[split] = {k: (v, len(pairs)) for k, v in hits.items()}
    return out


def report(run: Path, learned: dict[str, list], probed: dict | None, args: argparse.Namespace) -> str:
    train, held = examples(run)
    lines = [f"# Argument learning (`{run}`)", "",
             f"Overlayer text calls: {len(train)} SFT examples, {min(len(held), args.eval_n)} held-out examples "
             f"measured (of {len(held)}).", ""]
    if learned:
        cols = sorted({s for pts in learned.values() for s, *_ in pts})
        lines += [f"Learned from the untrained tiny base, text only, batches of {BATCH}, rate {args.lr} "
                  "(held-out, teacher-forced: answer-token accuracy / exact answers; step 0: after the warmup):", "",
                  "| prefix | " + " | ".join(f"step {s}" for s in cols) + " | seconds |", "|---|" + "---|" * (len(cols) + 1)]
        for kind, pts in learned.items():
            at = {s: f"{a:.3f} / {e:.3f}" for s, a, e, _ in pts}
            lines.append(f"| {kind} | " + " | ".join(at.get(s, "") for s in cols) + f" | {pts[-1][3]:.0f} |")
        lines.append("")
    if probed:
        keys = list(next(iter(probed.values())))
        lines += [f"The checkpoint `{args.checkpoint or args.run / 'sft' / 'final'}`: top-1 ranking (first turn, training layout with the image; chance 0.10 "
                  "for the content, 0.14 for the position):", "",
                  "| examples | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
        for split, hits in probed.items():
            lines.append(f"| {split} (n={next(iter(hits.values()))[1]}) | "
                         + " | ".join(f"{h / n:.2f} ({h}/{n})" for h, n in hits.values()) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--prefixes", nargs="*", default=["none", "system", "filler"])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warm-steps", type=int, default=0, help="also: the system prefix after this many steps without one")
    ap.add_argument("--eval-n", type=int, default=40, help="held-out examples measured during learning")
    ap.add_argument("--probe", action="store_true", help="also probe the run's SFT checkpoint")
    ap.add_argument("--probe-n", type=int, default=24, help="examples of each kind the probe ranks")
    ap.add_argument("--checkpoint", type=Path, help="the checkpoint to probe (default RUN/sft/final)")
    ap.add_argument("--results", type=Path)
    args = ap.parse_args(argv)
    import torch

    torch.manual_seed(args.seed)
    learned = {k: learn(args.run, k, args.steps, args.lr, args.seed, args.eval_n) for k in args.prefixes}
    if args.warm_steps:
        learned[f"system, after {args.warm_steps} steps without it"] = learn(
            args.run, "system", args.steps, args.lr, args.seed, args.eval_n, warm=args.warm_steps)
    probed = probe(args.run, args.probe_n, args.checkpoint) if args.probe else None
    from markdown_out import emit

    emit(report(args.run, learned, probed, args), args.results)


if __name__ == "__main__":
    main()
