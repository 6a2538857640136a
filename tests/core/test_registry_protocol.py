"""The registry drives schemas and the system prompt; trajectories round-trip; the CLI lists tools."""

import json

import numpy as np
from PIL import Image

from canvasagent.cli import main
from canvasagent.core.episode import run_episode
from canvasagent.core.policies import ReplayPolicy
from canvasagent.core.protocol import render_system_prompt
from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import Trajectory
from toolserver.registry import REGISTRY, Backend, OutputKind, openai_schemas, tool_names
from toolserver.toolbox import LocalToolbox

PUBLIC = {
    "ImageGeneration": ["prompt"],
    "ImageEdit": ["image", "edit_prompt", "masked_image"],
    "Grounding": ["image", "reference_text"],
    "SAM": ["image", "bbox"],
    "Extract": ["image", "mask"],
    "Overlayer": ["base_image", "overlay_type", "content", "position"],
    "Crop": ["image", "bbox"],
    "OCR": ["image"],
    "Rotate": ["image", "angle"],
    "Flip": ["image"],
    "SR": ["image"],
}


def test_canvasagent_tools_match_public_names_and_arguments():
    assert set(tool_names("canvasagent")) == set(PUBLIC)
    for name, args in PUBLIC.items():
        assert list(REGISTRY[name].arg_names) == args
    assert REGISTRY["ImageEdit"].required == ("image", "edit_prompt")
    assert REGISTRY["Overlayer"].required == ("base_image", "overlay_type", "content")
    assert {t.name for t in REGISTRY.values() if t.backend is Backend.MODEL} == {"ImageGeneration", "ImageEdit", "Grounding", "SAM", "OCR", "SR"}


def test_easel_tools_declared():
    assert tool_names("easel") == ("brush_stroke", "undo", "submit")
    assert len(REGISTRY["brush_stroke"].args) == 13
    assert all(a.schema()["minimum"] == 0.0 and a.schema()["maximum"] == 1.0 for a in REGISTRY["brush_stroke"].args)


def test_schemas_and_prompt_are_generated_from_registry():
    schemas = openai_schemas("canvasagent")
    assert [s["function"]["name"] for s in schemas] == list(tool_names("canvasagent"))
    rot = next(s for s in schemas if s["function"]["name"] == "Rotate")
    assert rot["function"]["parameters"]["properties"]["angle"]["enum"] == [45, 90, 180]
    prompt = render_system_prompt("canvasagent")
    for name in tool_names("canvasagent"):
        assert f'"name": "{name}"' in prompt
    assert "brush_stroke" not in prompt and "brush_stroke" in render_system_prompt("easel")
    assert OutputKind.MASK.registers_asset and not OutputKind.TEXT.registers_asset


def test_trajectory_round_trip_keeps_everything(tmp_path):
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (30, 40, 4), dtype=np.uint8), "RGBA")
    replies = [
        '<reason>a</reason><tool_call>{"name": "Crop", "arguments": {"image": "img_1", "bbox": [0, 0, 500, 500]}}</tool_call>',
        '<reason>b</reason><tool_call>{"name": "Flip", "arguments": {"image": "Crop_7"}}</tool_call>',
        "<reason>c</reason><Terminate>",
    ]
    traj = run_episode(ReplayPolicy(replies), Task("x", [img], expected_tools=["Crop"]), LocalToolbox())
    traj.save(tmp_path / "t")
    back = Trajectory.load(tmp_path / "t")
    assert back.to_dict() == traj.to_dict()
    assert back.assets.get("img_1").image.mode == "RGBA"
    np.testing.assert_array_equal(np.asarray(back.assets.get("Crop_0").image), np.asarray(traj.assets.get("Crop_0").image))
    assert back.turns[1].findings == traj.turns[1].findings and back.turns[1].error_code == "unknown_asset"


def test_tools_cli(tmp_path, capsys):
    assert main(["tools", "list", "--json"]) == 0
    schemas = json.loads(capsys.readouterr().out)
    assert len(schemas) == len(REGISTRY)
    Image.new("RGB", (50, 40), (10, 20, 30)).save(tmp_path / "a.png")
    rc = main(["tools", "call", "Flip", "--image", f"img_1={tmp_path / 'a.png'}", "--args", '{"image": "img_1"}', "--out", str(tmp_path / "o")])
    assert rc == 0 and (tmp_path / "o" / "Flip_0.png").exists()
    rc = main(["tools", "call", "SAM", "--image", f"img_1={tmp_path / 'a.png'}", "--args", '{"image": "img_1", "bbox": [0,0,10,10]}', "--out", str(tmp_path / "o2")])
    assert rc == 1 and "backend" in json.loads((tmp_path / "o2" / "result.json").read_text())["observation"]
    assert main(["tools", "call", "Flip", "--args", "{bad", "--out", str(tmp_path / "o3")]) == 2


def test_every_pure_tool_in_the_registry_has_an_implementation():
    # The registry is the tool list; toolserver.tools.pure only maps its PURE tools to functions.
    from toolserver.tools.pure import PURE_TOOLS

    assert set(PURE_TOOLS) == {s.name for s in REGISTRY.values() if s.backend is Backend.PURE}
