"""Offline multi-tool chains (configs/canvascraft/chains_offline.yaml): every built task has 2-3
tools, its reference solution runs offline, the oracle strictly passes its checks while doing
nothing and the oracle with one wrong parameter (angle, box, asset) do not; Crop regions come
from the instruction and an RGBA cut-out input stands in for Extract; longer compositions of the
same templates keep a reference image that pins the parameters."""

from __future__ import annotations

import json
import random

import pytest

from toolserver.client import make_toolbox
from canvasagent.core.episode import EpisodeConfig, run_episode
from canvasagent.evaluation.metrics import task_result
from canvasagent.core.policies.scripted import scripted_policy
from canvascraft import formats
from canvascraft.build import load_build_config, run_build, shard_files
from canvascraft.chains import ChainSet
from canvascraft.plan import REGIONS, make_plan
from canvascraft.rl import compose_chain, task_of
from canvascraft.sources import BuiltinSource
from rewards.hybrid import HybridReward
from toolserver.validation import Profile

OFFLINE = ChainSet.load(["chains_offline"]).subset(groups=["offline"])


@pytest.fixture(scope="module")
def offline_rl(tmp_path_factory):
    out = tmp_path_factory.mktemp("rl_offline")
    cfg = load_build_config("rl", "rl_offline_chains", n=16, eval_n=0, seed=3, workers=1, shard_size=16)
    manifest = run_build("rl", cfg, out, progress=False)
    return formats.read_rows(shard_files(out)), manifest


@pytest.fixture(scope="module")
def scoring():
    toolbox = make_toolbox("offline")
    reward = HybridReward.from_preset("paper", judge="offline", toolbox=toolbox)
    yield toolbox, reward
    reward.close()
    toolbox.close()


def _play(task, policy, toolbox, reward):
    traj = run_episode(scripted_policy(policy, task), task, toolbox, EpisodeConfig(max_turns=10))
    scores = reward.score(traj)
    return scores, task_result(traj, scores, 0.5)


def test_the_offline_group_is_2_to_3_tools_and_off_the_default_mix():
    # Besides the chains, the file holds single-tool demonstrations (group offline_single, weight 0).
    singles = [c for c in ChainSet.load(["chains_offline"]) if c.group != "offline"]
    assert all(c.group == "offline_single" and len(c.tools) == 1 and c.weight == 0 for c in singles)
    assert len(OFFLINE) >= 8 and all(c.group == "offline" and 2 <= len(c.tools) <= 3 for c in OFFLINE)
    default = ChainSet.load(["chains"])
    assert not {c.name for c in default} & {c.name for c in OFFLINE}
    assert "offline" not in {c.group for c in default}


def test_every_row_has_2_to_3_tools_and_a_reference_that_ran(offline_rl):
    rows, manifest = offline_rl
    assert len(rows) == 16
    names = {c.name for c in OFFLINE}
    for r in rows:
        assert r["chain"] in names, r["chain"]
        assert 2 <= r["n_steps"] <= 3 and 2 <= r["n_tools"] <= 3, r["chain"]
        calls = json.loads(r["reference_calls"])
        assert [c["name"] for c in calls] == r["path"]
        assert json.loads(r["checks"]), f"{r['chain']} task has no verifiable check"
    # The build reaches most of the group (seeded; 16 rows over 8 templates).
    assert len({r["chain"] for r in rows}) >= 6
    stats = [s["stats"] for s in manifest["shards"].values()]
    assert sum(s["target_missed"] for s in stats) == 0


def test_parameters_are_checked_on_the_exact_target(offline_rl):
    rows, _ = offline_rl
    for r in rows:
        checks = json.loads(r["checks"])
        ref = [c for c in checks if c["type"] == "reference_similarity"]
        if r["chain"] == "Rotate+OCR":  # the upright text is the answer, the upright image the target
            assert "answer_contains" in {c["type"] for c in checks}
        assert len(ref) == 1 and r["reference_image"] is not None, r["chain"]
        assert ref[0]["exact"] is ("SR" not in r["path"]), r["chain"]
        for call in json.loads(r["reference_calls"]):
            if call["name"] == "Crop":
                box = json.loads(call["arguments"]["bbox"])
                named = [n for n, b in REGIONS.items() if list(b) == box]
                # The instruction states the region: by name, or as the very box the call uses.
                assert (named and named[0] in r["prompt"]) or ", ".join(map(str, box)) in r["prompt"], (box, r["prompt"])


