"""The evaluation runner, metrics, report and `canvasagent eval`, offline."""

from __future__ import annotations

import json

import pytest

from canvasagent.cli import main as cli_main
from canvasagent.evaluation import api as eval_api
from canvasagent.evaluation.metrics import summarize
from canvasagent.evaluation.runner import EvalConfig, EvalRunner
from canvasagent.evaluation.tasks_io import TaskLoadError, load_tasks
from canvasagent.core.policies.guards import GuardConfig
from canvasagent.policy_spec import PolicyFactory
from canvasagent.core.trajectory import Trajectory
from tests.evaluation.conftest import fake_score


def test_load_tasks_both_formats(eval_split, tmp_path):
    tasks = load_tasks(eval_split)
    assert [t.id for t in tasks] == ["t0", "t1", "t2"] and tasks[0].images[0].size == (48, 32)
    public = tmp_path / "rl.jsonl"
    public.write_text(json.dumps({"path": ["Flip"], "image": [str(eval_split / "images" / "t0_1.png")], "prompt": "flip", "extra_info": {"id": 7, "tone": "x"}}) + "\n")
    (t,) = load_tasks(public)
    assert (t.id, t.instruction, t.expected_tools, t.meta) == ("7", "flip", ["Flip"], {"tone": "x"})
    with pytest.raises(TaskLoadError):
        load_tasks(tmp_path / "nothing")


def test_runner_scores_saves_and_resumes(eval_split, tmp_path):
    tasks = load_tasks(eval_split)
    out = tmp_path / "out"
    calls = []

    def counting(traj):
        calls.append(traj.task.id)
        return fake_score(traj)

    results = EvalRunner(PolicyFactory("scripted:expected"), counting, out, EvalConfig(workers=2)).run(tasks)
    assert sorted(calls) == ["t0", "t1", "t2"]
    assert all(r.scores["align"] == 1.0 and r.success and r.n_calls == 2 for r in results)
    for t in tasks:
        traj = Trajectory.load(out / "trajectories" / t.id)
        assert traj.tool_sequence == ["Flip", "Crop"]
    # Rerun: nothing is re-executed or rescored.
    again = EvalRunner(PolicyFactory("scripted:garbage"), counting, out).run(tasks)
    assert len(calls) == 3 and [r.task_id for r in again] == ["t0", "t1", "t2"]
    # A task whose result was lost is rescored from its saved trajectory, not rerun.
    (out / "trajectories" / "t1" / "result.json").unlink()
    again = EvalRunner(PolicyFactory("scripted:garbage"), counting, out).run(tasks)
    assert calls[-1] == "t1" and again[1].n_calls == 2

    s = summarize(again)
    assert s.metrics["calls_per_task"] == 2.0 and s.metrics["success"] == 1.0
    assert s.tools["Flip"].calls == 3 and s.tools["Crop"].success_rate == 1.0
    assert set(s.by_label) == {"R=easy", "L=easy", "L=medium"}


def test_a_resumed_run_reads_results_saved_under_a_legacy_total_name(eval_split, tmp_path):
    """result.json files written when the total was `overall` / `total` resume as `hybrid`."""
    tasks = load_tasks(eval_split)
    out = tmp_path / "out"
    first = EvalRunner(PolicyFactory("scripted:expected"), fake_score, out, EvalConfig(workers=1)).run(tasks)
    for t, r in zip(tasks, first):
        f = out / "trajectories" / t.id / "result.json"
        d = json.loads(f.read_text())
        hybrid = d["scores"].pop("hybrid")
        d["scores"].update(overall=hybrid, total=hybrid)
        f.write_text(json.dumps(d))
    again = EvalRunner(PolicyFactory("scripted:garbage"), fake_score, out).run(tasks)
    assert [r.scores for r in again] == [r.scores for r in first]
    assert summarize(again).metrics["hybrid"] == summarize(first).metrics["hybrid"]


def test_scorer_failure_keeps_trajectory(eval_split, tmp_path):
    def broken(traj):
        raise RuntimeError("judge down")

    res = EvalRunner(PolicyFactory("scripted:flip"), broken, tmp_path / "o").run(load_tasks(eval_split))
    assert res == []
    assert all((tmp_path / "o" / "trajectories" / f"t{i}" / "trajectory.json").exists() for i in range(3))
    res = EvalRunner(PolicyFactory("scripted:garbage"), fake_score, tmp_path / "o").run(load_tasks(eval_split))
    assert [r.n_calls for r in res] == [1, 1, 1]  # scored from disk; the garbage policy never ran


def test_garbage_policy_in_eval_is_recorded_as_error(eval_split, tmp_path):
    cfg = EvalConfig(workers=1, guard=GuardConfig(max_consecutive_invalid=2))
    res = EvalRunner(PolicyFactory("scripted:garbage"), fake_score, tmp_path / "o", cfg).run(load_tasks(eval_split, limit=1))
    assert res[0].stop_reason == "policy_error" and "invalid replies" in res[0].error and not res[0].success


