"""Parse an evaluation question against the tool registry's vocabulary into a `Plan`.

The target comes from `--target` (a registry tool name or a policy spec); the property from the
tool (OCR reads text, Flip mirrors, …) or, for a policy, from the registry words the question
uses (tool names, argument names such as `angle`, `bbox`, `position`, `content`) and their
everyday synonyms. Conditions are read from the question: text height (`8 px`, `small`), rotation
(`30 degrees`, `rotated`, `upside down`), contrast (`low-contrast`), colour (`black text on navy`,
`dark backgrounds`), scale (`4x`) and direction (`horizontal`, `clockwise`). The qualitative
words map to ranges set in the config (`configs/eval_agent/*.yaml`, `terms`).

Anything the parser cannot map is refused with a reason (`Plan.unsupported`), never guessed.
"""

from __future__ import annotations

import re
from typing import Any

from canvasagent.evaluation.agent.probes import COLOURS, SUITES
from canvasagent.evaluation.agent.types import Plan
from toolserver.registry import REGISTRY, ArgType, tool_names

GENERATORS = ("ImageGeneration", "ImageEdit")

# Everyday words for what a tool does, so a question to a policy can name the property.
PROPERTY_WORDS: dict[str, tuple[str, ...]] = {
    "mirror": ("mirror", "mirrors", "mirroring", "flip", "flips", "flipping", "flipped"),
    "rotation": ("rotate", "rotates", "rotating", "rotation", "turn", "turns", "angle"),
    "crop_region": ("crop", "crops", "cropping", "bbox", "region", "cut out"),
    "overlay_text": ("overlay", "overlayer", "write", "writes", "add text", "caption", "label", "content", "position"),
    "upscale": ("upscale", "upscales", "upscaling", "super-resolution", "super resolution", "enlarge"),
    "legibility": ("read", "reads", "ocr", "recognise", "recognize", "transcribe"),
    "grounding": ("locate", "locates", "find", "finds", "detect", "grounding", "reference_text"),
}
PROPERTY_TOOL = {"mirror": "Flip", "rotation": "Rotate", "rotation_content": "Rotate", "crop_region": "Crop",
                 "overlay_text": "Overlayer", "upscale": "SR", "legibility": "OCR", "grounding": "Grounding",
                 "generation_text": "ImageGeneration"}
TOOL_PROPERTY = {"OCR": "legibility", "Overlayer": "overlay_text", "Flip": "mirror", "Rotate": "rotation",
                 "Crop": "crop_region", "SR": "upscale", "Grounding": "grounding", "ImageGeneration": "generation_text"}
CONTENT_WORDS = ("whole", "entire", "full", "content", "corners", "cut off", "cuts off", "lossless", "keep the", "keeps the", "size", "dimensions")

_NUM = r"(\d+(?:\.\d+)?)"
_PX = re.compile(_NUM + r"\s*(?:-|to|–)?\s*(?:" + _NUM + r"\s*)?(?:px|pixels?)\b")
_DEG = re.compile(_NUM + r"\s*(?:°|deg\b|degrees?\b)")
_SCALE = re.compile(r"\b(\d+)\s*(?:x|×)(?![a-z])")
_POS = re.compile(r"\[\s*(\d{1,4})\s*,\s*(\d{1,4})\s*\]")
_TEXT_ON = re.compile(r"\b([a-z]+)\s+(?:text|letters|words?)\s+on\s+(?:an?\s+|the\s+)?([a-z]+)")
_ON_BG = re.compile(r"\bon\s+(?:an?\s+|the\s+)?([a-z]+)(?:[\s-]+(?:coloured|colored))?\s+backgrounds?")


def _has(q: str, words: tuple[str, ...]) -> bool:
    return any(re.search(r"(?<![a-z])" + re.escape(w) + r"(?![a-z])", q) for w in words)


def target_kind(target: str) -> tuple[str, str | None]:
    """`(kind, tool)`: a registry tool (`tool` / `generator`) or a policy spec (`policy`, None)."""
    if target in REGISTRY:
        return ("generator" if target in GENERATORS else "tool"), target
    return "policy", None


