"""Policy specs, the OpenAI-compatible policy against a stub server, and the local HF policy."""

from __future__ import annotations

import json
import time

import pytest
from PIL import Image

from toolserver.client import make_toolbox
from canvasagent.core.episode import EpisodeConfig, run_episode
from canvasagent.core.policies.guards import GuardConfig, GuardedPolicy
from canvasagent.core.policies.openai_compat import EndpointError, OpenAICompatConfig, OpenAICompatPolicy, to_openai_messages
from canvasagent.policy_spec import PolicyFactory, PolicySpecError, ReplaySource, parse_policy_spec
from canvasagent.core.protocol import format_reply
from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import Trajectory
from tests.stub_openai import StubOpenAI, chat_payload, free_port, replies

FLIP = format_reply("mirror", {"name": "Flip", "arguments": {"image": "img_1"}})
DONE = format_reply("done", terminate=True)


def _task() -> Task:
    return Task("mirror it", [Image.new("RGB", (20, 10), "red")], id="a")


# -- specs ---------------------------------------------------------------------------------------


def test_parse_specs():
    s = parse_policy_spec("openai:qwen-vl@http://127.0.0.1:9/v1?timeout_s=2&max_retries=0")
    assert (s.kind, s.target, s.base_url, s.options) == ("openai", "qwen-vl", "http://127.0.0.1:9/v1", {"timeout_s": 2, "max_retries": 0})
    assert parse_policy_spec("hf:/ckpt?max_new_tokens=8").options == {"max_new_tokens": 8}
    assert parse_policy_spec("human").kind == "human"
    assert parse_policy_spec("scripted:expected").target == "expected"
    assert parse_policy_spec("replay:runs/x").target == "runs/x"
    for bad in ["", "foo:bar", "openai:model", "openai:m@ftp://x", "scripted:nope", "hf:"]:
        with pytest.raises(PolicySpecError):
            parse_policy_spec(bad)


def test_unknown_option_is_rejected():
    with pytest.raises(PolicySpecError, match="unknown option"):
        PolicyFactory("openai:m@http://127.0.0.1:9/v1?temprature=1")