def test_cancel_saves_partial_trajectories(eval_split, tmp_path):
    runner = EvalRunner(PolicyFactory("scripted:garbage"), fake_score, tmp_path / "o", EvalConfig(workers=1, guard=GuardConfig(0)))
    runner.cancel.set()  # as after Ctrl-C: each running episode stops at its next turn
    assert runner.run(load_tasks(eval_split)) == []
    traj = Trajectory.load(tmp_path / "o" / "trajectories" / "t0")
    assert traj.stop_reason == "interrupted"
    # Interrupted tasks are rerun on resume.
    res = EvalRunner(PolicyFactory("scripted:flip"), fake_score, tmp_path / "o").run(load_tasks(eval_split))
    assert len(res) == 3 and all(r.stop_reason == "terminate" for r in res)


def test_eval_cli_end_to_end_replay(eval_split, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(eval_api, "make_scorer", lambda *a, **k: fake_score)
    # Record the scripted run, then replay it through the CLI: replay keys on task ids.
    EvalRunner(PolicyFactory("scripted:expected"), fake_score, tmp_path / "rec").run(load_tasks(eval_split))
    out = tmp_path / "eval"
    rc = cli_main(["eval", "--policy", f"replay:{tmp_path / 'rec' / 'trajectories'}", "--tasks", str(eval_split), "--judge", "offline", "--out", str(out), "--workers", "2"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "| Hybrid | Align. | Aes. | Traj. | Rule | Calls |" in text
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["n_tasks"] == 3 and report["summary"]["metrics"]["calls_per_task"] == 2.0
    assert (out / "report.md").read_text().startswith("# Evaluation")
    assert (out / "metrics.png").stat().st_size > 1000 and (out / "tool_calls.png").exists()


def test_eval_cli_reports_bad_input(eval_split, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(eval_api, "make_scorer", lambda *a, **k: fake_score)
    assert cli_main(["eval", "--policy", "nope:x", "--tasks", str(eval_split), "--out", str(tmp_path / "o")]) == 2
    assert cli_main(["eval", "--policy", "scripted:flip", "--tasks", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "unknown policy kind" in err and "does not exist" in err


def test_eval_cli_with_the_real_hybrid_reward(eval_split, tmp_path, capsys):
    out = tmp_path / "eval"
    rc = cli_main(["eval", "--policy", "scripted:expected", "--tasks", str(eval_split), "--judge", "offline", "--out", str(out)])
    assert rc == 0
    summary = json.loads((out / "report.json").read_text())["summary"]
    m = summary["metrics"]
    for key in ("hybrid", "align", "aes", "traj", "rule"):
        assert 0.0 <= m[key] <= 1.0, key
    assert m["calls_per_task"] == 2.0 and m["rule"] > 0.5
    assert summary["align_measured_rate"] == 0.0 and m["success"] == 0.0  # no checks: no evidence
    # The terminate-at-once baseline scores lower on the same split.
    rc = cli_main(["eval", "--policy", "scripted:terminate", "--tasks", str(eval_split), "--out", str(tmp_path / "base")])
    base = json.loads((tmp_path / "base" / "report.json").read_text())["summary"]["metrics"]
    assert base["hybrid"] < m["hybrid"] and base["calls_per_task"] == 0.0


def test_eval_cli_unknown_preset_is_clear(eval_split, tmp_path, capsys):
    rc = cli_main(["eval", "--policy", "scripted:flip", "--tasks", str(eval_split), "--preset", "nope", "--out", str(tmp_path / "o")])
    assert rc == 2 and "nope" in capsys.readouterr().err


def test_public_rl_record_with_checks_and_labels(tmp_path):
    from PIL import Image

    (tmp_path / "images").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "images" / "a.png")
    Image.new("RGB", (8, 8)).save(tmp_path / "images" / "ref.png")
    rec = {"path": ["Flip"], "image": ["images/a.png"], "prompt": "flip", "extra_info": {"id": "x1", "tone": "explicit", "reasoning": "easy", "length": "easy", "diversity": "easy", "checks": json.dumps([{"type": "orientation", "value": "square"}]), "reference_image": "images/ref.png"}}
    (tmp_path / "rl.json").write_text(json.dumps([rec]))
    (t,) = load_tasks(tmp_path)
    assert t.labels == {"reasoning": "easy", "length": "easy", "diversity": "easy"}
    assert t.checks == [{"type": "orientation", "value": "square"}]
    assert t.meta["reference_images"] == [str(tmp_path / "images" / "ref.png")] and t.meta["tone"] == "explicit"


def test_eval_cli_with_the_tiny_hf_model(eval_split, tmp_path, tiny_qwen3vl_dir):
    out = tmp_path / "hf"
    spec = f"hf:{tiny_qwen3vl_dir}?max_new_tokens=16"
    rc = cli_main(["eval", "--policy", spec, "--tasks", str(eval_split), "--limit", "2", "--max-turns", "3", "--max-invalid", "2", "--workers", "2", "--out", str(out)])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["n_tasks"] == 2
    for task in report["tasks"]:
        # A random model emits garbage: the guard ends each episode with a clear reason, all saved.
        assert task["n_turns"] <= 3
        if task["stop_reason"] == "policy_error":
            assert "invalid replies in a row" in task["error"]
        traj = Trajectory.load(out / "trajectories" / task["task_id"])
        assert len(traj.turns) == task["n_turns"]


def test_reference_images_survive_the_split_round_trip(tmp_path):
    from PIL import Image

    from canvasagent.evaluation.tasks_io import write_tasks
    from canvasagent.core.tasks import Task

    ref = Image.new("RGB", (8, 4), "red")
    write_tasks([Task("x", [Image.new("RGB", (8, 4))], id="a", checks=[{"type": "reference_similarity", "image_index": 0}], meta={"reference_images": [ref]})], tmp_path)
    (t,) = load_tasks(tmp_path)
    path = t.meta["reference_images"][0]
    assert path.startswith(str(tmp_path)) and Image.open(path).size == (8, 4)


def test_eval_cli_with_an_http_judge_stub(eval_split, tmp_path):
    """`--judge http --judge-url --judge-model` reach the hybrid reward's OpenAI-compatible judge."""
    from tests.stub_openai import StubOpenAI, chat_payload

    with StubOpenAI(lambda body: (200, chat_payload('{"score": 8, "reason": "stub"}'))) as stub:
        out = tmp_path / "http"
        rc = cli_main(["eval", "--policy", "scripted:expected", "--tasks", str(eval_split), "--limit", "1", "--judge", "http",
                       "--judge-url", stub.base_url, "--judge-model", "judge-vl", "--out", str(out)])
    assert rc == 0
    m = json.loads((out / "report.json").read_text())["summary"]["metrics"]
    # The split's task carries no verifiable check, so alignment is the judge's alone; the
    # aesthetic judge's 0.8 is gated by it.
    assert m["align"] == pytest.approx(0.8) and m["aes"] == pytest.approx(0.8 * 0.8) and m["traj"] == pytest.approx(0.8)
    assert stub.requests and all(r["model"] == "judge-vl" for r in stub.requests)


def test_eval_cli_with_the_local_judge_on_the_tiny_model(eval_split, tmp_path, tiny_qwen3vl_dir, capsys):
    out = tmp_path / "local"
    rc = cli_main(["eval", "--policy", "scripted:expected", "--tasks", str(eval_split), "--limit", "1", "--judge", "local",
                   "--judge-model", str(tiny_qwen3vl_dir), "--out", str(out)])
    assert rc == 0
    m = json.loads((out / "report.json").read_text())["summary"]["metrics"]
    assert all(0.0 <= m[k] <= 1.0 for k in ("hybrid", "align", "aes", "traj", "rule"))
    assert cli_main(["eval", "--policy", "scripted:flip", "--tasks", str(eval_split), "--judge", "local", "--out", str(tmp_path / "x")]) == 2
    assert "--judge local needs a checkpoint" in capsys.readouterr().err


class _Shared:
    """A policy factory handing every task the same in-memory policy (what the pipeline does)."""

    def __init__(self, policy):
        self.policy, self.name = policy, "hf-in-memory"

    def for_task(self, task=None):
        return self.policy


@pytest.mark.slow
def test_runner_seeded_sampling_repeats_and_merges_episodes(tiny_qwen3vl_dir, eval_split, tmp_path):
    """A sampling HF policy held in memory, several episodes per task, a caller-owned toolbox:
    the same seed gives the same episodes, and a task's result sums its episodes."""
    from toolserver.client import make_toolbox
    from canvasagent.evaluation.metrics import policy_metrics
    from canvasagent.core.policies.hf_local import HFGenerationConfig, HFLocalPolicy

    tasks = load_tasks(eval_split)[:2]
    policy = HFLocalPolicy(str(tiny_qwen3vl_dir), HFGenerationConfig(max_new_tokens=12, temperature=1.0))
    toolbox = make_toolbox("offline")
    cfg = dict(max_turns=2, samples=2, guard=GuardConfig(0), workers=2)

    def run(out, seed):
        return EvalRunner(_Shared(policy), fake_score, tmp_path / out, EvalConfig(seed=seed, **cfg), toolbox=toolbox).run(tasks)

    a, b, c = run("a", 7), run("b", 7), run("c", 8)
    replies = {o: [Trajectory.load(tmp_path / o / "trajectories" / t.id / f"sample_{j}").turns[0].reply for t in tasks for j in (0, 1)]
               for o in "abc"}
    assert replies["a"] == replies["b"] and replies["a"] != replies["c"]
    assert [r.to_dict() | {"seconds": 0, "tool_calls": []} for r in a] == [r.to_dict() | {"seconds": 0, "tool_calls": []} for r in b]
    r = a[0]
    assert r.episodes == 2 and r.n_turns == sum(len(Trajectory.load(tmp_path / "a" / "trajectories" / "t0" / f"sample_{j}").turns) for j in (0, 1))
    m = policy_metrics(a)
    assert m["n_tasks"] == 2 and 0 <= m["format_validity"] <= 1 and m["terminated"] == sum(x.terminated for x in a) / 4
    # The caller's toolbox is still usable: the runner closes only the toolboxes it made.
    assert toolbox.call is not None and run("d", 7) is not None
