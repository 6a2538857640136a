"""CanvasCraft-SFT: sample a chain, pick images, write the instruction, execute, check, record.

Execution goes through the one episode runner: a `ScriptedPolicy` emits protocol replies
(`format_reply`) step by step, reading the live episode state for values that exist only at run
time (Grounding boxes, OCR text, output IDs). Quality control then reads only the recorded
trajectory: parser findings, `Turn.check`, `Turn.status`, the asset list.
"""

from __future__ import annotations

import json
import logging
import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from PIL import Image

from canvasagent.core.episode import Episode, EpisodeConfig, run_episode
from canvasagent.core.imageio import images_equal
from canvasagent.core.policies import ScriptedPolicy
from canvasagent.core.protocol import format_reply
from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import Trajectory, Turn
from canvascraft.chains import Chain
from canvascraft.plan import Plan, Step, correctable_rotations, make_plan
from canvascraft.sources import ImageSource, SourceImage
from canvascraft.writers import TONES, Phrasings, Writer
from toolserver.registry import REGISTRY, Backend, OutputKind
from toolserver.validation import Profile

log = logging.getLogger(__name__)

_NUM = r"-?\d+(?:\.\d+)?"
_BOX_RE = re.compile(rf"\[\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*\]")
_ASSET_RE = re.compile(r"\b(img_\d+|(?:" + "|".join(REGISTRY) + r")_\d+)\b")


def boxes_of(turn: Turn) -> list[list[int]]:
    """Boxes (0-1000) a Grounding turn returned: from structured data when the backend gives it."""
    raw = turn.result_data.get("boxes") if turn.result_data else None
    out: list[list[int]] = []
    if isinstance(raw, list):
        for b in raw:
            b = b.get("bbox", b.get("box")) if isinstance(b, dict) else b
            if isinstance(b, (list, tuple)) and len(b) == 4:
                out.append([int(round(float(v))) for v in b])
    if not out and turn.tool_text:
        out = [[int(round(float(v))) for v in m.groups()] for m in _BOX_RE.finditer(turn.tool_text)]
    return [b for b in out if b[2] > b[0] and b[3] > b[1]]


def ocr_text(turn: Turn) -> str:
    lines = turn.result_data.get("lines") if turn.result_data else None
    if isinstance(lines, list) and lines:
        return " ".join(str(x) for x in lines).strip()
    return (turn.tool_text or "").strip()


def _norm(s: str) -> str:
    return re.sub(r"[^A-Z0-9]", "", s.upper())


@dataclass
class _Live:
    """What the executing policy knows about the episode so far."""

    cur: str | None
    base: str | None
    boxes: list[list[int]] = field(default_factory=list)
    mask: str | None = None
    cutout: str | None = None
    read: str = ""


def _live_state(episode: Episode, plan: Plan) -> _Live:
    n_in = len(plan.inputs)
    live = _Live(cur="img_1" if n_in else None, base="img_2" if n_in > 1 else None)
    if n_in and plan.inputs[0].meta.get("cutout"):
        live.cutout = "img_1"  # a ready RGBA cut-out given as input: no Extract needed
    for t in episode.trajectory.turns:
        if t.status != "ok" or t.call is None:
            continue
        produces = REGISTRY[t.call.name].produces
        if OutputKind.BOXES in produces:
            live.boxes = boxes_of(t)
        elif OutputKind.TEXT in produces:
            live.read = ocr_text(t)
        if t.output_id:
            kind = episode.assets.get(t.output_id).kind
            if kind is OutputKind.MASK:
                live.mask = t.output_id
            elif kind is OutputKind.RGBA:
                live.cutout = t.output_id
            elif t.call.name == "Overlayer" and t.call.arguments.get("overlay_type") == "object":
                live.base = live.cur = t.output_id
            else:
                live.cur = t.output_id
    return live


def _fmt_box(b: list[int]) -> str:
    return "[" + ", ".join(str(v) for v in b) + "]"