def test_replay_sources(tmp_path):
    traj = run_episode(PolicyFactory("scripted:flip").for_task(_task()), _task(), make_toolbox("offline"))
    traj.save(tmp_path / "runs" / "a")
    one = ReplaySource.load(tmp_path / "runs" / "a")
    assert one.default == [t.reply for t in traj.turns]
    by_task = ReplaySource.load(tmp_path / "runs")
    assert by_task.replies_for(_task()) == one.default
    (tmp_path / "r.json").write_text(json.dumps([FLIP, DONE]))
    assert ReplaySource.load(tmp_path / "r.json").default == [FLIP, DONE]
    recs = [{"id": "a", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": FLIP}]}, {"id": "b", "replies": [DONE]}]
    (tmp_path / "r.jsonl").write_text("\n".join(map(json.dumps, recs)))
    src = ReplaySource.load(tmp_path / "r.jsonl")
    assert src.by_id == {"a": [FLIP], "b": [DONE]}
    assert src.replies_for(Task("x", id="zzz")) == []  # unknown task: terminate at once
    with pytest.raises(PolicySpecError):
        ReplaySource.load(tmp_path / "missing")


def test_scripted_expected_follows_the_chain():
    task = Task("flip then crop", [Image.new("RGB", (20, 10), "red")], expected_tools=["Flip", "Crop"])
    traj = run_episode(PolicyFactory("scripted:expected").for_task(task), task, make_toolbox("offline"))
    assert traj.tool_sequence == ["Flip", "Crop"] and traj.stop_reason == "terminate"
    assert traj.final_asset_id == "Crop_0"


# -- OpenAI-compatible endpoint ------------------------------------------------------------------


def test_openai_policy_runs_an_episode_with_images():
    with StubOpenAI(replies(FLIP, DONE)) as stub:
        policy = PolicyFactory(f"openai:stub-vl@{stub.base_url}").for_task()
        traj = run_episode(policy, _task(), make_toolbox("offline"))
    assert traj.tool_sequence == ["Flip"] and traj.stop_reason == "terminate"
    first = stub.requests[0]
    assert first["_path"] == "/v1/chat/completions" and first["model"] == "stub-vl"
    user = first["messages"][1]
    urls = [p["image_url"]["url"] for p in user["content"] if p["type"] == "image_url"]
    assert len(urls) == 1 and urls[0].startswith("data:image/png;base64,")
    second = stub.requests[1]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]  # tool turn sent as user
    assert any(p["type"] == "image_url" for p in second[-1]["content"])  # the Flip output is shown


def test_openai_policy_retries_transient_errors(monkeypatch):
    calls = {"n": 0}

    def flaky(body):
        calls["n"] += 1
        return (503, {"error": "busy"}) if calls["n"] < 3 else (200, chat_payload(DONE))

    monkeypatch.setenv("MY_KEY", "sk-test")
    with StubOpenAI(flaky) as stub:
        p = OpenAICompatPolicy(OpenAICompatConfig("m", stub.base_url, api_key_env="MY_KEY", max_retries=3, backoff_s=0.01))
        assert p.complete([{"role": "user", "content": "hi"}]) == DONE
    assert calls["n"] == 3 and stub.requests[0]["_auth"] == "Bearer sk-test"


def test_openai_client_error_is_not_retried():
    with StubOpenAI(lambda b: (400, {"error": "bad image"})) as stub:
        p = OpenAICompatPolicy(OpenAICompatConfig("m", stub.base_url, max_retries=3, backoff_s=0.01))
        with pytest.raises(EndpointError, match="HTTP 400"):
            p.complete([{"role": "user", "content": "hi"}])
    assert len(stub.requests) == 1


def test_endpoint_down_ends_episode_with_clear_error_and_saves_it(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    policy = PolicyFactory(f"openai:m@{url}?max_retries=1&backoff_s=0.01&timeout_s=2").for_task()
    t0 = time.perf_counter()
    traj = run_episode(policy, _task(), make_toolbox("offline"))
    assert time.perf_counter() - t0 < 10
    assert traj.stop_reason == "policy_error"
    assert "cannot connect" in traj.meta["error"] and url in traj.meta["error"]
    traj.save(tmp_path / "t")
    assert Trajectory.load(tmp_path / "t").stop_reason == "policy_error"


def test_openai_timeout_is_reported():
    def slow(body):
        time.sleep(1.0)
        return 200, chat_payload(DONE)

    with StubOpenAI(slow) as stub:
        p = OpenAICompatPolicy(OpenAICompatConfig("m", stub.base_url, timeout_s=0.2, max_retries=0))
        with pytest.raises(EndpointError, match="timed out"):
            p.complete([{"role": "user", "content": "hi"}])


def test_message_conversion_keeps_text_roles_text_only():
    img = Image.new("RGBA", (4000, 10), (1, 2, 3, 4))
    msgs = [
        {"role": "system", "content": [{"type": "text", "text": "sys"}]},
        {"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": "go"}]},
        {"role": "assistant", "content": [{"type": "text", "text": FLIP}]},
        {"role": "tool", "content": [{"type": "text", "text": "ok"}]},
    ]
    out = to_openai_messages(msgs, tool_role="tool", max_image_side=64)
    assert out[0] == {"role": "system", "content": "sys"} and out[2]["content"] == FLIP
    assert out[3]["role"] == "tool"
    import base64, io

    data = out[1]["content"][0]["image_url"]["url"].split(",", 1)[1]
    assert max(Image.open(io.BytesIO(base64.b64decode(data))).size) == 64


# -- guards --------------------------------------------------------------------------------------


def test_garbage_policy_is_stopped_by_the_guard():
    policy = GuardedPolicy(PolicyFactory("scripted:garbage").for_task(), GuardConfig(max_consecutive_invalid=3))
    traj = run_episode(policy, _task(), make_toolbox("offline"), EpisodeConfig(max_turns=50))
    assert len(traj.turns) == 3 and traj.stop_reason == "policy_error"
    assert "3 invalid replies in a row" in traj.meta["error"]


# -- local HF checkpoint -------------------------------------------------------------------------


def test_hf_local_policy_on_tiny_model(tiny_qwen3vl_dir):
    factory = PolicyFactory(f"hf:{tiny_qwen3vl_dir}?max_new_tokens=12&seed=0")
    policy = factory.for_task()
    assert factory.for_task() is policy  # one model shared across tasks
    traj = run_episode(policy, _task(), make_toolbox("offline"), EpisodeConfig(max_turns=2))
    assert len(traj.turns) == 2 and traj.stop_reason in ("max_turns", "terminate")
    assert all(isinstance(t.reply, str) for t in traj.turns)
    # Greedy decoding is deterministic.
    again = run_episode(factory.for_task(), _task(), make_toolbox("offline"), EpisodeConfig(max_turns=2))
    assert [t.reply for t in again.turns] == [t.reply for t in traj.turns]


def test_hf_context_overflow_is_a_clear_policy_error(tiny_qwen3vl_dir):
    policy = PolicyFactory(f"hf:{tiny_qwen3vl_dir}?max_new_tokens=5000").for_task()
    traj = run_episode(policy, _task(), make_toolbox("offline"))
    assert traj.stop_reason == "policy_error" and "context" in traj.meta["error"]


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(OSError, match="not an existing checkpoint"):
        PolicyFactory(f"hf:{tmp_path / 'nope'}")
