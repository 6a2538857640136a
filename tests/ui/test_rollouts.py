"""The rollout viewer's reading logic without a browser: a real tiny GRPO dump, an eval run, bad input."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from canvasagent.ui import rollouts as R


def test_real_grpo_dump_step_group_rollout_rewards_and_advantages(grpo_dump):
    rs = R.load(grpo_dump.parent)  # the run dir works as well as its trajectories/
    assert rs.kind == "grpo" and not rs.problems and len(rs.rollouts) == 4
    assert len(rs.steps()) == 1 and len(rs.groups()) == 1  # one prompt, num_generations = 4
    lines = [json.loads(x) for x in (grpo_dump / "rollouts.jsonl").read_text().splitlines()]
    by_index = {r.index: r for r in rs.rollouts}
    for line in lines:
        assert by_index[line["rollout"]].reward == pytest.approx(line["scores"]["hybrid"])
    # Rollouts 0 and 2 mirrored img_1; 1 and 3 named img_9, a tool error.
    good, bad = by_index[0], by_index[1]
    assert not good.errors and bad.errors and "img_9" in bad.errors[0] and "unknown_asset" in bad.errors[0]
    assert good.reward > bad.reward
    rewards = [r.reward for r in rs.rollouts]
    mean = sum(rewards) / 4
    std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / 3)
    # The trainer logged the same group mean and std for this step (TRL's reward / reward_std).
    logged = [json.loads(x) for x in (grpo_dump.parent / "metrics.jsonl").read_text().splitlines()]
    logged = next(h for h in logged if "reward_std" in h)
    assert logged["reward"] == pytest.approx(mean, abs=1e-5) and logged["reward_std"] == pytest.approx(std, abs=1e-5)
    for r in rs.rollouts:
        assert r.advantage == pytest.approx((r.reward - mean) / (std + 1e-4))
    assert sum(r.advantage for r in rs.rollouts) == pytest.approx(0, abs=1e-9)
    assert [r.advantage for r in R.load(grpo_dump, "none").rollouts] == pytest.approx([r - mean for r in rewards])

    ranked = R.select(rs)
    assert [r.reward for r in ranked] == sorted(rewards, reverse=True)
    assert [r.reward for r in R.select(rs, sort="reward ↑")] == sorted(rewards)
    assert {r.index for r in R.select(rs, errors_only=True)} == {1, 3}
    assert {r.index for r in R.select(rs, min_reward=(good.reward + bad.reward) / 2)} == {0, 2}
    assert R.table(ranked)[0][:4] == [ranked[0].key, ranked[0].step, ranked[0].group, ranked[0].index]

    d = R.detail(good)
    assert [cap for _, cap in d.gallery()] == ["img_1 · input", "turn 1 · Flip_0"]
    assert all(Image.open(p).size for p, _ in d.gallery())
    md = d.markdown()
    assert "**advantage** +" in md and "**rule**" in md and 'Flip {"image": "img_1"}' in md and "Mirror img_1." in md
    md_bad = R.detail(bad).markdown()
    assert "**advantage** -" in md_bad and "tool errors" in md_bad and "img_9" in md_bad
    assert len(R.detail(bad).gallery()) == 1  # no image came back from the failed call


def test_eval_run_layout_and_samples(tmp_path):
    from canvasagent.evaluation.runner import EvalConfig, EvalRunner
    from canvasagent.policy_spec import PolicyFactory
    from canvasagent.core.tasks import Task

    tasks = [Task("Mirror it.", [Image.new("RGB", (24, 16), c)], id=f"t{i}") for i, c in enumerate(("red", "blue"))]
    runner = EvalRunner(PolicyFactory("scripted:flip"), lambda traj: {"hybrid": 0.25 * len(traj.turns), "align": 0.5}, tmp_path / "ev",
                        EvalConfig(samples=2, workers=1))
    runner.run(tasks)
    rs = R.load(tmp_path / "ev")
    assert rs.kind == "eval" and rs.steps() == [R.EVAL_STEP] and rs.groups() == ["t0", "t1"]
    assert len(rs.rollouts) == 4 and all(r.advantage is None and r.scores["align"] == 0.5 for r in rs.rollouts)
    assert {r.index for r in rs.rollouts if r.group == "t0"} == {0, 1}
    d = R.detail(rs.rollouts[0])
    assert [cap for _, cap in d.gallery()] == ["img_1 · input", "turn 1 · Flip_0"] and "**advantage** –" in d.markdown()


def test_bad_folders_and_escaping_paths_are_refused_without_losing_the_rest(grpo_dump, tmp_path):
    with pytest.raises(R.RolloutError, match="not a folder"):
        R.load(tmp_path / "nope")
    with pytest.raises(R.RolloutError, match="no GRPO dump"):
        R.load(tmp_path)
    root = tmp_path / "copy"
    shutil.copytree(grpo_dump, root)
    secret = tmp_path / "secret"
    shutil.copytree(root / "step_000000" / "000", secret)  # a valid trajectory outside the root
    lines = (root / "rollouts.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    extra = [json.dumps({**first, "rollout": 9, "path": "../secret/trajectory.json"}),
             json.dumps({**first, "rollout": 8, "path": str(secret / "trajectory.json")}),
             json.dumps({**first, "rollout": 7, "path": "step_000000/404/trajectory.json"}),
             "{not json", json.dumps({"step": "x"})]
    (root / "rollouts.jsonl").write_text("\n".join(lines + extra) + "\n")
    rs = R.load(root)
    assert len(rs.rollouts) == 4 and len(rs.problems) == 5
    assert sum("outside" in p for p in rs.problems) == 2 and any("missing" in p for p in rs.problems)
    with pytest.raises(KeyError):
        rs.get("0/none/#0")
    with pytest.raises(ValueError, match="sort"):
        R.select(rs, sort="best")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(
    st.text(max_size=60),
    st.fixed_dictionaries({"step": st.one_of(st.integers(-3, 5), st.text(max_size=3), st.none()),
                           "rollout": st.one_of(st.integers(0, 5), st.floats()),
                           "path": st.one_of(st.sampled_from(["../x", "/etc/passwd", "a/../../b", "", "step_000000/000/trajectory.json"]), st.text(max_size=20)),
                           "scores": st.one_of(st.dictionaries(st.text(max_size=5), st.one_of(st.floats(), st.text(max_size=3))), st.none())}).map(json.dumps),
), max_size=6))
def test_any_jsonl_is_read_without_raising(tmp_path_factory, lines):
    root = tmp_path_factory.mktemp("fuzz")
    (root / "rollouts.jsonl").write_text("\n".join(lines))
    rs = R.load(root)
    assert rs.rollouts == []  # nothing in the fuzz root is a trajectory
    assert all(p.startswith("rollouts.jsonl line ") for p in rs.problems)


def test_ui_command_refuses_a_folder_that_is_no_dump(tmp_path, capsys):
    from canvasagent.cli import main as cli_main

    assert cli_main(["ui", "--rollouts", str(tmp_path)]) == 2
    err = capsys.readouterr().out
    assert "no GRPO dump" in err and len(err.strip().splitlines()) == 1


def test_a_hand_edited_trajectory_still_shows(grpo_dump, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(grpo_dump, root)
    p = root / "step_000000" / "001" / "trajectory.json"
    d = json.loads(p.read_text())
    d["turns"][0]["index"] = "x"
    d["turns"].append("not a turn")
    d["assets"].append({"id": "../../etc", "file": "../../../etc/passwd"})
    p.write_text(json.dumps(d))
    r = next(r for r in R.load(root).rollouts if r.index == 1)
    assert r.errors and r.errors[0].startswith("turn 1:")
    det = R.detail(r)
    assert [t.n for t in det.turns] == [1] and all(str(root) in path for path, _ in det.gallery())
