"""The CanvasCraft planner emits only chains and steps whose registry needs are met."""

from __future__ import annotations

import random

import pytest

from canvascraft.chains import Chain, ChainSet
from canvascraft.plan import make_plan
from canvascraft.rl import compose_chain
from canvascraft.sft import pick_inputs
from canvascraft.sources import make_source
from toolserver.registry import INSTRUCTION_KINDS, REGISTRY, OutputKind, unmet_needs
from toolserver.validation import Profile

CHAINS = ChainSet.load(["chains", "chains_offline"])
STATED = {"Crop.region", "Overlayer.text"}  # clauses whose value (a region, a caption) the instruction states


def _supplied(chain: Chain) -> set[OutputKind]:
    return ({OutputKind.IMAGE} if chain.inputs else set()) | ({OutputKind.RGBA} if "rgba" in chain.needs else set())


def _unmet_steps(chain: Chain, rng: random.Random) -> list[str]:
    """Steps of the chain's plan with a need that neither the task nor an earlier step meets."""
    inputs = pick_inputs(chain, make_source("builtin"), rng, Profile.CANVASCRAFT)
    assert inputs is not None, chain.name
    plan = make_plan(chain, inputs, rng, Profile.CANVASCRAFT)
    have: set[OutputKind] = set()
    bad = []
    for step in plan.steps:
        args = {"overlay_type": "object" if step.clause == "Overlayer.object" else "text"}
        task = _supplied(chain) | (INSTRUCTION_KINDS if step.clause in STATED else set())
        for need in REGISTRY[step.tool].needs(args):
            if need.kind not in have and not (need.from_task and need.kind in task):
                bad.append(f"{step.clause}: {need.kind.value}")
        have.update(REGISTRY[step.tool].produces)
    return bad


@pytest.mark.parametrize("chain", list(CHAINS), ids=lambda c: c.name)
def test_every_configured_chain_meets_its_needs(chain):
    assert chain.unmet_needs() == [] and unmet_needs(chain.tools, _supplied(chain)) == []
    assert _unmet_steps(chain, random.Random(chain.name)) == []


def test_composed_rl_chains_meet_their_needs():
    rng, seen = random.Random(0), 0
    for _ in range(200):
        chain = compose_chain(CHAINS, rng, rng.choice(("easy", "medium", "hard")), 12, rng.choice(("easy", "medium", "hard")))
        if chain is not None:
            seen += 1
            assert _unmet_steps(chain, rng) == [], chain.name
    assert seen > 50


@pytest.mark.parametrize("spec", ["SAM", "Grounding+Extract", "Gen+SAM+Extract", "Flip+Extract+Overlay"])
def test_a_chain_file_with_an_unmet_need_is_refused(spec, tmp_path):
    assert Chain.from_spec(spec).unmet_needs()
    path = tmp_path / "bad.yaml"
    path.write_text(f"chains:\n  - {{chain: {spec}}}\n")
    with pytest.raises(ValueError, match="need"):
        ChainSet.load([path])


def test_a_cut_out_chain_gets_a_background_input():
    assert Chain.from_spec("Grounding+SAM+Extract+Overlay").inputs == 2
    assert Chain.from_spec("Grounding+SAM+Extract").inputs == 1
    assert Chain.from_spec("Gen+Flip").inputs == 0