# How the executing policy fills a need (`ToolSpec.requires`) that the plan leaves to run time:
# the value from the live state, and the rejection reason when there is none.
_FROM_LIVE = object()
_LIVE_VALUES: dict[OutputKind, tuple[Callable[[_Live], Any], str]] = {
    OutputKind.BOXES: (lambda live: _fmt_box(live.boxes[0]) if live.boxes else None, "no_detection"),
    OutputKind.MASK: (lambda live: live.mask, "no_mask"),
    OutputKind.RGBA: (lambda live: live.cutout, "no_cutout"),
    OutputKind.TEXT: (lambda live: live.read if not live.read.startswith("OCR completed but no text") else None, "no_text"),
}


def step_call(step: Step, live: _Live) -> dict[str, Any]:
    """The tool call for one plan step, given the live state. Raises LookupError if a needed
    run-time value (a box, a mask, a cut-out, a reading) is missing."""
    p, img = step.params, live.cur
    t = step.tool
    pos = "[" + ", ".join(str(v) for v in p["position"]) + "]" if "position" in p else None
    if t == "ImageGeneration":
        args: dict[str, Any] = {"prompt": p["prompt"]}
    elif t == "ImageEdit":
        args = {"image": img, "edit_prompt": p["edit_prompt"]}
    elif t == "Grounding":
        args = {"image": img, "reference_text": p["target"]}
    elif step.clause == "Crop.region":
        args = {"image": img, "bbox": _fmt_box(p["bbox"])}  # the region the instruction states
    elif t in ("Crop", "SAM"):
        args = {"image": img, "bbox": _FROM_LIVE}
    elif t == "Extract":
        args = {"image": img, "mask": _FROM_LIVE}
    elif step.clause == "Overlayer.object":
        args = {"base_image": live.base or img, "overlay_type": "object", "content": _FROM_LIVE, "position": pos}
    elif t == "Overlayer":
        content = _FROM_LIVE if step.clause == "Overlayer.ocr" else p["text"]
        args = {"base_image": img, "overlay_type": "text", "content": content, "position": pos}
    elif t == "Rotate":
        args = {"image": img, "angle": p["angle"]}
    else:  # Flip, OCR, SR
        args = {"image": img}
    for need in REGISTRY[t].needs(args):
        if args.get(need.arg) is _FROM_LIVE:
            value_of, missing = _LIVE_VALUES[need.kind]
            args[need.arg] = value_of(live)
            if not args[need.arg]:
                raise LookupError(missing)
    return {"name": t, "arguments": args}


class ChainPolicy(ScriptedPolicy):
    """Executes a plan one step per turn, then terminates with a summary reason."""

    def __init__(self, plan: Plan, phrasings: Phrasings, rng: random.Random):
        self.plan, self.phrasings, self.rng = plan, phrasings, rng
        self.missing: str | None = None  # a run-time value the next step needed and did not get
        super().__init__(self._act, name="canvascraft-chain")

    def _act(self, messages: list[dict[str, Any]], episode: Episode) -> str:
        turns = episode.trajectory.turns
        live = _live_state(episode, self.plan)
        fields: dict[str, Any] = {"boxes": _fmt_box(live.boxes[0]) if live.boxes else "", "read": live.read}
        if turns and turns[-1].status != "ok":
            return format_reply("The last step failed, so I stop here.", terminate=True)
        k = len(turns)
        if k < len(self.plan.steps):
            step = self.plan.steps[k]
            try:
                call = step_call(step, live)
            except LookupError as e:
                self.missing = str(e)
                return format_reply("A value the next step needs is missing, so I stop here.", terminate=True)
            fields.update(step.params, image=live.cur, mask=live.mask, cutout=live.cutout, base=live.base or live.cur)
            return format_reply(self.phrasings.reason(step.clause, self.rng, fields), call)
        last = self.plan.steps[-1]
        fields.update(last.params, final=episode.assets.last_produced().id if episode.assets.last_produced() else "img_1")
        key = {OutputKind.TEXT: "final_read", OutputKind.BOXES: "final_boxes"}.get(REGISTRY[last.tool].output, "final")
        return format_reply(self.phrasings.reason(key, self.rng, fields), terminate=True)


