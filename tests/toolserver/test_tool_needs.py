"""The registry's tool dependencies (`ToolSpec.requires` / `produces`) are consistent."""

from __future__ import annotations

import pytest

from canvasagent.core.protocol import render_system_prompt
from toolserver.registry import INSTRUCTION_KINDS, OutputKind, producers, tools, unmet_needs

TASK_KINDS = {OutputKind.IMAGE, OutputKind.RGBA}  # what a task's input images can be


@pytest.mark.parametrize("spec", tools(None), ids=lambda s: s.name)
def test_every_need_names_an_argument_and_a_kind_something_supplies(spec):
    for need in spec.requires:
        assert spec.arg(need.arg) is not None, f"{spec.name}: need on unknown argument {need.arg!r}"
        if need.when is not None:
            arg = spec.arg(need.when[0])
            assert arg is not None and need.when[1] in arg.choices, f"{spec.name}: condition {need.when} is no choice"
        by_task = need.from_task and need.kind in TASK_KINDS | INSTRUCTION_KINDS
        assert producers(need.kind, spec.family) or by_task, f"{spec.name} needs {need.kind.value}, which nothing supplies"


def test_products_follow_the_output_kind():
    for spec in tools(None):
        assert spec.produces == (() if spec.output in (OutputKind.CANVAS, OutputKind.NONE) else (spec.output,))
    assert producers(OutputKind.BOXES) == ("Grounding",) and producers(OutputKind.MASK) == ("SAM",)


def test_unmet_needs_of_a_sequence():
    image = {OutputKind.IMAGE}
    assert unmet_needs(["Grounding", "SAM", "Extract"], image) == []
    assert [(i, n.kind) for i, n in unmet_needs(["Grounding", "Extract"], image)] == [(1, OutputKind.MASK)]
    assert [(i, n.kind) for i, n in unmet_needs(["Flip"], ())] == [(0, OutputKind.IMAGE)]
    assert unmet_needs(["ImageGeneration", "Flip"], ()) == []
    assert unmet_needs(["Crop"], image) == []  # the instruction may state the region


def test_the_chain_rules_state_every_need_only_an_earlier_call_meets():
    rules = render_system_prompt("canvasagent", include_tools=False).split("## Chain rules\n")[1].split("\n\n")[0]
    for spec in tools():
        for need in spec.requires:
            if not need.from_task:
                assert f"{spec.name} ({need.arg}" in rules and producers(need.kind)[0] in rules
    assert "call ImageGeneration first" in rules
    assert "Overlayer with overlay_type='object' needs content = an RGBA image ID such as Extract_0." in rules