def test_oracle_succeeds_where_doing_nothing_and_one_wrong_parameter_fail(offline_rl, scoring):
    rows, _ = offline_rl
    toolbox, reward = scoring
    for row in rows:
        task = task_of(row)
        good, good_res = _play(task, "oracle", toolbox, reward)
        assert good_res.success and good["align/passed"] == 1.0, (row["chain"], good)
        bad, bad_res = _play(task, "terminate", toolbox, reward)
        assert not bad_res.success and bad["align/passed"] == 0.0 and bad["hybrid"] < good["hybrid"] - 0.5, (row["chain"], bad)
        wrong, wrong_res = _play(task, "oracle_wrong_param", toolbox, reward)
        assert not wrong_res.success and wrong["align/passed"] == 0.0, (row["chain"], wrong)
        assert wrong["hybrid"] < good["hybrid"], (row["chain"], wrong, good)


def test_an_rgba_cutout_input_replaces_extract():
    chain = OFFLINE.by_name("Overlay(cut-out)+Flip")
    assert chain.inputs == 2 and "rgba" in chain.needs
    source = BuiltinSource(64)
    rng = random.Random(0)
    cut = source.sample(rng, frozenset(chain.needs), frozenset())
    assert cut.image.mode == "RGBA" and cut.image.getextrema()[3][0] == 0  # some pixels are transparent
    plan = make_plan(chain, [cut, source.sample(rng, frozenset(), frozenset())], rng, Profile.CANVASCRAFT)
    assert [s.clause for s in plan.steps] == ["Overlayer.object", "Flip.mirror"]
    assert plan.steps[0].params["target"] == cut.labels[0]


def test_composition_keeps_the_cutout_input_and_only_opens_with_it():
    rng = random.Random(1)
    only = ChainSet([OFFLINE.by_name("Overlay(cut-out)+Flip")])
    c = compose_chain(only, rng, "easy", 12)
    assert c is not None and c.name == "Overlay(cut-out)+Flip" and c.inputs == 2 and "rgba" in c.needs
    for _ in range(40):
        c = compose_chain(OFFLINE, rng, "medium", 12)
        if c is None:
            continue
        # A cut-out is an input: a template needing one never comes after another.
        assert ("rgba" in c.needs) == c.name.startswith("Overlay(cut-out)"), c.name
        assert c.name.count("cut-out") <= 1


def test_sft_demonstrations_of_the_offline_chains(tmp_path):
    cfg = load_build_config("sft", "sft_offline_chains", n=6, seed=1, workers=1, shard_size=6)
    manifest = run_build("sft", cfg, tmp_path, progress=False)
    rows = formats.read_rows(shard_files(tmp_path))
    stats = [s["stats"] for s in manifest["shards"].values()]
    assert len(rows) == 6, stats
    assert set(stats[0]["chains"]) <= {c.name for c in OFFLINE}
    assert all(int(k) in (3, 4) for k in stats[0]["turns"])  # 2-3 tool turns and the final answer


def test_composed_longer_tasks_keep_exact_parameter_checks(tmp_path, scoring):
    """L-medium targets concatenate offline templates (5-8 steps); each task still has a reference
    image, which the oracle matches and one wrong parameter does not."""
    toolbox, reward = scoring
    cfg = load_build_config("rl", "rl_offline_chains", n=6, eval_n=0, seed=5, workers=1, shard_size=6,
                            length={"medium": 1}, diversity={"medium": 1, "hard": 1})
    run_build("rl", cfg, tmp_path, progress=False)
    rows = formats.read_rows(shard_files(tmp_path))
    assert len(rows) == 6
    for row in rows:
        assert 5 <= row["n_steps"] <= 8 and row["reference_image"] is not None, row["chain"]
        task = task_of(row)
        good, good_res = _play(task, "oracle", toolbox, reward)
        wrong, wrong_res = _play(task, "oracle_wrong_param", toolbox, reward)
        assert good_res.success and good["align/passed"] == 1.0, (row["chain"], good)
        assert not wrong_res.success and wrong["hybrid"] < good["hybrid"], (row["chain"], wrong)


def test_a_mix_key_naming_no_chain_or_group_is_refused():
    """A misspelt mix key ('Rotat') would leave Rotate's weight untouched without a word."""
    chains = ChainSet.load(["chains", "chains_offline"])
    assert chains.with_weights({"Rotate": 3, "offline": 0}).by_name("Rotate").weight == 3
    with pytest.raises(ValueError, match="Rotat"):
        chains.with_weights({"Rotat": 1})
