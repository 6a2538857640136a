"""`EpisodeConfig.end_without_call`: the training layout ends an episode where a GRPO rollout ends."""

from __future__ import annotations

import pytest
from PIL import Image

from toolserver.client import make_toolbox
from canvasagent.core.episode import EpisodeConfig, run_episode
from canvasagent.core.policies.replay import ReplayPolicy
from canvasagent.core.protocol import format_reply
from canvasagent.core.tasks import Task

FLIP = format_reply("Mirror it.", {"name": "Flip", "arguments": {"image": "img_1"}})


@pytest.mark.parametrize("bad", ["<reason>Thinking.</reason>", '<reason>x</reason><tool_call>{"name": Flip</tool_call>'])
def test_a_reply_without_a_call_ends_the_episode_only_when_asked(bad):
    task = Task("mirror", [Image.new("RGB", (16, 16), "red")])
    replies = [FLIP, bad, FLIP, format_reply("Done.", terminate=True)]
    tb = make_toolbox("offline")
    asked_again = run_episode(ReplayPolicy(replies), task, tb, EpisodeConfig(max_turns=6))
    ended = run_episode(ReplayPolicy(replies), task, tb, EpisodeConfig(max_turns=6, end_without_call=True))
    assert asked_again.stop_reason == "terminate" and len(asked_again.turns) == 4
    assert ended.stop_reason == "no_terminate" and [t.status for t in ended.turns][0] == "ok" and len(ended.turns) == 2
    assert ended.turns[1].status in ("no_call", "parse_error") and ended.turns[1].observation.startswith("Error")
