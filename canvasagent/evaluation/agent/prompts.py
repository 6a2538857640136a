"""Prompt writers: turn a sub-aspect into a few probes (prompts plus verifiable checks).

`TemplatePromptWriter` takes probes from the aspect list (for a sub-aspect not in the list, from
the closest aspect by keyword overlap). `OpenAIPromptWriter` asks a chat model to write probes
and keeps only checks the alignment judge knows; if nothing usable comes back it uses the
templates.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from canvasagent.evaluation.agent.planner import parse_json_object
from canvasagent.evaluation.agent.types import Aspect, Probe

log = logging.getLogger(__name__)

CHECK_TYPES = ("reference_similarity", "ocr_contains", "size_relation", "orientation", "asset_kind", "grounding_finds", "differs_from")
_WORD = re.compile(r"[a-z]+")


class TemplatePromptWriter:
    name = "template"

    def __init__(self, aspects: list[Aspect], per_round: int = 3):
        self.aspects = aspects
        self.per_round = per_round

    def aspect_for(self, sub_aspect: str) -> Aspect | None:
        for a in self.aspects:
            if a.name.lower() == sub_aspect.strip().lower():
                return a
        words = set(_WORD.findall(sub_aspect.lower()))
        best = max(self.aspects, key=lambda a: len(words & (set(a.keywords) | set(_WORD.findall(a.name.lower())))), default=None)
        if best is not None and words & (set(best.keywords) | set(_WORD.findall(best.name.lower()))):
            return best
        return None

    def write(self, question: str, sub_aspect: str, round_index: int) -> list[Probe]:
        aspect = self.aspect_for(sub_aspect)
        if aspect is None or not aspect.probes:
            return [Probe(prompt=sub_aspect, image={"size": [256, 256], "color": [255, 255, 255]})]
        return list(aspect.probes[: self.per_round])


class OpenAIPromptWriter:
    name = "openai"
    SYSTEM = (
        "You are the PromptGen Agent of an evaluation agent. For the given sub-aspect, write prompts that "
        "probe it, each with verifiable checks the judge can run on the output. Check types: "
        + ", ".join(CHECK_TYPES)
        + ' (e.g. {"type": "ocr_contains", "text": "SALE"}, {"type": "orientation", "orientation": "portrait"}). '
        'Answer with JSON only: {"probes": [{"prompt": "...", "checks": [...]}]}.'
    )

    def __init__(self, client: Any, fallback: TemplatePromptWriter):
        self.client = client
        self.fallback = fallback

    def write(self, question: str, sub_aspect: str, round_index: int) -> list[Probe]:
        n = self.fallback.per_round
        user = f"Question: {question}\nSub-aspect: {sub_aspect}\nWrite {n} probes."
        try:
            obj = parse_json_object(self.client.complete([{"role": "system", "content": self.SYSTEM}, {"role": "user", "content": user}]))
        except Exception as e:
            log.warning("prompt writer endpoint failed (%s); using templates", e)
            obj = None
        probes: list[Probe] = []
        for p in (obj or {}).get("probes", []) if isinstance((obj or {}).get("probes"), list) else []:
            if not isinstance(p, dict) or not str(p.get("prompt", "")).strip():
                continue
            checks = [c for c in p.get("checks") or [] if isinstance(c, dict) and c.get("type") in CHECK_TYPES]
            template = self.fallback.aspect_for(sub_aspect)
            image = template.probes[0].image if template and template.probes else {"size": [256, 256], "color": [255, 255, 255]}
            probes.append(Probe(prompt=str(p["prompt"]).strip(), checks=checks, image=image))
        if not probes:
            log.warning("prompt writer gave no usable probe for %r; using templates", sub_aspect)
            return self.fallback.write(question, sub_aspect, round_index)
        return probes[:n]


def probe_json(p: Probe) -> str:
    return json.dumps({"prompt": p.prompt, "checks": p.checks}, ensure_ascii=False)