def mentioned_tools(question: str) -> list[str]:
    q = question.lower()
    return [t for t in tool_names() if re.search(r"(?<![a-z])" + t.lower() + r"(?![a-z])", q)]


def property_for(question: str, tool: str | None) -> tuple[str | None, str | None]:
    """`(property, reason_if_none)`."""
    q = question.lower()
    if tool is not None:
        others = [t for t in mentioned_tools(question) if t != tool]
        if others and tool not in mentioned_tools(question):
            return None, f"the question names {', '.join(others)} but the target is {tool}"
        prop = TOOL_PROPERTY.get(tool)
        if prop is None:
            return None, f"no probe generator measures {tool} (known: {', '.join(sorted(TOOL_PROPERTY))})"
    elif named := [TOOL_PROPERTY[t] for t in mentioned_tools(question) if t in TOOL_PROPERTY]:
        prop = named[0]
    else:
        scores = {p: sum(_has(q, (w,)) for w in ws) for p, ws in PROPERTY_WORDS.items()}
        best = max(scores, key=lambda p: scores[p])
        if scores[best] == 0:
            return None, "the question names no property a probe can measure (mirror, rotate, crop, text, upscale, …)"
        prop = best
    if prop == "rotation" and _has(q, CONTENT_WORDS):
        prop = "rotation_content"
    return prop, None