def quality_control(traj: Trajectory, plan: Plan, allow_plumbing: bool = False, policy_missing: str | None = None) -> list[str]:
    """Rejection reasons, most fundamental first (empty: keep). Reads only the trajectory."""
    reasons: list[str] = []
    known = set(traj.assets.input_ids())
    prev_call: tuple[str, str] | None = None
    for t in traj.turns:
        # Parsability: every reply parses cleanly, with no format finding at all.
        if t.findings or t.status in ("parse_error", "no_call"):
            reasons.append("unparsable")
        # Asset-reference consistency: the call's IDs and the IDs the reason mentions exist by then.
        if t.check and t.check.get("refs_found", 0) < t.check.get("refs_total", 0):
            reasons.append("asset_reference")
        if any(m not in known for m in _ASSET_RE.findall(t.reason or "")):
            reasons.append("asset_reference")
        # Parameter validity: no schema/spec issue, not even a non-blocking one.
        if t.check and (not t.check.get("schema_ok", True) or not t.check.get("spec_ok", True) or t.check.get("issues")):
            reasons.append("invalid_parameters")
        if t.status == "error":
            reasons.append("execution_failed")
        if t.call is not None:
            key = (t.call.name, json.dumps(t.call.arguments, sort_keys=True))
            if key == prev_call:
                reasons.append("redundant")
            prev_call = key
            if t.call.name == "Grounding" and t.status == "ok" and not boxes_of(t):
                reasons.append("no_detection")
        if t.output_id:
            out = traj.assets.get(t.output_id)
            src = [traj.assets.get(i) for i in out.provenance.inputs if i in traj.assets]
            # An output identical to its input is a no-op call: redundant supervision.
            if any(images_equal(out.image, s.image) for s in src[:1]):
                reasons.append("redundant")
        known.update(t.imglist)
    if policy_missing:
        reasons.append(policy_missing)
    if traj.stop_reason != "terminate":
        reasons.append("not_terminated")
    if traj.tool_sequence != list(plan.chain.tools):
        reasons.append("chain_incomplete")
    if traj.plumbing_only and not allow_plumbing:
        reasons.append("plumbing_only")
    if plan.expect_text is not None:
        reads = [ocr_text(t) for t in traj.turns if t.call is not None and t.call.name == "OCR" and t.status == "ok"]
        if reads and _norm(plan.expect_text) not in _norm(reads[-1]):
            reasons.append("ocr_mismatch")
    return list(dict.fromkeys(reasons))


def missing_backends(chain: Chain, toolbox: Any) -> list[str]:
    """Model-backed tools of `chain` this toolbox cannot run (remote toolboxes are trusted)."""
    backends = getattr(toolbox, "backends", None)
    if backends is None:
        return []
    return [t for t in dict.fromkeys(chain.tools) if REGISTRY[t].backend is Backend.MODEL and t not in backends]


@dataclass
class SftOutcome:
    kept: bool
    reasons: list[str]
    chain: Chain
    traj: Trajectory | None = None
    plan: Plan | None = None
    tone: str = ""


def draw(shares: dict[str, float], rng: random.Random) -> str:
    """A key of `shares`, drawn with the values as weights."""
    return rng.choices(list(shares), weights=list(shares.values()), k=1)[0]


def pick_inputs(chain: Chain, source: ImageSource, rng: random.Random, profile: Profile, sr_input_side: int = 0) -> list[SourceImage] | None:
    wants = {tag for tool, tag in (("Rotate", "rotated"), ("Flip", "mirrored")) if tool in chain.tools}
    if wants or "OCR" in chain.tools:
        wants.add("text")
    if hasattr(source, "rotations"):
        source.rotations = correctable_rotations(profile)
    out = []
    for k in range(chain.inputs):
        # The second image of a compositing chain is only a background.
        got = source.sample(rng, frozenset(chain.needs) if k == 0 else frozenset(), frozenset(wants) if k == 0 else frozenset())
        if got is None:
            return None
        if sr_input_side and "SR" in chain.tools and max(got.image.size) > sr_input_side:
            got.image = got.image.copy()
            got.image.thumbnail((sr_input_side, sr_input_side), Image.Resampling.LANCZOS)
            got.meta["downscaled_for_sr"] = sr_input_side
        out.append(got)
    return out


