"""The evaluation agent: offline planner, OpenAI-compatible planner (stub), justified stops, EA-CoT export."""

from __future__ import annotations

import json

import pytest
import yaml

from canvasagent.cli import main as cli_main
from canvasagent.evaluation.agent import build_agent
from tests.evaluation.conftest import fake_score
from tests.stub_openai import StubOpenAI, chat_payload, free_port

ASPECTS = {
    "max_rounds": 3,
    "min_rounds": 2,
    "samples_per_round": 2,
    "stability_eps": 0.05,
    "aspects": [
        {
            "name": "portrait orientation",
            "description": "Makes portrait images.",
            "keywords": ["orientation", "portrait"],
            "targets": ["Crop", "policy"],
            "probes": [
                {"prompt": "tall", "args": {"Crop": {"bbox": [250, 0, 750, 1000]}}, "image": {"size": [60, 40], "color": [9, 9, 9]}, "checks": [{"type": "orientation", "orientation": "portrait"}]},
                {"prompt": "tall 2", "args": {"Crop": {"bbox": [250, 0, 750, 1000]}}, "image": {"size": [60, 60], "color": [9, 9, 9]}, "checks": [{"type": "orientation", "orientation": "portrait"}]},
            ],
        },
        {
            "name": "square output",
            "description": "Makes square images.",
            "keywords": ["orientation", "square"],
            "targets": [],
            "probes": [{"prompt": "square", "args": {"Crop": {"bbox": [0, 0, 1000, 1000]}}, "image": {"size": [60, 40], "color": [9, 9, 9]}, "checks": [{"type": "orientation", "orientation": "square"}]}],
        },
        {
            "name": "visible change",
            "description": "Changes the input.",
            "keywords": ["change"],
            "targets": [],
            "probes": [{"prompt": "change", "args": {"Crop": {"bbox": [0, 0, 1000, 1000]}}, "image": {"size": [60, 40], "color": [9, 9, 9]}, "checks": [{"type": "differs_from", "of": "img_1"}]}],
        },
    ],
}


@pytest.fixture
def agent_config(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(ASPECTS))
    return str(path)


def test_offline_agent_on_a_tool(agent_config, tmp_path):
    agent = build_agent("Crop", tmp_path / "ea", config=agent_config)
    result = agent.run("Does Crop get portrait orientation right?")
    names = [r.plan.sub_aspect for r in result.rounds]
    assert names[0] == "portrait orientation"  # most relevant to the question first
    r1 = result.rounds[0]
    assert r1.stats["n_ok"] == 2 and r1.stats["align"] == 1.0 and r1.samples[0].checks == {"orientation": 1.0}
    # A full-frame crop keeps 60x40 landscape: the square probe fails, so the agent cannot stop on stability.
    assert result.rounds[1].stats["align"] == 0.0
    # Only the aspects the question is about are probed ("visible change" shares no keyword).
    assert names == ["portrait orientation", "square output"]
    assert result.stop.stop and "sub-aspect(s) of the question" in result.stop.justification
    assert "Round 1, portrait orientation: alignment 1.00" in result.summary
    saved = json.loads((tmp_path / "ea" / "result.json").read_text())
    assert len(saved["rounds"]) == len(result.rounds) and saved["stop"]["justification"]
    assert (tmp_path / "ea" / "samples" / "r1_s1" / "trajectory.json").exists()
    # EA-CoT: one record per decision plus the final summary, each conditioned on the history before it.
    records = json.loads((tmp_path / "ea" / "ea_cot.json").read_text())
    assert len(records) == len(result.rounds) + 1
    assert [m["role"] for m in records[0]["messages"]] == ["system", "user", "assistant"]
    text = lambda rec, i: rec["messages"][i]["content"]  # noqa: E731
    assert "(none)" in text(records[0], 1)
    assert text(records[0], 2).endswith("<tool>portrait orientation</tool>")
    assert "<information>" in text(records[1], 1)
    last = text(records[-1], 2)
    assert last.startswith("<think>") and "<summary>" in last and records[-1]["images"] == []


def test_offline_agent_stops_when_target_produces_nothing(tmp_path, agent_config):
    result = build_agent("ImageGeneration", tmp_path / "ea", config=agent_config, scorer=fake_score).run("How good are portraits?")
    assert len(result.rounds) == 1 and result.rounds[0].stats["n_ok"] == 0
    why = result.stop.justification
    assert "produced no output" in why and "needs a model backend" in why


