"""The RL builder's checks tell right from wrong: each built task's reference solution passes
every check, doing nothing and a wrong edit pass none, and OCR tasks are checked on the answer."""

from __future__ import annotations

import json

import pytest

from toolserver.client import make_toolbox
from canvasagent.core.episode import EpisodeConfig, run_episode
from canvasagent.evaluation.metrics import task_result
from canvasagent.core.policies.scripted import scripted_policy
from canvascraft import formats
from canvascraft.build import load_build_config, run_build, shard_files
from canvascraft.rl import task_of
from rewards.hybrid import HybridReward


@pytest.fixture(scope="module")
def offline_rl(tmp_path_factory):
    """A small build over the chains whose tools run offline (OCR is RapidOCR's real model)."""
    out = tmp_path_factory.mktemp("rl")
    p = out / "chains.yaml"
    p.write_text("chains:\n  - {chain: OCR, weight: 1}\n  - {chain: Flip, weight: 1}\n  - {chain: Rotate, weight: 1}\n"
                 "  - {chain: Overlay, weight: 1}\n")
    easy = {"easy": 1}
    cfg = load_build_config("rl", n=8, eval_n=0, seed=11, workers=1, shard_size=8, tools_config="offline", chains=[str(p)],
                            reasoning=easy, length=easy, diversity=easy)
    manifest = run_build("rl", cfg, out / "build", progress=False)
    return formats.read_rows(shard_files(out / "build")), manifest


def _play(task, policy, toolbox, reward):
    traj = run_episode(scripted_policy(policy, task), task, toolbox, EpisodeConfig(max_turns=6))
    scores = reward.score(traj)
    return scores, task_result(traj, scores, 0.5)


def test_rows_carry_reference_calls_and_the_oracle_passes_every_check(offline_rl):
    rows, _ = offline_rl
    assert len(rows) == 8 and all(r["reference_calls"] for r in rows)
    toolbox = make_toolbox("offline")
    reward = HybridReward.from_preset("paper", judge="offline", toolbox=toolbox)
    try:
        for row in rows:
            task = task_of(row)
            assert task.checks, f"{row['chain']} task has no verifiable check"
            good, good_res = _play(task, "oracle", toolbox, reward)
            bad, bad_res = _play(task, "terminate", toolbox, reward)
            assert good_res.success and good["align/passed"] == 1.0, (row["chain"], good)
            assert not bad_res.success and bad["align"] == 0.0 and bad["hybrid"] < good["hybrid"] - 0.5
            if row["chain"] != "Flip":  # always-Flip is right on a mirrored-text task
                wrong, wrong_res = _play(task, "flip", toolbox, reward)
                assert not wrong_res.success and wrong["align"] < 0.2, (row["chain"], wrong)
    finally:
        reward.close()
        toolbox.close()


def test_exact_targets_and_ocr_answers(offline_rl):
    rows, manifest = offline_rl
    by_chain = {r["chain"]: json.loads(r["checks"]) for r in rows}
    for chain in ("Flip", "Rotate", "Overlay"):
        if chain in by_chain:
            ref = [c for c in by_chain[chain] if c["type"] == "reference_similarity"]
            assert ref and ref[0]["exact"] is True
    if "OCR" in by_chain:
        assert [c["type"] for c in by_chain["OCR"]] == ["answer_contains"]
    stats = [s["stats"] for s in manifest["shards"].values()]
    assert all("checks_dropped" in s for s in stats)


def test_public_rl_records_cannot_read_outside_their_folder(tmp_path):
    from canvasagent.core.imageio import ImageLoadError

    (tmp_path / "secret.png").write_bytes(b"not for you")
    split = tmp_path / "split"
    split.mkdir()
    (split / "rl.json").write_text(json.dumps([{"path": ["Flip"], "image": ["../secret.png"], "prompt": "x", "extra_info": {"id": "a"}}]))
    with pytest.raises(ImageLoadError):
        formats.read_rl_json(split / "rl.json")
