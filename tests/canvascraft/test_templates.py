"""Template instructions: every phrasing entry renders grammatically with its slots filled, and
the writer varies enough that 500 rows are at least 90 % distinct."""

from __future__ import annotations

import dataclasses
import random
import re
import string

import pytest

from canvascraft.chains import Chain, ChainSet
from canvascraft.plan import Plan, Step, make_plan
from canvascraft.rl import CONDITIONS, add_conditions
from canvascraft.sft import pick_inputs
from canvascraft.sources import ProceduralSource, make_source
from canvascraft.writers import TONES, Phrasings, TemplateWriter
from toolserver.validation import Profile

PHRASINGS = Phrasings.load()
# Every slot a clause may use, filled with a value shaped like what the planner puts there.
SLOTS = {"target": "red apple", "text": "Grand Opening", "angle": 90, "position_name": "top-left corner",
         "edit_prompt": "turn the red apple bright blue", "prompt": "a lighthouse on a rocky coast"}
KNOWN_SLOTS = set(SLOTS) | {"condition", "clause"}
_TWO = [ProceduralSource(64).sample(random.Random(i), frozenset(), frozenset()) for i in range(2)]


def slots_of(template: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(template) if f}


def grammar_problems(text: str, phrasings: Phrasings = PHRASINGS) -> list[str]:
    """Grammar-ish invariants of a finished instruction (empty list: none broken)."""
    bad = []
    if re.search(r"[{}]", text):
        bad.append("unfilled slot")
    if "  " in text:
        bad.append("double space")
    if not text[:1].isupper():
        bad.append("not capitalised")
    if text[-1:] not in ".?!":
        bad.append("no final punctuation")
    if re.search(r"\bto (only )?if\b", text):
        bad.append("'to if'")
    for opener in phrasings.openers["ask"]:
        if re.search(re.escape(opener.strip()) + r",? (only )?if\b", text, re.IGNORECASE):
            bad.append(f"{opener.strip()!r} runs into an 'if'")
    if re.search(r"[,;:][,;:.?!]|[.?!][,;:]| [,;:.?!]|\.\.|\?\.|\.\?", text):
        bad.append("broken punctuation")
    if re.search(r"[.?!] [a-z]", text):
        bad.append("sentence starts in lower case")
    if re.search(r"[?!](?! [A-Z]|$)", text):
        bad.append("question or exclamation mark mid-sentence")
    return bad


def test_every_entry_keeps_the_grammar_contract():
    for key, tones in PHRASINGS.clauses.items():
        assert set(TONES) <= set(tones), key
        for tone, entries in tones.items():
            assert entries, (key, tone)
            for e in entries:
                assert slots_of(e) <= KNOWN_SLOTS, (key, e)
                if tone == "context":
                    assert e[:1].isupper() and e.endswith("."), (key, e)
                else:  # a verb phrase: lower case (or a slot holding one), no "if", no final punctuation
                    assert (e[:1].islower() or e.startswith("{")) and not e.startswith(("if ", "only if ")), (key, e)
                    assert e[-1] not in ".?!,;:", (key, e)
    for kind, openers in PHRASINGS.openers.items():
        assert all(o == "" or o.endswith(" ") for o in openers), kind
    assert set(PHRASINGS.questions) <= set(PHRASINGS.openers["ask"])


@pytest.mark.parametrize("key", sorted(PHRASINGS.clauses))
def test_each_template_with_every_slot_filled(key):
    """Each entry alone (every other list at its full width), alone and after another step, with
    and without a condition, under every opener: the result passes the grammar checks."""
    checked = 0
    for tone in TONES:
        for entry in PHRASINGS.clauses[key][tone]:
            clauses = {**PHRASINGS.clauses, key: {**PHRASINGS.clauses[key], tone: [entry]}}
            for kind in ("ask", "lead"):
                for opener in PHRASINGS.openers[kind]:
                    ph = dataclasses.replace(PHRASINGS, clauses=clauses, openers={"ask": [opener], "lead": []} if kind == "ask" else {"ask": [], "lead": [opener]})
                    w = TemplateWriter(ph)
                    for cond in (None, "the red apple is visible"):
                        step = Step(key.split(".")[0], key, {**SLOTS, **({"condition": cond} if cond else {})})
                        first = Step("Grounding", "Grounding", {"target": "red apple", "condition": "the sign is readable"})
                        for steps, inputs in (([step], _TWO[:1]), ([first, step], _TWO)):
                            plan = Plan(Chain.from_spec({"tools": [s.tool for s in steps]}), steps, inputs)
                            for seed in range(3):
                                text = w.write(plan, random.Random(seed), tone)
                                assert not grammar_problems(text), (grammar_problems(text), text)
                                assert fill_values_present(entry, text), (entry, text)
                                if cond:
                                    assert cond in text
                                checked += 1
    assert checked >= 100


def fill_values_present(entry: str, text: str) -> bool:
    return all(str(SLOTS[s]).lower() in text.lower() for s in slots_of(entry) if s in SLOTS)


def test_grammar_checks_catch_the_old_defects():
    # The checks can fail: the defects the old writer produced are all caught.
    for bad in ("I need you to if the text reads back to front, flip the image.", "Please if the top is free, add it.",
                "flip it.", "Flip the {target}.", "Flip  it.", "Flip it", "Hey, what is written there?, then flip it."):
        assert grammar_problems(bad), bad


def test_conditions_of_every_clause_read_well():
    w = TemplateWriter()
    for key, (cond, _) in CONDITIONS.items():
        step = Step(key.split(".")[0], key, {**SLOTS, "condition": cond.format(**{k: str(v) for k, v in SLOTS.items()})})
        plan = Plan(Chain.from_spec({"tools": [step.tool]}), [step], _TWO[:1])
        for seed in range(40):
            text = w.write(plan, random.Random(seed), random.Random(seed).choice(TONES))
            assert not grammar_problems(text), text


def _instructions(n: int, seed: int, conditions: bool, source: str) -> list[str]:
    rng = random.Random(seed)
    chains, src, w = ChainSet.load(), make_source(source, 96), TemplateWriter()
    out = []
    while len(out) < n:
        chain = chains.sample(rng)
        inputs = pick_inputs(chain, src, rng, Profile.CANVASCRAFT)
        if inputs is None:
            continue
        plan = make_plan(chain, inputs, rng, Profile.CANVASCRAFT)
        if conditions:  # the RL build's path: conditions added to reach a reasoning level
            add_conditions(plan, rng.choice(["easy", "medium", "hard"]), rng)
        out.append(w.write(plan, rng, rng.choice(TONES)))
    return out


@pytest.mark.parametrize("conditions,source", [(False, "builtin"), (True, "procedural")])
def test_500_rows_are_at_least_90_percent_distinct(conditions, source):
    texts = _instructions(500, 0, conditions, source)
    assert len(set(texts)) >= 450, len(set(texts))
    problems = [(t, grammar_problems(t)) for t in texts if grammar_problems(t)]
    assert not problems, problems[:3]