def test_agent_with_policy_target(tmp_path, agent_config):
    result = build_agent("scripted:terminate", tmp_path / "ea", config=agent_config, scorer=fake_score).run("orientation?")
    assert result.rounds[0].stats["n_ok"] == 0 and result.stop.stop


def test_openai_planner_and_prompt_writer(tmp_path, agent_config):
    answers = [
        json.dumps({"thought": "Check portraits first.", "sub_aspect": "portrait orientation"}),
        json.dumps({"probes": [{"prompt": "a tall tower", "checks": [{"type": "orientation", "orientation": "portrait"}, {"type": "bogus"}]}]}),
        "I am not JSON",  # the planner falls back to the offline planner for this step
        json.dumps({"probes": []}),  # no usable probe: the template writer takes over
        json.dumps({"thought": "Enough.", "stop": True, "justification": "rounds 1-2 measured portrait 1.00 and square 0.00"}),
        "Rotate makes portraits (round 1: 1.00) but not squares (round 2: 0.00).",
    ]
    queue = list(answers)
    with StubOpenAI(lambda body: (200, chat_payload(queue.pop(0)))) as stub:
        agent = build_agent("Crop", tmp_path / "ea", planner=f"openai:planner@{stub.base_url}", config=agent_config)
        result = agent.run("Does Crop get portrait orientation right?")
    assert [r.plan.source for r in result.rounds] == ["openai", "offline-fallback (planner reply was not the JSON decision)"]
    assert result.rounds[0].probes[0].prompt == "a tall tower"
    assert result.rounds[0].probes[0].checks == [{"type": "orientation", "orientation": "portrait"}]
    assert result.stop.source == "openai" and "portrait 1.00" in result.stop.justification
    assert result.summary.startswith("Rotate makes portraits") and "Why the evaluation stopped" in result.summary
    assert not queue


def test_openai_planner_endpoint_down_falls_back(tmp_path, agent_config):
    spec = f"openai:planner@http://127.0.0.1:{free_port()}/v1?max_retries=0&timeout_s=2"
    result = build_agent("Crop", tmp_path / "ea", planner=spec, config=agent_config).run("portrait orientation?")
    assert result.rounds and all(r.plan.source.startswith("offline-fallback (planner endpoint failed") for r in result.rounds)
    assert "Round 1" in result.summary


def test_evaluate_cli(tmp_path, agent_config, capsys):
    out = tmp_path / "cli"
    rc = cli_main(["evaluate", "Is the orientation right?", "--target", "Crop", "--config", agent_config, "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "[round 1] portrait orientation" in text and "[stop]" in text
    assert {p.name for p in out.iterdir()} >= {"result.json", "rounds.json", "summary.md", "ea_cot.json", "samples"}
    assert cli_main(["evaluate", "x", "--target", "nope:1", "--config", agent_config, "--out", str(out)]) == 2


def test_ea_cot_records_render_with_the_policy_chat_template(tmp_path, agent_config, tiny_qwen3vl_dir):
    from canvasagent.models.loading import load_processor

    build_agent("Crop", tmp_path / "ea", config=agent_config, scorer=fake_score).run("portrait orientation?")
    records = json.loads((tmp_path / "ea" / "ea_cot.json").read_text())
    processor = load_processor(tiny_qwen3vl_dir)
    for rec in records:
        ids = processor.apply_chat_template(rec["messages"], tokenize=True, return_dict=True)["input_ids"]
        text = processor.decode(ids if isinstance(ids[0], int) else ids[0])
        answer = rec["messages"][2]["content"]
        assert text.count("<|im_start|>") == 3 and answer[:40] in text


def test_ea_cot_records_train_with_the_sft_command(tmp_path, agent_config):
    """The exported records are SFT data for `python -m canvasagent.train sft` (data.format=sharegpt)."""
    from canvasagent.train import main as train_main

    build_agent("Crop", tmp_path / "ea", config=agent_config, scorer=fake_score).run("portrait orientation?")
    rc = train_main([
        "sft", "--config", "sft_tiny_cpu", "--output-dir", str(tmp_path / "sft"),
        "--set", "data.format=sharegpt", "--set", f"data.path={tmp_path / 'ea' / 'ea_cot.json'}",
        "--set", "optim.max_steps=1", "--set", "optim.per_device_train_batch_size=2", "--set", "run.save_steps=1",
    ])
    assert rc == 0 and (tmp_path / "sft" / "final" / "config.json").exists()
