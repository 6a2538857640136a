"""Instruction writers: offline templates, or an LLM behind any OpenAI-compatible endpoint.

Both work from the plan (the intended chain and its parameters), which is how the paper
reverse-engineers a natural user request from the tool-use behaviour it wants to teach. The
phrasings (and the SFT step reasons) live in configs/canvascraft/phrasings.yaml.
"""

from __future__ import annotations

import json
import logging
import os
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from canvasagent.llm_client import ChatClient, ChatEndpoint, EndpointError

from canvasagent.config import find_config, load_yaml
from canvascraft.plan import Plan, Step

log = logging.getLogger(__name__)

TONES = ("explicit", "implicit")


class _Blank(dict):
    """str.format_map helper: a placeholder with no value renders as a neutral word."""

    def __missing__(self, key: str) -> str:
        return {"target": "object", "text": "text", "read": "the text"}.get(key, key)


def fill(template: str, fields: dict[str, Any]) -> str:
    return template.format_map(_Blank({k: v for k, v in fields.items() if v is not None}))


@dataclass
class Phrasings:
    openers: dict[str, list[str]]
    joiners: list[str]
    closers: list[str]
    clauses: dict[str, dict[str, list[str]]]
    reasons: dict[str, list[str]]

    @classmethod
    def load(cls, name: str = "phrasings") -> "Phrasings":
        d = load_yaml(find_config(name, "canvascraft"))
        return cls(d["openers"], d["joiners"], d["closers"], d["clauses"], d["reasons"])

    def clause(self, step: Step, tone: str, rng: random.Random) -> str:
        options = self.clauses[step.clause][tone]
        text = fill(rng.choice(options), step.params)
        cond = step.params.get("condition")
        return f"if {cond}, {text}" if cond else text

    def reason(self, key: str, rng: random.Random, fields: dict[str, Any]) -> str:
        return fill(rng.choice(self.reasons[key]), fields)


class Writer(Protocol):
    name: str

    def write(self, plan: Plan, rng: random.Random, tone: str) -> str: ...


@dataclass
class TemplateWriter:
    phrasings: Phrasings = field(default_factory=Phrasings.load)
    name: str = "template"

    def write(self, plan: Plan, rng: random.Random, tone: str) -> str:
        p = self.phrasings
        clauses = [p.clause(s, tone, rng) for s in plan.steps]
        clauses = [c.rstrip("?") for c in clauses[:-1]] + clauses[-1:]  # a question mark only at the end
        body = clauses[0]
        for c in clauses[1:]:
            body += rng.choice(p.joiners) + c
        opener = rng.choice(p.openers[tone])
        text = opener + body if opener else body[:1].upper() + body[1:]
        if len(plan.inputs) > 1:
            text = "Using the first image as the source and the second as the background: " + text[:1].lower() + text[1:]
        end = "?" if opener.strip().startswith("Could") or text.rstrip().endswith("?") else "."
        text = text.rstrip(".?!") + end
        return text + rng.choice(p.closers)


_SYSTEM = (
    "You write the user request for an image-editing agent's training data. You are given the tool "
    "chain the agent will execute and its parameters. Write ONE natural request a real user could "
    "have sent that this chain solves. {tone_rule} Do not mention tool names, asset IDs or "
    "coordinates. Reply with the request only."
)
_TONE_RULE = {
    "explicit": "Be explicit: ask for each operation plainly, in order.",
    "implicit": "Be implicit: describe the goal or the problem, and let the agent work out the operations.",
}


@dataclass
class LLMWriter:
    """Asks an OpenAI-compatible chat endpoint; falls back to the template writer on any failure."""

    base_url: str
    model: str = "gpt-4o-mini"
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 30.0
    max_retries: int = 1
    temperature: float = 0.7
    fallback: TemplateWriter = field(default_factory=TemplateWriter)
    name: str = "llm"
    failures: int = 0

    def _messages(self, plan: Plan, tone: str) -> list[dict[str, str]]:
        spec = {
            "tools": [s.tool for s in plan.steps],
            "steps": [{"tool": s.tool, **{k: v for k, v in s.params.items() if k not in ("position",)}} for s in plan.steps],
            "n_input_images": len(plan.inputs),
            "input_description": [i.meta.get("caption", "") for i in plan.inputs],
        }
        return [
            {"role": "system", "content": _SYSTEM.format(tone_rule=_TONE_RULE[tone])},
            {"role": "user", "content": json.dumps(spec, ensure_ascii=False)},
        ]

    def write(self, plan: Plan, rng: random.Random, tone: str) -> str:
        endpoint = ChatEndpoint(self.base_url, self.model, self.api_key_env, timeout_s=self.timeout_s, max_retries=self.max_retries)
        seed = rng.randrange(2**31)  # honoured by servers that support it, for reproducibility
        try:
            with httpx.Client(timeout=self.timeout_s) as http:
                text = ChatClient(endpoint, http).complete(self._messages(plan, tone), temperature=self.temperature, seed=seed).strip()
            if not text:
                raise ValueError("empty completion")
            return text
        except (EndpointError, ValueError) as e:
            self.failures += 1
            log.warning("LLM writer failed (%s); using the template writer for this instruction", e)
            return self.fallback.write(plan, rng, tone)


def make_writer(kind: str, llm: dict[str, Any] | None = None) -> Writer:
    if kind == "template":
        return TemplateWriter()
    if kind == "llm":
        cfg = dict(llm or {})
        cfg.setdefault("base_url", os.environ.get("CANVASCRAFT_LLM_URL", "http://127.0.0.1:8000/v1"))
        return LLMWriter(**cfg)
    raise ValueError(f"unknown writer {kind!r} (template | llm)")
