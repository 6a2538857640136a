"""GRPO training diagnostics on a real tiny run, and the two sanity checks before any claim:
the GRPO reward of a rollout is its evaluation score, and the rollout prompt is the evaluation prompt."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canvasagent.training import grpo as grpo_mod
from canvasagent.training.callbacks import (
    PANELS,
    RewardCurves,
    ToolCollapse,
    TrajectoryDumper,
    curve_panels,
    ema,
    keep_logs_through,
)
from canvasagent.training.config import TrainConfig
from canvasagent.training.rewarding import TRLRewards, rollout_diagnostics
from canvasagent.training.sources import task_source as source_of
from tests.training.conftest import record_scored_batches

# Every other rollout's first turn is forced to this call (the random tiny model almost never
# writes one), so a step holds rollouts with and without a tool: the diagnostics have spread.
FORCED = '<reason>Mirror img_1.</reason>\n<tool_call>\n{"name": "Flip", "arguments": {"image": "img_1"}}\n</tool_call><|im_end|>'
N_GEN = 4
STEPS = 2


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_qwen3vl_dir):
    out = tmp_path_factory.mktemp("grpo_diag")
    cfg = TrainConfig.load("grpo_tiny_cpu", {
        "run.output_dir": str(out), "model.name_or_path": str(tiny_qwen3vl_dir), "run.init_from": None,
        "data.n_train": 4, "optim.max_steps": STEPS, "optim.per_device_train_batch_size": N_GEN,
        "grpo.num_generations": N_GEN, "grpo.max_turns": 2, "grpo.max_completion_length": 96,
        "grpo.beta": 0.04,  # TRL logs `kl` only with a reference model
        "run.save_steps": 1000, "run.dump_every": 0, "run.logging_steps": 1,
        # Half the rollouts call no tool: a streak longer than the run never completes.
        "grpo.tool_collapse_share": 0.5, "grpo.tool_collapse_steps": STEPS + 1,
    })
    scored: list[tuple[list, list[dict]]] = []  # per step: the trajectories and their scores, in completion order

    class Recorder(TrajectoryDumper):
        def __call__(self, step, trajs, scores):
            scored.append((list(trajs), [dict(s) for s in scores]))
            super().__call__(step, trajs, scores)

    warnings: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = warnings.append
    cb_log = logging.getLogger("canvasagent.training.callbacks")
    cb_log.addHandler(handler)
    orig_sources = TRLRewards.sources_in
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grpo_mod, "TrajectoryDumper", Recorder)
        # A source no rollout has: its per-source function returns None for every rollout.
        mp.setattr(TRLRewards, "sources_in", staticmethod(lambda col: (*orig_sources(col), "absent")))
        trainer, processor, ws = grpo_mod.build_grpo_trainer(cfg)
    forced_ids = processor.tokenizer.encode(FORCED, add_special_tokens=False)
    state = {"first": False}
    orig_generate, orig_single, orig_rewards = trainer._generate, trainer._generate_single_turn, trainer._calculate_rewards

    def generate(prompts):
        state["first"] = True
        return orig_generate(prompts)

    def single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        ids, _ = orig_single(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        if state.pop("first", False):  # the first turn of this step's rollouts
            ids = [list(forced_ids) if i % 2 == 0 else list(x) for i, x in enumerate(ids)]
        return ids, None

    rewards_per_func = []

    def calc_rewards(*a, **kw):
        r = orig_rewards(*a, **kw)
        rewards_per_func.append(r.detach().clone())
        return r

    trainer._generate, trainer._generate_single_turn, trainer._calculate_rewards = generate, single_turn, calc_rewards
    batches = record_scored_batches(trainer)
    try:
        trainer.train()
    finally:
        cb_log.removeHandler(handler)
    return SimpleNamespace(out=out, cfg=cfg, trainer=trainer, processor=processor, ws=ws, scored=scored,
                           rewards_per_func=rewards_per_func, batches=batches, warnings=warnings)


def _train_logs(run) -> list[dict]:
    return [h for h in run.trainer.state.log_history if "reward" in h]


def _mean(xs):
    return sum(xs) / len(xs)


def test_logged_functions_are_the_rollouts_own_values(run):
    logs = _train_logs(run)
    assert len(logs) == STEPS == len(run.scored)
    for h, (trajs, scores) in zip(logs, run.scored):
        assert len(trajs) == N_GEN
        diag = [rollout_diagnostics(t) for t in trajs]
        assert [d["no_tool"] for d in diag] == [0.0, 1.0] * (N_GEN // 2)  # the forced half called Flip
        for name in ("format_validity", "tool_calls", "no_tool", "judge_fallbacks"):
            expected = _mean([s[name] for s in scores])
            assert h[f"rewards/{name}/mean"] == pytest.approx(expected, abs=1e-5), name
        assert h["rewards/no_tool/mean"] == 0.5
        assert h["rewards/tool_calls/mean"] == pytest.approx(_mean([len(t.tool_sequence) for t in trajs]), abs=1e-6)
        assert h["rewards/tool_calls/mean"] <= h["tools/call_frequency"] + 1e-6  # TRL counts every parsed call
        # The forced replies are valid; the random model's are not, so validity sits strictly between.
        assert 0.0 < h["rewards/format_validity/mean"] < 1.0
        assert all(source_of(t.task) == "scripted" for t in trajs)
        assert h["rewards/hybrid/scripted/mean"] == pytest.approx(_mean([s["hybrid"] for s in scores]), abs=1e-5)
        assert h["rewards/format_validity/scripted/mean"] == h["rewards/format_validity/mean"]
        assert h["rewards/no_tool/scripted/mean"] == h["rewards/no_tool/mean"]
        for name in TRLRewards.PER_SOURCE:
            assert h[f"rewards/{name}/absent/mean"] is None  # all None -> NaN -> no value, not 0
        # Logged-only functions stay out of the reward: it is the weighted components alone.
        weights = dict(zip(run.trainer.reward_func_names, run.trainer.reward_weights.tolist()))
        logged = [n for n in weights if n in TRLRewards.LOGGED or "/" in n]
        per_source = [f"{n}/{s}" for s in ("scripted", "absent") for n in TRLRewards.PER_SOURCE]
        assert sorted(logged) == sorted([*TRLRewards.LOGGED, *per_source])
        assert all(weights[n] == 0.0 for n in logged)
        weighted = [sum(s[k] * w for k, w in weights.items() if k not in logged) for s in scores]
        assert h["reward"] == pytest.approx(_mean(weighted), abs=1e-5)
        groups = [weighted[g:g + N_GEN] for g in range(0, len(weighted), N_GEN)]
        assert h["frac_reward_zero_std"] == _mean([float(max(g) - min(g) < 1e-7) for g in groups])


def test_metrics_jsonl_holds_every_diagnostic(run):
    lines = [json.loads(x) for x in (run.out / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "reward" in x]
    assert [x["step"] for x in steps] == list(range(1, STEPS + 1))
    required = ["reward", "reward_std", "frac_reward_zero_std", "tools/call_frequency", "completions/mean_length",
                "kl", "entropy", "clip_ratio/region_mean", "rewards/hybrid/scripted/mean"]
    required += [f"rewards/{c}/{s}" for c in ("align", "aes", "traj", "rule", *TRLRewards.LOGGED) for s in ("mean", "std")]
    for x in steps:
        missing = [k for k in required if k not in x]
        assert not missing, missing
        assert all(isinstance(x[k], (int, float)) and math.isfinite(x[k]) for k in required)
        assert 0.0 <= x["frac_reward_zero_std"] <= 1.0
        assert x["completions/mean_length"] > 0 and x["entropy"] > 0
        assert "tool_collapse" not in x
    assert not [r for r in run.warnings if "tool use collapsed" in r.getMessage()]  # half the rollouts call a tool


def test_curves_draw_every_diagnostic_panel(run):
    from PIL import Image

    history = [json.loads(x) for x in (run.out / "metrics.jsonl").read_text().splitlines()]
    panels = curve_panels(history)
    want = {"loss", "reward (mean per component)", "reward per source (hybrid)", "reward std per component",
            "groups without reward spread", "tool use", "no-tool share per source", "format validity", "completion length (tokens)",
            "KL and entropy", "clip ratio", "judge fallbacks"}
    assert want <= set(panels), want - set(panels)
    assert panels["reward per source (hybrid)"] == ["rewards/hybrid/scripted/mean"]  # `absent` has no value
    assert set(panels["reward (mean per component)"]) == {"reward", *(f"rewards/{c}/mean" for c in ("align", "aes", "traj", "rule"))}
    assert "rewards/no_tool/mean" in panels["tool use"] and "tools/call_frequency" in panels["tool use"]
    assert panels["no-tool share per source"] == ["rewards/no_tool/scripted/mean"]
    assert panels["format validity"] == ["rewards/format_validity/mean", "rewards/format_validity/scripted/mean"]
    assert {"kl", "entropy"} == set(panels["KL and entropy"])
    png = Image.open(run.out / "curves.png")
    assert png.height > 3 * 3.3 * 80 * 0.9  # 12 panels in 3 columns: 4 rows
    assert ema([1.0, 0.0, 0.0]) == pytest.approx([1.0, 0.8, 0.64])


def test_tool_collapse_rule_comes_from_the_config(run):
    curves = [cb for cb in run.trainer.callback_handler.callbacks if isinstance(cb, RewardCurves)]
    assert [(c.collapse.share, c.collapse.steps) for c in curves] == [(0.5, STEPS + 1)]
    for bad in ({"grpo.tool_collapse_share": 0.0}, {"grpo.tool_collapse_share": 1.5}, {"grpo.tool_collapse_steps": 0}):
        with pytest.raises(ValueError, match="tool_collapse"):
            TrainConfig.load("grpo_tiny_cpu", bad)


def test_tool_collapse_warns_once_per_streak(tmp_path, caplog):
    cb = RewardCurves(tmp_path, collapse=ToolCollapse(share=0.9, steps=3))
    shares = [0.95, 0.95, 0.5, 0.9, 0.92, 1.0, 1.0, None, 0.2]
    with caplog.at_level(logging.WARNING, logger="canvasagent.training.callbacks"):
        for step, v in enumerate(shares, start=1):
            logs = {"reward": 0.1} if v is None else {"reward": 0.1, "rewards/no_tool/mean": v}
            cb.on_log(None, SimpleNamespace(is_world_process_zero=True, global_step=step), None, logs=logs)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if x.get("tool_collapse")] == [6]  # 0.9, 0.92, 1.0: the third in a row
    warned = [r for r in caplog.records if "tool use collapsed" in r.getMessage()]
    assert len(warned) == 1 and "step 6" in warned[0].getMessage()
    # A streak broken by a low share starts over; a step without the key leaves it as it is.
    rule = ToolCollapse(share=0.5, steps=2)
    assert [rule.update({"rewards/no_tool/mean": v} if v is not None else {}, i) for i, v in
            enumerate([0.6, None, 0.7, 0.1, 0.6, 0.6])] == [False, False, True, False, False, True]


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.integers(0, 30), max_size=25), resume_at=st.integers(0, 30), torn=st.booleans())
def test_a_resumed_run_keeps_the_logs_its_checkpoint_holds(tmp_path_factory, steps, resume_at, torn):
    """keep_logs_through drops the logs of steps after the checkpoint (and a half-written last
    line), keeps the others byte for byte in order, and leaves a file it has nothing to drop alone."""
    path = tmp_path_factory.mktemp("logs") / "metrics.jsonl"
    lines = [json.dumps({"step": s, "reward": s / 10}) for s in steps] + (['{"step": 3, "rew'] if torn else [])
    path.write_text("".join(x + "\n" for x in lines))
    before = path.stat().st_mtime_ns
    dropped = keep_logs_through(path, resume_at)
    kept = [x for x, s in zip(lines, steps) if s <= resume_at]
    assert path.read_text().splitlines() == kept
    assert dropped == len(lines) - len(kept)
    if not dropped:
        assert path.stat().st_mtime_ns == before
    assert keep_logs_through(tmp_path_factory.mktemp("none") / "metrics.jsonl", resume_at) == 0


def test_grpo_reward_is_the_evaluation_score_of_the_same_trajectory(run):
    """Per rollout: TRL's reward (Σ weight·function output, as it builds the advantage) equals the
    score of the same trajectory under the evaluation path (the pipeline's `training_scorer` over
    `make_scorer`, and the evaluation CLI's scorer, which scores every judge)."""
    from canvasagent.evaluation.scoring import make_scorer as eval_scorer
    from canvasagent.training.evaluate import training_scorer
    from canvasagent.training.rewarding import make_scorer

    g = run.cfg.grpo
    pipeline_score = training_scorer(make_scorer(g.reward_preset, g.judge, run.ws.env_cls.toolbox()))
    cli_score = eval_scorer(g.reward_preset, g.judge, every_judge=True)
    weights = run.trainer.reward_weights
    assert len(run.rewards_per_func) == STEPS
    compared = []
    for rpf, (trajs, _) in zip(run.rewards_per_func, run.scored):
        grpo_reward = (rpf * weights.unsqueeze(0)).nansum(dim=1).tolist()
        for r, traj in zip(grpo_reward, trajs):
            s = pipeline_score(traj)
            assert r == pytest.approx(s["hybrid"], abs=1e-5)
            assert r == pytest.approx(cli_score(traj)["hybrid"], abs=1e-5)
            compared.append(r)
    assert len(compared) == STEPS * N_GEN and len({round(x, 6) for x in compared}) > 1  # not one constant


def _replayed(run, tmp_path, which):
    """Each selected rollout's replies replayed through the evaluation runner on the same task:
    (GRPO trajectory, GRPO scores, evaluation trajectory, evaluation scores) per rollout."""
    from dataclasses import replace

    from canvasagent.evaluation.runner import EvalConfig, EvalRunner
    from canvasagent.training.evaluate import training_scorer
    from canvasagent.training.rewarding import make_scorer
    from canvasagent.core.trajectory import Trajectory

    rollouts = [(t, s) for trajs, scores in run.scored for i, (t, s) in enumerate(zip(trajs, scores)) if which(i)]
    tasks, replies = [], {}
    for k, (traj, _) in enumerate(rollouts):
        task = replace(traj.task, id=f"{traj.task.id}__rollout{k}")
        tasks.append(task)
        replies[task.id] = [t.reply for t in traj.turns]

    class Replay:
        name = "replay"

        def for_task(self, task):
            queue = list(replies[task.id])
            return SimpleNamespace(name="replay", act=lambda messages, episode: queue.pop(0) if queue else "")

    g = run.cfg.grpo
    toolbox = run.ws.env_cls.toolbox()
    # The training layout `training.evaluate.evaluate_checkpoint` uses.
    cfg = EvalConfig(workers=1, max_turns=g.max_turns, resume=False, tools_in_system_prompt=False, end_without_call=True)
    runner = EvalRunner(Replay(), training_scorer(make_scorer(g.reward_preset, g.judge, toolbox)), tmp_path, cfg, toolbox=toolbox)
    results = runner.run(tasks)
    return [(traj, s, Trajectory.load(runner._dir(task)), res.scores)
            for (traj, s), task, res in zip(rollouts, tasks, results)]


def test_replaying_a_tool_rollout_through_evaluation_gives_its_trajectory_and_reward(run, tmp_path):
    """The forced rollouts (a Flip call, then a reply up to the turn budget): the evaluation
    runner fed the same replies records the same turns and scores the GRPO reward."""
    pairs = _replayed(run, tmp_path, lambda i: i % 2 == 0)
    assert len(pairs) == STEPS * N_GEN // 2
    for traj, s, ev, ev_scores in pairs:
        assert ev.tool_sequence == traj.tool_sequence == ["Flip"]
        assert [t.status for t in ev.turns] == [t.status for t in traj.turns]
        assert ev.stop_reason == traj.stop_reason == "max_turns"
        assert ev_scores["hybrid"] == pytest.approx(s["hybrid"], abs=1e-9)


def test_replaying_a_rollout_without_a_tool_call_through_evaluation_gives_its_trajectory(run, tmp_path):
    pairs = _replayed(run, tmp_path, lambda i: i % 2 == 1)
    assert pairs
    for traj, s, ev, ev_scores in pairs:
        assert ev.stop_reason == traj.stop_reason and len(ev.turns) == len(traj.turns)


def test_rollout_prompt_is_the_evaluation_prompt_byte_for_byte(run, tmp_path, monkeypatch):
    """The prompt tokens TRL generated each rollout from equal the tokens the evaluation runner
    (`training.evaluate.evaluate_checkpoint`) feeds the policy on the first turn of the same task."""
    from canvasagent.core.policies.hf_local import HFLocalPolicy
    from canvasagent.training.evaluate import evaluate_checkpoint
    from canvasagent.training.rewarding import make_scorer

    rendered: list[list[int]] = []
    orig_render = HFLocalPolicy.render

    def render(self, messages):
        out = orig_render(self, messages)
        rendered.append(out["input_ids"][0].tolist())
        return out

    monkeypatch.setattr(HFLocalPolicy, "render", render)
    tasks, rollout_prompts = [], []
    for batch, (trajs, _) in zip(run.batches, run.scored):
        for ids, mask, traj in zip(batch["prompt_ids"], batch["prompt_mask"], trajs):
            rollout_prompts.append(ids[mask.bool()].tolist())
            tasks.append(traj.task)
    assert len(tasks) == STEPS * N_GEN
    unique = {}
    for t, p in zip(tasks, rollout_prompts):
        unique.setdefault(t.id, (t, p))
    g = run.cfg.grpo
    evaluate_checkpoint(run.out, [t for t, _ in unique.values()], make_scorer(g.reward_preset, g.judge, run.ws.env_cls.toolbox()),
                        run.ws.env_cls.toolbox(), run.ws.tool_fns, tmp_path, max_turns=1, max_new_tokens=2,
                        model=run.trainer.model, processor=run.processor)
    assert len(rendered) == len(unique)
    tok = run.processor.tokenizer
    for got, (task, want) in zip(rendered, unique.values()):
        assert got == want, task.id
        assert tok.decode(got) == tok.decode(want)
        assert "<|image_pad|>" in tok.decode(got) and task.instruction in tok.decode(got)
    # Every rollout of a task saw the same prompt.
    for t, p in zip(tasks, rollout_prompts):
        assert p == unique[t.id][1]


def test_panels_name_only_known_diagnostics():
    titles = [t for t, _ in PANELS]
    assert len(titles) == len(set(titles))
    assert curve_panels([]) == {} and curve_panels([{"step": 1, "loss": float("nan")}]) == {}


def test_pipeline_report_summarises_the_diagnostics(run, tmp_path):
    from canvasagent.training.report import write_report

    (tmp_path / "grpo").mkdir()
    (tmp_path / "grpo" / "metrics.jsonl").write_text((run.out / "metrics.jsonl").read_text())
    out = write_report(tmp_path, {"grpo": {"seconds": 1.0}})
    summary = json.loads(Path(out["json"]).read_text())["grpo_diagnostics"]
    logs = _train_logs(run)
    assert summary["n_steps"] == STEPS and summary["tool_collapse_steps"] == []
    m = summary["metrics"]
    assert m["rewards/no_tool/mean"] == {"first": 0.5, "last": 0.5, "min": 0.5, "max": 0.5}
    assert m["reward"]["first"] == pytest.approx(_mean([h["reward"] for h in logs]))
    assert m["kl"]["max"] == pytest.approx(max(h["kl"] for h in logs))
    assert "rewards/hybrid/scripted/mean" in m and "rewards/hybrid/absent/mean" not in m
    assert m["rewards/no_tool/scripted/mean"]["last"] == 0.5
    md = Path(out["markdown"]).read_text()
    assert "no tool-use collapse" in md and "| frac_reward_zero_std |" in md and "grpo_curves.png" in md


def test_source_of_a_task():
    from canvasagent.core.tasks import Task

    assert source_of(Task("x", meta={"source": "scripted", "chain": "Crop"})) == "scripted"  # the loader's word wins
    assert source_of(Task("x", meta={"chain": "Crop+Flip"})) == "canvascraft"
    assert source_of(Task("x", meta={"easel": {"kind": "reconstruction"}})) == "easel"
    assert source_of(Task("x", family="gui")) == "gui"
    rows = [json.dumps(Task("a", meta={"chain": "Crop"}).to_dict()), Task("b", meta={"source": "scripted"}).to_dict()]
    assert TRLRewards.sources_in(rows) == ("canvascraft", "scripted")
