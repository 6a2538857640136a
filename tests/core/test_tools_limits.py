"""A tools config's `limits:` block applies in-process, before any work, as on a server."""

from __future__ import annotations

import pytest
from PIL import Image

from toolserver.config import ToolsConfig

from toolserver.client import make_toolbox
from canvasagent.core.episode import EpisodeConfig, run_episode
from canvasagent.core.policies.replay import ReplayPolicy
from canvasagent.core.protocol import format_reply
from canvasagent.core.tasks import Task


def _config(tmp_path, limits: str):
    p = tmp_path / "tools.yaml"
    p.write_text(f"profile: canvascraft\nclient: local\nlimits: {limits}\n")
    return p


def test_text_limit_from_the_tools_config_refuses_before_the_tool_runs(tmp_path):
    tb = make_toolbox(ToolsConfig.load(_config(tmp_path, "{max_text_chars: 10}")))
    assert tb.limits.max_text_chars == 10
    call = {"name": "Overlayer", "arguments": {"base_image": "img_1", "overlay_type": "text", "content": "x" * 11}}
    traj = run_episode(ReplayPolicy([format_reply("Write.", call), format_reply("Done.", terminate=True)]),
                       Task("write", [Image.new("RGB", (32, 32), "white")]), tb, EpisodeConfig(max_turns=3))
    turn = traj.turns[0]
    assert turn.status == "error" and "10" in (turn.error or "") and traj.final_asset() is None
    ok = dict(call, arguments={**call["arguments"], "content": "x" * 10})
    traj = run_episode(ReplayPolicy([format_reply("Write.", ok), format_reply("Done.", terminate=True)]),
                       Task("write", [Image.new("RGB", (32, 32), "white")]), tb, EpisodeConfig(max_turns=3))
    assert traj.turns[0].status == "ok"


def test_bad_limits_are_refused_when_the_config_loads(tmp_path):
    with pytest.raises(ValueError, match="max_text_chars"):
        ToolsConfig.load(_config(tmp_path, "{max_text_chars: 0}"))
