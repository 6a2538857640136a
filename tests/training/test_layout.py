"""The shared message layout and the TRL environment adapter (no training)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from transformers.utils import get_json_schema

from toolserver.client import make_toolbox
from canvasagent.core.models import load_processor
from canvasagent.core.protocol import parse_reply
from canvasagent.training.env import make_env_class, tool_functions, trajectory_of
from canvasagent.training.messages import (
    assistant_message,
    decoded_tool_calls,
    fill_images,
    grpo_row,
    prompt_messages,
    reply_text,
    sft_example,
    system_text,
)
from canvasagent.training.scripted import SCRIPTED_TOOLS, make_tasks, run_reference
from toolserver.registry import REGISTRY, tools

TOOLS = list(SCRIPTED_TOOLS)


@pytest.fixture(scope="module")
def processor(tiny_qwen3vl_dir):
    return load_processor(tiny_qwen3vl_dir)


@pytest.fixture(scope="module")
def tasks():
    return make_tasks(6, seed=3)


def test_env_tool_schemas_come_from_the_registry():
    for spec in tools("canvasagent"):
        fn = tool_functions([spec.name])[0]
        schema = get_json_schema(fn)["function"]
        assert schema["name"] == spec.name
        assert schema["description"] == spec.description
        assert set(schema["parameters"]["properties"]) == set(spec.arg_names)
        assert set(schema["parameters"].get("required", [])) == set(spec.required)
        for a in spec.args:
            prop = schema["parameters"]["properties"][a.name]
            assert prop["description"] == a.description
            if a.choices:
                assert prop["enum"] == list(a.choices)
    env_cls = make_env_class(None, lambda: make_toolbox("offline"), max_turns=4)
    assert set(env_cls.tool_names) == {t.name for t in tools("canvasagent")}


def test_sft_system_text_matches_grpo_prompt(processor, tasks):
    """SFT rows carry the tool block themselves; GRPO gets it from tools=. Same bytes."""
    fns = tool_functions(TOOLS)
    system = system_text(processor, fns)
    task, replies = tasks[0]
    grpo_prompt = processor.apply_chat_template(prompt_messages(task), tools=fns, tokenize=False, add_generation_prompt=True)
    row = sft_example(run_reference(task, replies, make_toolbox("offline")), system)
    sft_msgs = fill_images({"messages": [row["messages"]], "images": [row["images"]]})["messages"][0]
    sft_text = processor.apply_chat_template(sft_msgs, tokenize=False)
    assert sft_text.startswith(grpo_prompt.removesuffix("<|im_start|>assistant\n"))
    # Every assistant turn of the SFT text is a well-formed protocol reply.
    for chunk in sft_text.split("<|im_start|>assistant\n")[1:]:
        reply = chunk.split("<|im_end|>")[0]
        assert not parse_reply(reply).findings, reply


def test_sft_row_images_and_tool_calls(tasks):
    task, replies = tasks[1]
    traj = run_reference(task, replies, make_toolbox("offline"))
    row = sft_example(traj, "SYS")
    n_placeholders = sum(p.get("type") == "image" for m in row["messages"] for p in m["content"])
    assert n_placeholders == len(row["images"]) == 1 + sum(t.output_id is not None for t in traj.turns)
    out = fill_images({"messages": [row["messages"]], "images": [row["images"]]})
    assert len(out["images"][0]) == len(task.images)  # user images stay for TRL to fill
    tool_imgs = [p["image"] for m in out["messages"][0] if m["role"] == "tool" for p in m["content"] if p["type"] == "image"]
    assert len(tool_imgs) == len(traj.tool_sequence)
    calls = [m["tool_calls"][0]["function"] for m in out["messages"][0] if m.get("tool_calls")]
    assert [c["name"] for c in calls] == traj.tool_sequence
    assert all(isinstance(c["arguments"], dict) for c in calls)


def test_reply_text_round_trip():
    reply = '<reason>Mirror it.</reason><tool_call>{"name": "Flip", "arguments": {"image": "img_1"}}</tool_call>'
    msg = assistant_message(reply)
    msg["tool_calls"][0]["function"]["arguments"] = json.loads(msg["tool_calls"][0]["function"]["arguments"])
    text = reply_text(msg)
    assert text == '<reason>Mirror it.</reason>\n<tool_call>\n{"name": "Flip", "arguments": {"image": "img_1"}}\n</tool_call>'
    p = parse_reply(text)
    assert not p.findings and p.call.name == "Flip"


def test_env_adapter_runs_the_core_episode(tasks):
    env_cls = make_env_class(TOOLS, lambda: make_toolbox("offline"), max_turns=3)
    env = env_cls()
    task = tasks[0][0]
    row = grpo_row(task)
    assert env.reset(**row) is None
    ok = env.Flip(image="img_1")
    assert isinstance(ok, list) and ok[0]["type"] == "image" and "Flip_0" in ok[-1]["text"]
    err = env.Crop(image="nope", bbox="[0, 0, 10, 10]")  # a failure is an observation, not an exception
    assert isinstance(err, str) and "Error" in err and "imglist" in err
    bad = env.Rotate(image="Flip_0", angle=33, extra=1)
    assert isinstance(bad, str) and "Error" in bad
    assert env.Flip(image="img_1").startswith("Error: the episode has ended")  # turn budget spent
    completion = [
        {"role": "assistant", "content": "<reason>Mirror.</reason>", "tool_calls": [{"type": "function", "function": {"name": "Flip", "arguments": {"image": "img_1"}}}]},
        {"role": "tool", "name": "Flip", "content": ok},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "Crop", "arguments": {"image": "nope", "bbox": "[0, 0, 10, 10]"}}}]},
        {"role": "tool", "name": "Crop", "content": err},
        {"role": "assistant", "content": "<reason>Rotate.</reason>", "tool_calls": [{"type": "function", "function": {"name": "Rotate", "arguments": {"image": "Flip_0", "angle": 33, "extra": 1}}}]},
        {"role": "tool", "name": "Rotate", "content": bad},
    ]
    traj = trajectory_of(env, completion)
    assert traj.tool_sequence == ["Flip", "Crop", "Rotate"]
    assert [t.status for t in traj.turns] == ["ok", "error", "error"]
    assert not traj.turns[0].findings
    assert any(f.code.value == "missing_reason" for f in traj.turns[1].findings)  # format checked from the reply
    assert traj.stop_reason == "max_turns"
    assert trajectory_of(env, completion) is traj  # cached per rollout


def test_env_can_attach_the_latest_image_to_text_only_observations(tasks):
    env_cls = make_env_class(TOOLS, lambda: make_toolbox("offline"), max_turns=3)
    env_cls.image_in_every_observation = True
    env = env_cls()
    env.reset(**grpo_row(tasks[0][0]))
    env.Flip(image="img_1")
    err = env.Crop(image="nope", bbox="[0, 0, 10, 10]")
    assert [p["type"] for p in err] == ["image", "text"] and err[0]["image"] is env.episode.assets.get("Flip_0").image
    assert "Error" in err[1]["text"] and "imglist" in err[1]["text"]


def test_env_final_reply_terminates(tasks):
    env_cls = make_env_class(TOOLS, lambda: make_toolbox("offline"), max_turns=4)
    env = env_cls()
    env.reset(**grpo_row(tasks[0][0]))
    obs = env.Flip(image="img_1")
    traj = trajectory_of(env, [
        {"role": "assistant", "content": "<reason>Mirror.</reason>", "tool_calls": [{"type": "function", "function": {"name": "Flip", "arguments": {"image": "img_1"}}}]},
        {"role": "tool", "name": "Flip", "content": obs},
        {"role": "assistant", "content": "<reason>Done.</reason><Terminate>"},
    ])
    assert traj.stop_reason == "terminate" and traj.final_asset_id == "Flip_0"
    assert [t.status for t in traj.turns] == ["ok", "terminate"]


def test_every_registry_tool_is_known():
    assert set(SCRIPTED_TOOLS) <= set(REGISTRY)


def test_tool_block_order_is_the_same_whatever_order_the_tools_are_named_in(processor):
    """TRL lists env tools sorted by name; a checkpoint evaluated with `hf:...&tools=` in registry
    order (as the ablation grid names them) must see the tool block it was trained with."""
    names = ["Overlayer", "Crop", "OCR", "Rotate", "Flip"]
    fns = tool_functions(names)
    assert [f.__name__ for f in fns] == sorted(names)
    assert system_text(processor, fns) == system_text(processor, tool_functions(sorted(names, reverse=True)))


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@given(args=st.dictionaries(st.text(max_size=6), _json_values, max_size=4), as_string=st.booleans())
def test_decoded_tool_calls_give_dict_arguments_and_leave_the_message_alone(args, as_string):
    stored = json.dumps(args) if as_string else args
    msg = {"role": "assistant", "content": [], "tool_calls": [{"type": "function", "function": {"name": "Crop", "arguments": stored}}]}
    before = json.dumps(msg)
    (call,) = decoded_tool_calls(msg)
    assert call == {"type": "function", "function": {"name": "Crop", "arguments": args}}
    assert json.dumps(msg) == before
    assert decoded_tool_calls({"role": "assistant", "content": "x"}) == []
