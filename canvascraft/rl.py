"""CanvasCraft-RL: task specs (instruction, inputs, expected tool set) with R/L/D labels and checks.

Each slot draws target levels on the three axes of paper Table 2 from the configured shares,
then composes chain templates (and conditions in the instruction) until the task meets them.
Labels are always computed from the task that was built, never copied from the target, so a
target that could not be met shows up as `target_missed` in the stats rather than as a wrong
label. Tasks carry verifiable checks for the offline alignment judge; when every tool of the
reference solution is deterministic, the reference is executed through the episode runner and
its final image becomes the expected image (matched exactly; also for a crop or rotation with
OCR, which leaves the image alone, and by SSIM when SR or a caption of OCR's reading shaped it).
"""

from __future__ import annotations

import json
import random
from typing import Any

from canvasagent.core.episode import EpisodeConfig, run_episode
from canvasagent.core.imageio import images_match, open_image
from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import Trajectory
from canvascraft.chains import Chain, chain_name, default_needs
from canvascraft.formats import dump_checks, png
from canvascraft.plan import Plan, make_plan
from canvascraft.sft import ChainPolicy, bump, draw, missing_backends, pick_inputs, quality_control
from rewards.checks import CheckContext, answering_turn, run_check
from toolserver.registry import REGISTRY, Backend, OutputKind
from toolserver.registry import tools as registry_tools

# Conditions a step can be made to depend on. `True` marks a condition on an intermediate
# result (what Grounding found, what OCR read, the size after a step): state dependency.
CONDITIONS: dict[str, tuple[str, bool]] = {
    "Rotate.fix": ("the text is not upright", False),
    "Flip.fix": ("the text reads back to front", False),
    "Crop": ("the {target} can be found", True),
    "SAM": ("the {target} is detected", True),
    "Overlayer.ocr": ("any text was recognised", True),
    "SR": ("the result is still small", True),
    "ImageEdit": ("the {target} is visible", False),
    "Overlayer.text": ("the {position_name} is free", False),
    "OCR": ("there is readable text", False),
}


def length_level(n_steps: int) -> str:
    return "easy" if n_steps <= 4 else "medium" if n_steps <= 8 else "hard"


def diversity_level(n_tools: int) -> str:
    return "easy" if n_tools <= 2 else "medium" if n_tools <= 4 else "hard"


def reasoning_level(n_conditions: int, state_dependent: int) -> str:
    if n_conditions == 0:
        return "easy"
    if n_conditions >= 3 or (n_conditions >= 2 and state_dependent >= 1):
        return "hard"
    return "medium"


_LENGTH_RANGE = {"easy": (1, 4), "medium": (5, 8), "hard": (9, 99)}


# Templates that can be repeated over several targets on the same image (ground, segment or
# caption each of several things): long tasks with few distinct tools, as D-easy needs.
REPEATABLE = frozenset({"Grounding", "SAM", "Extract", "Overlayer"})


