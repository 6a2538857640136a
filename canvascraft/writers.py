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

from toolserver.config import find_config, load_yaml
from canvasagent.core.llm_client import ChatClient, ChatEndpoint, EndpointError
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
    """The template writer's vocabulary (configs/canvascraft/phrasings.yaml; the file states the
    grammar contract each entry must keep)."""

    openers: dict[str, list[str]]  # ask: followed by a verb phrase; lead: followed by any clause
    joiners: list[str]
    closers: list[str]
    clauses: dict[str, dict[str, list[str]]]  # clause key -> explicit | implicit | context -> entries
    reasons: dict[str, list[str]]
    questions: list[str] = field(default_factory=list)  # openers that make the request a question
    conditions: dict[str, list[str]] = field(default_factory=lambda: {"before": ["if {condition}, {clause}"], "after": ["{clause} if {condition}"]})
    two_inputs: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, name: str = "phrasings") -> Phrasings:
        d = load_yaml(find_config(name, "canvascraft"))
        return cls(d["openers"], d["joiners"], d["closers"], d["clauses"], d["reasons"], d.get("questions", []),
                   d.get("conditions") or {"before": ["if {condition}, {clause}"], "after": ["{clause} if {condition}"]},
                   d.get("two_inputs", []))

    def clause(self, step: Step, tone: str, rng: random.Random) -> str:
        """The step's request as an imperative verb phrase (its condition not attached)."""
        return fill(rng.choice(self.clauses[step.clause][tone]), step.params)

    def context(self, step: Step, rng: random.Random) -> str | None:
        options = self.clauses[step.clause].get("context") or []
        return fill(rng.choice(options), step.params) if options else None

    def reason(self, key: str, rng: random.Random, fields: dict[str, Any]) -> str:
        return fill(rng.choice(self.reasons[key]), fields)


class Writer(Protocol):
    name: str

    def write(self, plan: Plan, rng: random.Random, tone: str) -> str: ...


@dataclass
class TemplateWriter:
    """Builds `[context. ][opener]clause[, joiner clause]...[?|.][closer]` from the phrasings.

    Every clause is a verb phrase; a step's condition goes before it ("if C, do X") only where
    no `ask` opener precedes it, else after it ("do X if C"), so no opener ever runs into an
    "if". The implicit tone may open with a sentence stating the problem (a step's `context`).
    """

    phrasings: Phrasings = field(default_factory=Phrasings.load)
    name: str = "template"

    def write(self, plan: Plan, rng: random.Random, tone: str) -> str:
        p = self.phrasings
        steps = plan.steps
        clauses = [p.clause(s, tone, rng) for s in steps]
        conds = [s.params.get("condition") for s in steps]
        ask = bool(p.openers.get("ask")) and (not p.openers.get("lead") or rng.random() < 0.5)
        opener = rng.choice(p.openers["ask" if ask else "lead"])
        parts = []
        for i, (clause, cond) in enumerate(zip(clauses, conds)):
            if cond:
                form = "after" if (i == 0 and ask) or rng.random() < 0.5 else "before"
                clause = rng.choice(p.conditions[form]).format(condition=cond, clause=clause)
            parts.append(clause if i == 0 else rng.choice(p.joiners) + clause)
        body = opener + "".join(parts)
        end = "?" if ask and opener in p.questions else "."
        text = _capitalise(body.rstrip(" .?!,;:")) + end
        lead_in = []
        if len(plan.inputs) > 1 and p.two_inputs:
            lead_in.append(rng.choice(p.two_inputs))
        if tone == "implicit" and rng.random() < 0.5:
            # A conditioned step's problem is not a given, so only unconditioned steps state theirs.
            ctx = next((c for s, cond in zip(steps, conds) if not cond and (c := p.context(s, rng))), None)
            if ctx:
                lead_in.append(ctx)
        return " ".join([*lead_in, text]) + rng.choice(p.closers)


def _capitalise(text: str) -> str:
    return text[:1].upper() + text[1:]


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
