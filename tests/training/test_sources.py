"""The task-source registry: each source's rows, held-out tasks, scorer, validation and preflight facts."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from canvasagent.core.assets import AssetStore
from canvasagent.core.trajectory import Trajectory
from canvasagent.evaluation.scoring import EASEL_COMPONENTS
from canvasagent.training.common import toolbox_factory, workspace
from canvasagent.training.config import TrainConfig
from canvasagent.training.data import eval_tasks, grpo_rows
from canvasagent.training.preflight import preflight
from canvasagent.training.sources import SOURCES, get_source, source_of, task_source
from rewards.hybrid import COMPONENTS, HYBRID

ROOT = Path(__file__).resolve().parents[2]
PURE_TOOLS = str(ROOT / "tests" / "canvascraft" / "pure_tools.yaml")


@pytest.fixture(scope="module")
def rl_build(tmp_path_factory) -> Path:
    from canvascraft.build import load_build_config, run_build

    out = tmp_path_factory.mktemp("rl")
    run_build("rl", load_build_config("rl", workers=1, shard_size=4, tools_config=PURE_TOOLS, n=4, eval_n=2), out, progress=False)
    return out


def _grpo(tmp_path, **over):
    return TrainConfig.load("grpo_tiny_cpu", {"run.output_dir": str(tmp_path), "data.n_train": 2, **over})


def test_every_data_format_is_a_source_and_an_unknown_one_is_refused(tmp_path):
    assert set(SOURCES) == {"scripted", "canvascraft", "sharegpt", "rl-json", "mixed", "easel", "easel-data"}
    assert all(s.name == name for name, s in SOURCES.items())
    with pytest.raises(ValueError, match="unknown data.format 'nope'"):
        get_source("nope")
    with pytest.raises(ValueError, match="unknown data.format"):
        TrainConfig.load("sft_tiny_cpu", {"data.format": "nope"})


def test_each_source_validates_what_it_needs(tmp_path):
    for fmt in ("canvascraft", "sharegpt", "rl-json", "mixed"):
        with pytest.raises(ValueError, match=f"data.format={fmt} needs data.path"):
            TrainConfig.load("sft_tiny_cpu", {"data.format": fmt})
    with pytest.raises(ValueError, match="GRPO task source"):
        TrainConfig.load("grpo_easel_tiny_cpu", {"kind": "sft"})
    with pytest.raises(ValueError, match="is SFT data"):
        TrainConfig.load("grpo_easel_tiny_cpu", {"data.format": "easel-data", "data.path": str(tmp_path)})
    with pytest.raises(ValueError, match="image_budget"):
        TrainConfig.load("grpo_easel_tiny_cpu", {"image_budget": 2})
    with pytest.raises(ValueError, match="curricula"):
        TrainConfig.load("sft_easel_tiny_cpu", {"data.path": str(tmp_path), "easel.curricula": ["C3"]})


def test_preflight_facts_come_from_the_source(tmp_path):
    scripted, easel, easel_data, cc = (get_source(n) for n in ("scripted", "easel", "easel-data", "canvascraft"))
    assert not scripted.needs_path and not easel.needs_path and easel_data.needs_path and cc.needs_path
    assert not easel.judged and not easel.uses_tools_config and not easel.needs_toolserver(_grpo(tmp_path))
    grpo = _grpo(tmp_path, **{"data.format": "canvascraft", "data.path": str(tmp_path / "missing")})
    assert "build-rl" in cc.path_hint(grpo)
    assert [p for p in preflight(grpo) if p.startswith("data.path")] == [
        f"data.path: {tmp_path / 'missing'} does not exist (build it with `python -m canvascraft build-rl --out DIR`)"]
    assert "canvasagent easel data" in easel_data.path_hint(grpo)
    sft = TrainConfig.load("sft_tiny_cpu", {"run.output_dir": str(tmp_path)})
    assert scripted.needs_toolserver(sft)  # its SFT rows are run through the tools
    assert not cc.needs_toolserver(sft) and cc.needs_toolserver(grpo)  # SFT on a build only reads it



def test_evaluation_reads_a_build_with_the_sources_reader(tmp_path, rl_build):
    """`load_tasks` on a build folder and the canvascraft source's held-out tasks are one reader's;
    a build that cannot give the split is refused with what to do."""
    import shutil

    from canvasagent.evaluation.tasks_io import TaskLoadError, load_tasks

    cfg = _grpo(tmp_path, **{"data.format": "canvascraft", "data.path": str(rl_build)})
    held = eval_tasks(cfg, None, None, None, source="canvascraft")
    loaded = load_tasks(rl_build)
    assert [t.id for t in loaded] == [t.id for t in held] and len(held) == 2
    assert [t.instruction for t in loaded] == [t.instruction for t in held]
    assert [t.id for t in load_tasks(rl_build, split="train")] == [json.loads(r["task"])["id"] for r in grpo_rows(cfg, None)]
    no_eval = tmp_path / "no-eval"
    shutil.copytree(rl_build, no_eval)
    m = json.loads((no_eval / "manifest.json").read_text())
    m["shards"] = {k: v for k, v in m["shards"].items() if v["split"] != "eval"}  # what eval_n: 0 records
    (no_eval / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(TaskLoadError, match=r"RL build without 'eval' shards \(build with eval_n > 0\)"):
        load_tasks(no_eval)
    with pytest.raises(ValueError, match="without 'eval' shards"):
        eval_tasks(_grpo(tmp_path, **{"data.format": "canvascraft", "data.path": str(no_eval)}), None, None, None, source="canvascraft")
    (no_eval / "manifest.json").write_text(json.dumps({**m, "kind": "sft"}))
    with pytest.raises(TaskLoadError, match="is a sft build, not rl"):
        load_tasks(no_eval)

def test_mixed_is_scripted_then_canvascraft_and_eval_tasks_are_held_out(tmp_path, rl_build):
    cfg = _grpo(tmp_path, **{"data.format": "mixed", "data.path": str(rl_build)})
    factory = toolbox_factory(cfg)
    mixed = grpo_rows(cfg, factory)
    mix = get_source("mixed")
    parts = [get_source(p).grpo_rows(mix.part_config(cfg, p), factory) for p in mix.parts]
    assert mix.parts == ("scripted", "canvascraft")
    assert [r["task"] for r in mixed] == [r["task"] for rows in parts for r in rows]
    assert len(parts[0]) == 2 and len(parts[1]) == 4
    train_ids = {json.loads(r["task"])["id"] for r in parts[1]}
    held = eval_tasks(cfg, None, None, None, source="canvascraft")
    assert len(held) == 2 and not {t.id for t in held} & train_ids
    assert {task_source(t) for t in held} == {"canvascraft"}
    toolbox = factory()
    scripted_held = eval_tasks(cfg, 3, 999, toolbox)
    assert [t.instruction for t in scripted_held] == [t.instruction for t in eval_tasks(cfg, 3, 999, toolbox)]
    assert all(t.meta.get("reference_images") for t in scripted_held)
    both = source_of(cfg).eval_tasks(cfg, 3, 999, toolbox)
    assert [t.id for t in both] == [t.id for t in scripted_held] + [t.id for t in held]


def test_data_task_ids_keeps_the_named_training_tasks_in_order(tmp_path, rl_build):
    cfg = _grpo(tmp_path, **{"data.format": "mixed", "data.path": str(rl_build)})
    factory = toolbox_factory(cfg)
    ids = [json.loads(r["task"])["id"] for r in grpo_rows(cfg, factory)]
    assert len(ids) == 6 and len(set(ids)) == 6
    keep = tmp_path / "keep.txt"
    keep.write_text(f"# unsolved after SFT\n{ids[4]}\n\n  {ids[1]}  \n")
    cfg.data.task_ids = str(keep)
    assert [json.loads(r["task"])["id"] for r in grpo_rows(cfg, factory)] == [ids[1], ids[4]]  # the source's order
    keep.write_text(f"{ids[0]}\nrl-eval-0-000000\n")  # a held-out task is not a training task
    with pytest.raises(ValueError, match="1 ids are not training tasks"):
        grpo_rows(cfg, factory)
    keep.write_text("# nothing\n\n")
    with pytest.raises(ValueError, match="names no task"):
        grpo_rows(cfg, factory)
    cfg.data.task_ids = str(tmp_path / "absent.txt")
    with pytest.raises(ValueError, match="does not exist"):
        grpo_rows(cfg, factory)
    assert TrainConfig.load("grpo_tiny_cpu").data.task_ids is None  # the default trains on every task


def test_the_source_picks_the_scorer_and_the_env(tmp_path):
    cfg = _grpo(tmp_path)
    hybrid = source_of(cfg).scorer(cfg)
    assert list(hybrid.weights) == list(COMPONENTS) and hybrid.source == "rewards:paper"
    ecfg = TrainConfig.load("grpo_easel_tiny_cpu", {"run.output_dir": str(tmp_path), "easel.n_per_category": 1,
                                                    "easel.categories": ["programmatic"]})
    ws = workspace(ecfg, build_model=False)
    easel = source_of(ecfg).scorer(ecfg, ws.env_cls.toolbox())
    assert tuple(easel.weights) == EASEL_COMPONENTS and easel.source == "easel+rule:paper"
    [row] = grpo_rows(ecfg, ws.toolbox_factory)
    env = ws.env_cls()
    env.reset(**row)
    env.submit()
    traj = env._finalize([{"role": "assistant", "content": [{"type": "text", "text": "<reason>Done.</reason>"}]}])
    s = easel(traj)
    assert s[HYBRID] == pytest.approx(sum(w * s[k] for k, w in easel.weights.items())) and 0.0 <= s["easel_s"] <= 1.0
    # Held-out EASEL tasks come from another seed than the training rows.
    held = source_of(ecfg).eval_tasks(ecfg, 1, 7)
    assert held[0].meta["easel"]["seed"] == 7000 != json.loads(row["task"])["meta"]["easel"]["seed"]
    # A trajectory that never ran through EaselEnv scores easel_s 0 (and says so), not an error.
    bare = Trajectory(task=held[0], assets=AssetStore())
    assert easel(bare)["easel_s"] == 0.0


def test_no_training_module_switches_on_a_source_name_or_a_toolbox_type():
    """`data.format` is read in training/sources.py only; nothing tests a toolbox's class."""
    found = []
    for path in sorted((ROOT / "canvasagent" / "training").glob("*.py")):
        if path.name == "sources.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "format" and isinstance(node.value, ast.Attribute) and node.value.attr == "data":
                found.append(f"{path.name}:{node.lineno} reads data.format")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and "Toolbox" in ast.unparse(node.args[1]):
                found.append(f"{path.name}:{node.lineno} tests a toolbox type")
    assert not found