def build_one(
    chain: Chain,
    source: ImageSource,
    writer: Writer,
    phrasings: Phrasings,
    toolbox: Any,
    rng: random.Random,
    task_id: str,
    tone_mix: dict[str, float] | None = None,
    allow_plumbing: bool = False,
    max_turns: int = 12,
    sr_input_side: int = 0,
) -> SftOutcome:
    profile = getattr(toolbox, "profile", Profile.CANVASCRAFT)
    inputs = pick_inputs(chain, source, rng, profile, sr_input_side)
    if inputs is None:
        return SftOutcome(False, ["source_lacks_" + "_".join(chain.needs)], chain)
    plan = make_plan(chain, inputs, rng, profile)
    tone = draw(tone_mix or {"explicit": 0.5, "implicit": 0.5}, rng)
    if tone not in TONES:
        raise ValueError(f"unknown tone {tone!r}")
    task = Task(
        instruction=writer.write(plan, rng, tone),
        images=[i.image for i in inputs],
        id=task_id,
        expected_tools=list(chain.tools),
        meta={"chain": chain.name, "group": chain.group, "tone": tone, "writer": writer.name},
    )
    policy = ChainPolicy(plan, phrasings, rng)
    traj = run_episode(policy, task, toolbox, EpisodeConfig(max_turns=max(max_turns, len(chain.tools) + 1)))
    reasons = quality_control(traj, plan, allow_plumbing, policy.missing)
    return SftOutcome(not reasons, reasons, chain, traj, plan, tone)


def new_stats() -> dict[str, Any]:
    return {"slots": 0, "attempts": 0, "kept": 0, "rejected": {}, "skipped_no_backend": {}, "chains": {}, "groups": {}, "tones": {}, "turns": {}}


def bump(d: dict[str, int], key: Any, n: int = 1) -> None:
    d[str(key)] = d.get(str(key), 0) + n


def build_sft_shard(cfg: Any, job: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows and stats for slots [job.start, job.stop). Deterministic in (config, seed, slot)."""
    from canvascraft.context import context_for
    from canvascraft.formats import sft_row

    ctx = context_for(cfg)
    stats = new_stats()
    rows: list[dict[str, Any]] = []
    for slot in range(job.start, job.stop):
        stats["slots"] += 1
        task_id = f"sft-{job.seed}-{slot:06d}"
        for attempt in range(cfg.max_attempts):
            rng = random.Random(f"sft:{job.seed}:{slot}:{attempt}")
            out = None
            # Chains this toolbox or image source cannot serve are redrawn (counted), not QC attempts.
            for _ in range(cfg.max_skips):
                chain = ctx.chains.sample(rng)
                if missing_backends(chain, ctx.toolbox):
                    bump(stats["skipped_no_backend"], chain.name)
                    continue
                out = build_one(chain, ctx.source, ctx.writer, ctx.phrasings, ctx.toolbox, rng, task_id, cfg.tones, cfg.allow_plumbing, cfg.max_turns, cfg.sr_input_side)
                if out.reasons and out.reasons[0].startswith("source_lacks"):
                    bump(stats.setdefault("skipped_no_source_image", {}), chain.name)
                    out = None
                    continue
                break
            if out is None:
                break  # nothing in the mix can run here
            stats["attempts"] += 1
            if not out.kept:
                bump(stats["rejected"], out.reasons[0])
                continue
            assert out.traj is not None and out.plan is not None
            out.traj.meta.pop("policy", None)
            rows.append(sft_row(out.traj, [i.meta for i in out.plan.inputs], ctx.writer.name))
            stats["kept"] += 1
            bump(stats["chains"], out.chain.name)
            bump(stats["groups"], out.chain.group)
            bump(stats["tones"], out.tone)
            bump(stats["turns"], len(out.traj.turns))
            break
    return rows, stats