def parse_question(question: str, target: str, cfg: dict[str, Any]) -> Plan:
    """The offline planner's reading of a question (see the module docstring)."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError("the question is empty")
    q = " ".join(question.lower().split())
    kind, tool = target_kind(target)
    prop, why = property_for(q, tool)
    plan = Plan(target=target, target_kind=kind, tool=tool, property=prop)
    if prop is None:
        plan.unsupported = why
        plan.thought = f"The question asks nothing a probe of {target} can measure: {why}."
        return plan
    plan.tool = tool or PROPERTY_TOOL[prop]
    terms = cfg.get("terms", {})
    notes: list[str] = []

    cond: dict[str, Any] = {}
    m = _PX.search(q)
    px_range = None
    if m:
        a = float(m.group(1))
        b = float(m.group(2)) if m.group(2) else a
        px_range = [min(a, b), max(a, b)]
    deg = _DEG.search(q)
    rot_terms: dict[str, float] = terms.get("rotation", {})
    rotation = float(deg.group(1)) if deg else next((float(v) for k, v in rot_terms.items() if _has(q, (k,))), None)
    fg = bg = None
    m = _TEXT_ON.search(q)
    if m and COLOURS.get(m.group(1)) and COLOURS.get(m.group(2)):
        fg, bg = COLOURS[m.group(1)], COLOURS[m.group(2)]
    else:
        m = _ON_BG.search(q)
        if m and COLOURS.get(m.group(1)):
            bg = COLOURS[m.group(1)]
    dark_many = bool(re.search(r"\bdark(?:[\s-]+coloured|[\s-]+colored)?\s+backgrounds\b", q))
    direction = None
    if _has(q, ("counter-clockwise", "counterclockwise", "anticlockwise", "anti-clockwise")):
        direction = "counter-clockwise"
    elif _has(q, ("clockwise",)):
        direction = "clockwise"
    elif _has(q, ("vertical", "vertically", "upside-down", "top to bottom", "top-to-bottom")):
        direction = "vertical"
    elif _has(q, ("horizontal", "horizontally", "left to right", "left-right", "left-to-right")):
        direction = "horizontal"
    scale = _SCALE.search(q)
    pos = _POS.search(q)

    if prop == "legibility":
        if rotation is not None:
            cond["rotation"] = rotation
        if fg is not None:
            cond["fg"] = list(fg)
        if bg is not None:
            cond["bg"] = list(bg)
        low_contrast = _has(q, ("contrast", "low-contrast", "faint", "washed out", "washed-out"))
        boundary_q = _has(q, ("how small", "smallest", "minimum", "how low", "lowest", "at what"))
        if low_contrast and px_range is None:
            plan.axis = "contrast"
            cond["text_height"] = float(terms.get("contrast_text_height", 16))
            term = next((k for k in terms.get("contrast", {}) if k != "default" and _has(q, (k,))), "default")
            plan.asked = None if boundary_q else list(terms.get("contrast", {}).get(term, [32, 255]))
            notes.append(f"contrast as a luminance difference from the background ('{term}' = {plan.asked} grey levels)")
        else:
            plan.axis = "text_height"
            if px_range is not None:
                plan.asked = px_range
            else:
                sizes = terms.get("text_height", {})
                term = next((k for k in sizes if k != "default" and _has(q, (k,))), "default")
                plan.asked = None if boundary_q else list(sizes.get(term, [8, 32]))
                notes.append(f"text height '{term}' = {plan.asked} px" if plan.asked else "the smallest readable text height")
        if rotation is not None:
            notes.append(f"rotated {rotation:g} degrees")
    elif prop == "overlay_text":
        if pos:
            cond["position"] = [int(pos.group(1)), int(pos.group(2))]
        if dark_many:
            plan.strata = [{"bg": list(c)} for c in cfg.get("dark_backgrounds", [[20, 24, 60], [30, 30, 36], [60, 20, 20]])]
            notes.append("dark backgrounds")
        elif bg is not None:
            cond["bg"] = list(bg)
            notes.append(f"background {list(bg)}")
    elif prop == "mirror":
        cond["direction"] = "vertical" if direction == "vertical" else "horizontal"
        notes.append(f"{cond['direction']} mirror")
    elif prop in ("rotation", "rotation_content"):
        choices = [int(c) for c in REGISTRY["Rotate"].arg("angle").choices]  # type: ignore[union-attr]
        if deg and int(float(deg.group(1))) in choices:
            cond["angle"] = int(float(deg.group(1)))
        elif deg:
            plan.unsupported = f"Rotate's angle is one of {choices}; {deg.group(1)} degrees cannot be asked for"
        else:
            # a half turn looks the same either way, so it cannot tell the direction apart
            angles = [a for a in choices if a != 180] if prop == "rotation" else choices
            plan.strata = [{"angle": a} for a in angles]
            if len(angles) < len(choices):
                notes.append("180 is left out: a half turn is the same in both directions")
        cond["direction"] = direction if direction in ("clockwise", "counter-clockwise") else "clockwise"
        if prop == "rotation_content":
            cond.pop("direction")
            notes.append("non-square images, turned either way, must keep all their pixels" + (f", at {cond['angle']}" if "angle" in cond else f", at each of {choices}"))
        else:
            notes.append(f"{cond['direction']} turns" + (f" by {cond['angle']}" if "angle" in cond else f" by each of {plan.strata and [s['angle'] for s in plan.strata]}"))
    elif prop == "upscale":
        cond["scale"] = int(scale.group(1)) if scale else 4
        if _has(q, ("bicubic", "detail", "details", "sharper", "better than", "fidelity")):
            plan.settings["vs_bicubic"] = True
            # smooth photographs and sharp-edged graphics favour different upscalers: probe both
            plan.strata = [{"scene": "natural"}, {"scene": "asymmetric"}]
            notes.append("compared with bicubic upscaling, on natural scenes and on sharp-edged shapes")
        notes.append(f"scale {cond['scale']}x")
    plan.conditions = cond
    what = SUITES[prop].description
    plan.thought = (f"The question asks about the {prop} of {target}: pass means {what}" + (f", under: {'; '.join(notes)}" if notes else "") + "."
                    + (f" I search {plan.axis} for the boundary." if plan.axis else ""))
    return plan


def vocabulary() -> dict[str, Any]:
    """The words the planners may use: tools with their argument names, properties, conditions."""
    return {
        "tools": {t: [a.name for a in REGISTRY[t].args if a.type is not ArgType.ASSET] for t in tool_names()},
        "properties": {k: s.description for k, s in SUITES.items()},
        "axes": sorted({a for s in SUITES.values() for a in s.axes}),
        "conditions": ["text_height", "rotation", "contrast", "fg", "bg", "scale", "direction", "angle", "position"],
    }