def compose_chain(chains: Any, rng: random.Random, length: str, max_steps: int, diversity: str = "medium") -> Chain | None:
    """Concatenate sampled templates until the length level is reached (None if overshot). A
    template that needs a ready RGBA cut-out (`needs: [rgba]`) takes it as an input, so it can only
    open a composition; the composed chain keeps its inputs, needs and name."""
    lo, hi = _LENGTH_RANGE[length]
    hi = min(hi, max_steps)
    tools: list[str] = []
    first: Chain | None = None
    reps = [c for c in chains if c.weight > 0 and set(c.tools) <= REPEATABLE and c.distinct_tools <= 2]
    if diversity == "easy" and lo > 2 and reps:
        c = rng.choices(reps, weights=[c.weight for c in reps], k=1)[0]
        tools = list(c.tools) * -(-lo // len(c.tools))
    for _ in range(0 if tools else 12):
        template = chains.sample(rng)
        part = list(template.tools)
        if tools and "rgba" in template.needs:
            continue
        if tools and part[0] == "ImageGeneration":
            part = part[1:]  # only a task without input images starts by generating one
        if not part or (tools and part[0] == tools[-1]):
            continue  # an immediate repeat (Grounding, Grounding) is redundant, not harder
        first = first or template
        tools.extend(part)
        if len(tools) >= lo:
            break
    if not lo <= len(tools) <= hi:
        return None
    spec: dict[str, Any] = {"tools": tools, "group": "rl"}
    if first is not None and "rgba" in first.needs:
        rest = tools[len(first.tools):]
        spec.update(inputs=first.inputs, needs=sorted(set(first.needs) | set(default_needs(tools, first.inputs))),
                    name=first.name + ("+" + chain_name(rest) if rest else ""))
    return Chain.from_spec(spec)


def add_conditions(plan: Plan, reasoning: str, rng: random.Random) -> tuple[int, int]:
    """Attach conditions to plan steps to reach the reasoning level; returns (count, state-dependent)."""
    want = {"easy": 0, "medium": rng.choice((1, 2)), "hard": rng.choice((2, 3))}[reasoning]
    cands = [s for s in plan.steps if s.clause in CONDITIONS]
    rng.shuffle(cands)
    if reasoning == "hard" and want == 2:
        # Two conditions are hard only if one of them depends on an intermediate result.
        cands.sort(key=lambda s: not CONDITIONS[s.clause][1])
    chosen = cands[:want]
    state = 0
    for s in chosen:
        text, dep = CONDITIONS[s.clause]
        s.params["condition"] = text.format(**{k: v for k, v in s.params.items() if isinstance(v, str)})
        state += dep
    return len(chosen), state


def checks_for(plan: Plan, has_reference: bool, ocr_answer: str | None = None, exact: bool = True) -> list[dict[str, Any]]:
    """Verifiable checks in the offline alignment judge's vocabulary (rewards/checks.py).

    `has_reference`: the reference solution's executed final image is the target; `exact`: the
    chain is deterministic, so the match must be exact (else SSIM over the threshold, for a
    reproducible model tool). `ocr_answer`: text the reference solution's OCR call really read
    (the answer an OCR task asks for)."""
    tools = [s.tool for s in plan.steps]
    checks: list[dict[str, Any]] = []
    if has_reference:
        # `task_of(row)` puts the row's reference_image at task.meta["reference_images"][0].
        checks.append({"type": "reference_similarity", "image_index": 0, "metric": "ssim", "threshold": 0.9, "exact": exact})
    if ocr_answer:
        checks.append({"type": "answer_contains", "text": ocr_answer, "tool": "OCR"})
    for i, s in enumerate(plan.steps):
        later = tools[i + 1 :]
        # Only when nothing later could hide, turn or cut the text.
        if s.clause == "Overlayer.text" and not {"ImageEdit", "Overlayer", "Rotate", "Flip", "Crop"} & set(later):
            checks.append({"type": "ocr_contains", "text": s.params["text"]})
    text = plan.inputs[0].meta.get("text") if plan.inputs else None
    if text and not {"ImageEdit", "Crop"} & set(tools) and any(s.clause in ("Rotate.fix", "Flip.fix") for s in plan.steps):
        # The correction should leave the scene's text readable again.
        checks.append({"type": "ocr_contains", "text": text})
    grounded = [s for s in plan.steps if s.tool == "Grounding"]
    if grounded and plan.inputs:
        last = max(i for i, t in enumerate(tools) if t == "Grounding")
        if "ImageEdit" not in tools[last:]:
            checks.append({"type": "grounding_finds", "text": grounded[-1].params["target"]})
    n_sr = tools.count("SR")
    resized = {"Crop", "ImageGeneration"} & set(tools) or any(s.tool == "Rotate" and s.params.get("angle") == 45 for s in plan.steps)
    if n_sr and not resized and plan.inputs:
        checks.append({"type": "size_relation", "of": "img_1", "factor": 4**n_sr})
    elif "Crop" in tools and not n_sr and plan.inputs:
        checks.append({"type": "size_relation", "of": "img_1", "relation": "smaller"})
    for spec in registry_tools():  # a mask or a cut-out step: its product is of that kind
        if spec.name in tools and spec.output in (OutputKind.MASK, OutputKind.RGBA):
            checks.append({"type": "asset_kind", "kind": spec.output.value, "tool": spec.name})
    if "ImageEdit" in tools and plan.inputs:
        checks.append({"type": "differs_from", "of": "img_1"})
    return checks


# Model tools that leave the image as it is (OCR answers in text), and model tools whose answer
# is reproducible up to numerical noise (CPU Real-ESRGAN; OCR, whose reading a caption may repeat).
IMAGE_NEUTRAL = frozenset({"OCR"})
REPRODUCIBLE = frozenset({"SR", "OCR"})


def _has_reference(chain: Chain) -> bool:
    """Whether the reference solution's final image is the task's target: always for a
    deterministic chain; for pure tools plus image-neutral or reproducible model tools only when
    the chain crops or rotates, whose box or angle no other check sees."""
    tools = set(chain.tools)
    if all(REGISTRY[t].backend is Backend.PURE for t in tools):
        return True
    return bool(tools & {"Crop", "Rotate"}) and all(REGISTRY[t].backend is Backend.PURE or t in IMAGE_NEUTRAL | REPRODUCIBLE for t in tools)


def _exact_reference(chain: Chain, plan: Plan) -> bool:
    """The reference image is matched exactly when every tool that makes an image is pure and
    no caption repeats what OCR read (the model's reading drawn into the image: matched by SSIM)."""
    return all(REGISTRY[t].backend is Backend.PURE or t in IMAGE_NEUTRAL for t in chain.tools) and not any(
        s.clause == "Overlayer.ocr" for s in plan.steps)


def new_rl_stats() -> dict[str, Any]:
    return {"slots": 0, "attempts": 0, "kept": 0, "rejected": {}, "target_missed": 0, "reasoning": {}, "length": {}, "diversity": {}, "tones": {}, "steps": {}, "chains": {}, "checks": {}, "with_reference": 0, "checks_dropped": 0}


def build_rl_shard(cfg: Any, job: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from canvascraft.context import context_for

    ctx = context_for(cfg)
    profile = ctx.toolbox.profile
    stats = new_rl_stats()
    rows: list[dict[str, Any]] = []
    for slot in range(job.start, job.stop):
        stats["slots"] += 1
        base = random.Random(f"rl:{job.split}:{job.seed}:{slot}")
        target = {ax: draw(getattr(cfg, ax), base) for ax in ("reasoning", "length", "diversity")}
        best: dict[str, Any] | None = None
        for attempt in range(cfg.max_attempts):
            rng = random.Random(f"rl:{job.split}:{job.seed}:{slot}:{attempt}")
            stats["attempts"] += 1
            chain = compose_chain(ctx.chains, rng, target["length"], cfg.max_steps, target["diversity"])
            if chain is None:
                bump(stats["rejected"], "length_unmet")
                continue
            task = _make_task(cfg, ctx, chain, rng, target, profile, job, slot)
            if isinstance(task, str):
                bump(stats["rejected"], task)
                continue
            hit = all(task["labels"][ax] == target[ax] for ax in target)
            if best is None or hit:
                best = task
            if hit:
                break
        if best is None:
            continue
        labels = best["labels"]
        if any(labels[ax] != target[ax] for ax in target):
            stats["target_missed"] += 1
        rows.append(best["row"])
        stats["kept"] += 1
        stats["checks_dropped"] += best["checks_dropped"]
        for ax in ("reasoning", "length", "diversity"):
            bump(stats[ax], labels[ax])
        bump(stats["tones"], best["row"]["tone"])
        bump(stats["steps"], best["row"]["n_steps"])
        bump(stats["chains"], best["row"]["chain"] if len(best["row"]["path"]) <= 6 else "composed(>6 steps)")
        for c in json.loads(best["row"]["checks"]):
            bump(stats["checks"], c["type"])
        stats["with_reference"] += best["row"]["reference_image"] is not None
    return rows, stats


def _make_task(cfg: Any, ctx: Any, chain: Chain, rng: random.Random, target: dict[str, str], profile: Any, job: Any, slot: int) -> dict[str, Any] | str:
    inputs = pick_inputs(chain, ctx.source, rng, profile, cfg.sr_input_side)
    if inputs is None:
        return "source_lacks_" + "_".join(chain.needs)
    plan = make_plan(chain, inputs, rng, profile)
    n_cond, state = add_conditions(plan, target["reasoning"], rng)
    tone = draw(cfg.tones, rng)
    instruction = ctx.writer.write(plan, rng, tone)
    labels = {
        "reasoning": reasoning_level(n_cond, state),
        "length": length_level(len(chain.tools)),
        "diversity": diversity_level(chain.distinct_tools),
    }
    reference, reference_calls, ocr_answer, traj = None, None, None, None
    if not missing_backends(chain, ctx.toolbox):
        # Conditions do not change the reference solution: each holds by construction.
        task = Task(instruction, [i.image for i in inputs], id="reference", expected_tools=list(chain.tools))
        traj = run_episode(ChainPolicy(plan, ctx.phrasings, rng), task, ctx.toolbox, EpisodeConfig(max_turns=len(chain.tools) + 1))
        if quality_control(traj, plan):
            return "reference_failed"
        reference_calls = json.dumps([{"name": t.call.name, "arguments": t.call.arguments} for t in traj.turns if t.call is not None],
                                     ensure_ascii=False, sort_keys=True)
        final = traj.final_asset()
        if cfg.reference_images and _has_reference(chain) and final is not None:
            if inputs and images_match(final.image, inputs[0].image):
                return "reference_equals_input"  # doing nothing would already be right
            reference = png(final.image)
        text = inputs[0].meta.get("text") if inputs else None
        if text and answering_turn(traj, "OCR", text) is not None:
            ocr_answer = text
        elif text and chain.tools[-1] == "OCR":
            return "reference_unreadable"  # the task's answer is not what its tool can read
    checks = checks_for(plan, reference is not None, ocr_answer if chain.tools[-1] == "OCR" else None, _exact_reference(chain, plan))
    n_before = len(checks)
    if traj is not None:
        checks = [c for c in checks if c["type"] == "reference_similarity" or _reference_passes(traj, c, ctx.toolbox)]
    row = {
        "id": f"rl-{job.split}-{job.seed}-{slot:06d}",
        "split": job.split,
        "prompt": instruction,
        "tone": tone,
        "chain": chain.name,
        "images": [png(i.image) for i in inputs],
        "path": list(chain.tools),
        "n_steps": len(chain.tools),
        "n_tools": chain.distinct_tools,
        "checks": dump_checks(checks),
        "reference_image": reference,
        "reference_calls": reference_calls,
        **labels,
    }
    return {"row": row, "labels": labels, "checks_dropped": n_before - len(checks)}


def _reference_passes(traj: Trajectory, check: dict[str, Any], toolbox: Any) -> bool:
    """A check the reference solution does not pass (text the Overlayer drew past the image edge,
    so OCR reads only part of it) measures the tool's limits, not the instruction: it is dropped."""
    r = run_check(CheckContext(traj, toolbox), check)
    return r.verifiable and r.passed


def tasks_of(rows: list[dict[str, Any]], split: str) -> list[Task]:
    """The `Task`s of the rows in `split`; a row without one (a public rl.json record) is a train row."""
    keep = (None, split) if split == "train" else (split,)
    return [task_of(r) for r in rows if r.get("split") in keep]


def task_of(row: dict[str, Any]) -> Task:
    """A runnable `Task` from an RL row (images as cells with PNG bytes)."""
    return Task(
        instruction=row["prompt"],
        images=[open_image(c["bytes"]) for c in row["images"]],
        id=row["id"],
        expected_tools=list(row["path"]),
        checks=json.loads(row["checks"] or "[]"),
        labels={ax: row[ax] for ax in ("reasoning", "length", "diversity")},
        meta={
            "tone": row["tone"],
            "chain": row["chain"],
            "split": row["split"],
            "reference_images": [open_image(row["reference_image"]["bytes"])] if row.get("reference_image") else [],
            "reference_calls": json.loads(row["reference_calls"]) if row.get("reference_calls") else [],
        },
    )
