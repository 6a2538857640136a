"""Our judge prompts, shared by the HTTP and local VLM judges.

Each prompt asks for one JSON object `{"score": <integer 0-N>, "reason": "<one sentence>"}`
(N = 10 by default); `rewards.judges.base.parse_score` reads it and divides by N. The rubrics follow the paper's
descriptions of R_align, R_aes and R_traj (section 3.3) and are deliberately short: the judge
sees the evidence, not a wall of rules.
"""

from __future__ import annotations

import json
from typing import Any

from PIL import Image

# system_prompt has a rubric for every judged aspect.
from rewards.judges.base import ASPECTS as ASPECTS_WITH_PROMPTS, TrajectoryView

PROMPT_VERSION = "v2"
SCALE = 10.0

def output_instruction(scale: int = 10) -> str:
    return f'Answer with one JSON object and nothing else: {{"score": <integer 0-{scale}>, "reason": "<one sentence>"}}.'


def system_prompt(aspect: str, scale: int = 10) -> str:
    """The system prompt of `aspect`, with rubric anchors on a 0-`scale` integer scale. The HTTP
    judge uses 0-10; the local judge's logits mode reads one digit token, so it asks for 0-9
    (a "10" would start with the token "1")."""
    top, good, part, poor = scale, round(0.7 * scale), round(0.4 * scale), max(1, round(0.1 * scale))
    rubric = {
        "alignment": (
            "You grade image-editing and image-generation results. Judge ONLY whether the final image "
            "satisfies the user's instruction: requested objects, attributes, actions, spatial relations, "
            "colours, text, quantities, and the edited regions (untouched regions should be preserved). "
            f"Ignore how pretty the image is. {top} = every requirement met; {good} = main requirements met with "
            f"minor misses; {part} = partly done, important requirements missing or wrong; {poor} = barely related; "
            "0 = no image or unrelated. If unsure between two scores, choose the lower. "
        ),
        "aesthetic": (
            "You grade the visual quality of one image, independent of any instruction: composition, colour, "
            "lighting, clarity, texture naturalness, style consistency; penalise artefacts, blur, seams, "
            f"pasted-looking objects and broken text. {top} = polished, no visible flaw; {good} = appealing with "
            f"minor flaws; {part} = clearly noticeable defects; {poor} = severely degraded; 0 = broken or empty. "
        ),
        "trajectory": (
            "You grade the process of a visual tool-use agent, not its final image. Judge whether it decomposes "
            "the task sensibly, selects appropriate tools (compare with the expected tool set), respects tool "
            "dependencies (Grounding -> SAM -> Extract; ImageGeneration first when there is no input image; "
            "object overlays use an extracted cut-out), uses valid image IDs, reacts to tool errors, and avoids "
            f"irrelevant, repeated or unnecessary calls. {top} = complete, valid and efficient; {good} = reasonable "
            f"with small gaps; {part} = key steps missing or clear defects; {poor} = mostly incoherent; 0 = no "
            "meaningful process. "
        ),
    }[aspect]
    return rubric + output_instruction(scale)


def user_content(aspect: str, view: TrajectoryView, scale: int = 10) -> list[tuple[str, Any]]:
    """The user turn as ("text", str) / ("image", PIL) parts; each judge renders them its way."""
    parts: list[tuple[str, Any]] = []
    if aspect == "alignment":
        parts.append(("text", f"Instruction:\n{view.instruction}"))
        for i, img in enumerate(view.inputs, start=1):
            parts += [("text", f"Input image img_{i}:"), ("image", img)]
        if view.final is not None:
            parts += [("text", f"Final image ({view.final_id}):"), ("image", view.final)]
        else:
            parts.append(("text", "The agent produced no final image."))
    elif aspect == "aesthetic":
        if view.final is not None:
            parts += [("text", "Image to grade:"), ("image", view.final)]
        else:
            parts.append(("text", "There is no image to grade."))
    else:
        parts.append(("text", f"Instruction:\n{view.instruction}"))
        parts.append(("text", f"Input images: {len(view.inputs)}"))
        parts.append(("text", f"Expected tool set (order not mandatory): {json.dumps(view.expected_tools)}"))
        calls = [c.to_dict() for c in view.calls]
        parts.append(("text", f"Parsed tool calls ({len(calls)}):\n{json.dumps(calls, ensure_ascii=False, default=str)[:4000]}"))
        parts.append(("text", f"Episode ended by: {view.trajectory.stop_reason}"))
        parts.append(("text", f"Transcript:\n{view.transcript(6000)}"))
    parts.append(("text", output_instruction(scale)))
    return parts


def downscale(img: Image.Image, side: int) -> Image.Image:
    if img.mode not in ("RGB", "L"):
        img = img.convert("RGBA").convert("RGB") if img.mode in ("RGBA", "LA", "P") else img.convert("RGB")
    if max(img.size) > side > 0:
        img = img.copy()
        img.thumbnail((side, side), Image.Resampling.BICUBIC)
    return img
