"""Turn a chain template and source images into an intended plan: one `Step` per tool.

The plan is what the paper's pipeline "reverse-engineers" an instruction from: which object to
ground, which text to add and where, which angle corrects the scene. It is decided before
execution, from what is known about the inputs; values that only exist at run time (the boxes
Grounding returns, the text OCR reads) are left to the executing policy (`canvascraft.sft`).
Which variant a step takes (a Crop of a found box, or without Grounding of a region the instruction
states by name or in 0-1000 coordinates; an overlay of a cut-out, of OCR's reading or of a caption)
follows from the kinds earlier steps produce (`ToolSpec.produces`; a ready RGBA cut-out as the
first input stands in for Extract), so a chain that `Chain.from_spec` accepts has every need met.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from canvascraft.chains import Chain
from canvascraft.sources import SIGN_WORDS, SourceImage
from toolserver.registry import REGISTRY, OutputKind
from toolserver.validation import Profile

POSITIONS: dict[str, tuple[int, int]] = {
    "top": (500, 120),
    "bottom": (500, 880),
    "center": (500, 500),
    "top-left corner": (220, 140),
    "top-right corner": (780, 140),
    "bottom-left corner": (220, 860),
    "bottom-right corner": (780, 860),
}
# Crop regions an instruction can name, as boxes in the tools' 0-1000 coordinates.
REGIONS: dict[str, tuple[int, int, int, int]] = {
    "left half": (0, 0, 500, 1000),
    "right half": (500, 0, 1000, 1000),
    "top half": (0, 0, 1000, 500),
    "bottom half": (0, 500, 1000, 1000),
    "top-left quarter": (0, 0, 500, 500),
    "top-right quarter": (500, 0, 1000, 500),
    "bottom-left quarter": (0, 500, 500, 1000),
    "bottom-right quarter": (500, 500, 1000, 1000),
    "central area": (250, 250, 750, 750),
}
# Share of stated-region crops that give explicit coordinates rather than a named region.
EXPLICIT_BOX_SHARE = 0.3
CAPTIONS = (
    "SUMMER SALE", "Grand Opening", "Happy Birthday", "Best Coffee", "Limited Offer",
    "Welcome Home", "Open 24/7", "Hello World", "New Arrival", "Thank You",
)
EDITS = (
    "make it look like a watercolor painting",
    "change the background to a snowy landscape",
    "make the lighting warmer, like at sunset",
    "turn the {target} bright blue",
    "remove the {target}",
    "add a small red hat on top of the {target}",
    "give the whole picture a vintage film look",
)
GEN_SUBJECTS = (
    ("a red apple on a wooden table", ["red apple", "table"]),
    ("a cat sitting on a windowsill at sunset", ["cat", "window"]),
    ("a lighthouse on a rocky coast", ["lighthouse"]),
    ("a bicycle leaning against a blue wall", ["bicycle"]),
    ("a bowl of oranges in a bright kitchen", ["bowl", "orange"]),
)


def correction_angle(rotation_ccw: int, profile: Profile) -> int:
    """The Rotate `angle` that undoes a scene turned `rotation_ccw` degrees counter-clockwise.

    The public tools (canvascraft profile) rotate counter-clockwise; the exact profile rotates
    clockwise as the schema text says. The answer is always one of the allowed 45/90/180.
    """
    return (360 - rotation_ccw) % 360 if profile is Profile.CANVASCRAFT else rotation_ccw % 360


def correctable_rotations(profile: Profile) -> tuple[int, ...]:
    """Scene rotations (CCW) that a single Rotate call can undo under `profile`."""
    return tuple(correction_angle(a, profile) for a in (45, 90, 180))


@dataclass
class Step:
    tool: str
    clause: str  # phrasing key in configs/canvascraft/phrasings.yaml, e.g. "Rotate.fix"
    params: dict[str, Any] = field(default_factory=dict)  # JSON-safe


@dataclass
class Plan:
    chain: Chain
    steps: list[Step]
    inputs: list[SourceImage]
    # Text OCR should read, when the plan guarantees it is upright and unedited at that point.
    expect_text: str | None = None


@dataclass
class _State:
    labels: list[str]
    text: str | None
    rotation: int = 0
    mirrored: bool = False
    edited: bool = False
    cropped_to: str | None = None
    grounded: str | None = None  # the target the last Grounding looked for
    # Kinds the next step can use: the registry's `produces` of earlier steps, a ready cut-out.
    have: set[OutputKind] = field(default_factory=set)
    cutout: str | None = None  # label of a ready cut-out given as the first input (RGBA)
    used: list[str] = field(default_factory=list)  # targets, captions, positions already used


def make_plan(chain: Chain, inputs: list[SourceImage], rng: random.Random, profile: Profile) -> Plan:
    first = inputs[0].meta if inputs else {}
    st = _State(
        labels=[lbl for lbl in (inputs[0].labels if inputs else [])] or ["main subject"],
        text=first.get("text"),
        rotation=int(first.get("rotation") or 0),
        mirrored=bool(first.get("mirrored")),
    )
    if first.get("cutout"):
        # The first input already is what Extract would produce: an object overlay can use it.
        st.cutout = st.labels[0]
        st.have.add(OutputKind.RGBA)
    steps: list[Step] = []
    expect: str | None = None
    for i, tool in enumerate(chain.tools):
        later = chain.tools[i + 1 :]
        if tool == "ImageGeneration":
            if "OCR" in later:
                word = rng.choice(SIGN_WORDS)
                prompt, labels = f"a shop front with a large sign that reads '{word}'", ["sign", "shop front"]
                st.text = word
            else:
                prompt, labels = rng.choice(GEN_SUBJECTS)
            st.labels = list(labels)
            steps.append(Step(tool, "ImageGeneration", {"prompt": prompt}))
        elif tool == "ImageEdit":
            target = _target(st, rng)
            edit = rng.choice(EDITS).format(target=target)
            st.edited = True
            steps.append(Step(tool, "ImageEdit", {"edit_prompt": edit, "target": target}))
        elif tool == "Grounding":
            # Ground the sign when text work follows, so OCR/Crop act on it; else any object.
            if "sign" in st.labels and any(t in ("OCR", "Crop") for t in later):
                target = "sign"
            else:
                target = _target(st, rng)
            st.grounded = target
            steps.append(Step(tool, "Grounding", {"target": target}))
        elif tool == "Crop":
            if OutputKind.BOXES in st.have:
                st.cropped_to = st.grounded
                steps.append(Step(tool, "Crop", {"target": st.grounded}))
            else:
                # No box to come from Grounding: the instruction states the region itself.
                st.cropped_to = "region"
                steps.append(Step(tool, "Crop.region", _region(rng)))
        elif tool in ("SAM", "Extract"):
            steps.append(Step(tool, tool, {"target": st.grounded or _target(st, rng)}))
        elif tool == "Overlayer":
            pos_name = _fresh(list(POSITIONS), st, rng)
            params: dict[str, Any] = {"position_name": pos_name, "position": list(POSITIONS[pos_name])}
            if OutputKind.RGBA in st.have:
                params["target"] = st.grounded or st.cutout or "object"
                steps.append(Step(tool, "Overlayer.object", params))
            elif OutputKind.TEXT in st.have:
                steps.append(Step(tool, "Overlayer.ocr", params))  # the text comes from the OCR reply
            else:
                params["text"] = _fresh(CAPTIONS, st, rng)
                steps.append(Step(tool, "Overlayer.text", params))
        elif tool == "OCR":
            upright = st.rotation == 0 and not st.mirrored
            if upright and st.text and not st.edited and st.cropped_to in (None, "sign"):
                expect = st.text
            steps.append(Step(tool, "OCR", {"upright": upright}))
        elif tool == "Rotate":
            if st.rotation:
                steps.append(Step(tool, "Rotate.fix", {"angle": correction_angle(st.rotation, profile)}))
                st.rotation = 0
            else:
                steps.append(Step(tool, "Rotate.by", {"angle": rng.choice((90, 180, 45))}))
        elif tool == "Flip":
            steps.append(Step(tool, "Flip.fix" if st.mirrored else "Flip.mirror", {}))
            st.mirrored = False
        elif tool == "SR":
            steps.append(Step(tool, "SR", {}))
        else:  # pragma: no cover - chains are validated against the registry
            raise ValueError(f"no planner for tool {tool}")
        st.have.update(REGISTRY[tool].produces)
    return Plan(chain, steps, inputs, expect)


def _region(rng: random.Random) -> dict[str, Any]:
    """Params of a Crop whose region the instruction states: a named region or, sometimes,
    explicit 0-1000 coordinates. `target` is the phrase the clause says, `bbox` the call's box."""
    if rng.random() < EXPLICIT_BOX_SHARE:
        x0, y0 = rng.randrange(0, 500, 10), rng.randrange(0, 500, 10)
        x1, y1 = rng.randrange(x0 + 300, 1001, 10), rng.randrange(y0 + 300, 1001, 10)
        box = [x0, y0, x1, y1]
        return {"target": "area [" + ", ".join(map(str, box)) + "] (coordinates from 0 to 1000)", "bbox": box}
    name = rng.choice(list(REGIONS))
    return {"target": name, "bbox": list(REGIONS[name])}


def _fresh(options: list[str] | tuple[str, ...], st: _State, rng: random.Random) -> str:
    """A random option among the least used so far, so repeated steps address new things."""
    least = min(st.used.count(o) for o in options)
    pick = rng.choice([o for o in options if st.used.count(o) == least])
    st.used.append(pick)
    return pick


def _target(st: _State, rng: random.Random) -> str:
    return _fresh([lbl for lbl in st.labels if lbl != "sign"] or st.labels, st, rng)
