"""Painter, bench runner, data builder and CLI functions at tiny budgets."""
import argparse
import json
from dataclasses import replace

import numpy as np
from PIL import Image

from canvasagent.easel import bench, data, render, tasks
from canvasagent.easel.painter import PainterConfig, paint

TINY = PainterConfig(work_res=32, n_candidates=4, iters_low=3, iters_full=2, opt_k=6, opt_golden=3)


def test_painter_improves_over_blank():
    t = tasks.make_reconstruction("programmatic", 2)
    res = paint(t.reference, 8, TINY)
    assert res.strokes.shape == (8, 13) and res.strokes.min() >= 0 and res.strokes.max() <= 1
    assert t.score(res.canvas) > t.score(t.initial_canvas())
    assert np.allclose(res.canvas, render.render_strokes(res.strokes, 64))
    again = paint(t.reference, 8, TINY)
    assert np.array_equal(res.strokes, again.strokes)  # deterministic for a seed


def test_bench_run_and_table(tmp_path):
    suite = [tasks.make_reconstruction("programmatic", 0), tasks.make_reconstruction("spatial", 0)]
    cfg = bench.BenchConfig(n_per_category=1, budgets=("aligned", 6), painter=TINY)
    cfg = replace(cfg, painter=replace(TINY, n_strokes=4))
    res = bench.run("painter", replace(cfg, budgets=(4,)), tmp_path / "p", suite=suite)
    assert len(res) == 2 and all(len(r.curve) == 4 for r in res)
    res_b = bench.run("blank", cfg, tmp_path / "b", suite=suite)
    table = bench.format_table(res + res_b)
    assert "painter" in table and "blank" in table and "Prog." in table
    assert (tmp_path / "p" / "curves.png").exists() and (tmp_path / "p" / "results.jsonl").exists()


def test_load_default_config():
    cfg = bench.load_config()
    assert cfg.n_per_category >= 1 and isinstance(cfg.painter, PainterConfig)


def test_data_builder(tmp_path):
    assert data.c1_indices(250)[:16] == list(range(16)) and max(data.c1_indices(250)) < 50
    c2 = data.c2_indices(250)
    assert c2[0] == 0 and max(c2) < 250 and np.all(np.diff(np.diff(c2)) >= -1)  # gaps grow
    ref = tasks.make_reconstruction("programmatic", 3).reference
    strokes = np.random.default_rng(0).random((20, 13))
    counts = data.build_dataset([("r0", ref)], tmp_path, trajectories=[strokes], parquet=False)
    assert counts["C1"] == 18 and counts["C2"] >= 5
    rec = json.loads((tmp_path / "c1.jsonl").read_text().splitlines()[3])
    assert rec["step"] == 3 and len(rec["images"]) == 2 and (tmp_path / rec["images"][1]).exists()
    msg = rec["messages"][-1]["content"]
    assert msg.startswith("<reason>") and "<tool_call>" in msg and msg.endswith("</tool_call>")
    call = json.loads(msg.split("<tool_call>")[1].split("</tool_call>")[0])
    assert call["name"] == "brush_stroke" and isinstance(call["arguments"]["xs"], int)
    assert np.allclose(render.params_from_dict(data.path_to_unit(call["arguments"])), strokes[3], atol=1e-3)
    # the state image is the replay of the first 3 strokes
    img = np.asarray(Image.open(tmp_path / rec["images"][1]), np.float32) / 255
    assert np.abs(img - render.render_strokes(strokes[:3], 64)).max() < 1 / 255 + 1e-6


def test_cli_functions(tmp_path, capsys):
    from canvasagent.cli import easel_cmd
    parser = argparse.ArgumentParser()
    easel_cmd.register(parser.add_subparsers())
    ref = tasks.make_reconstruction("programmatic", 4).reference
    Image.fromarray(render.to_uint8(ref)).save(tmp_path / "ref.png")
    a = parser.parse_args(["easel", "score", str(tmp_path / "ref.png"), str(tmp_path / "ref.png"), "--json"])
    assert a.func(a) == 0
    assert json.loads(capsys.readouterr().out)["s"] > 0.99
    cfg = tmp_path / "c.yaml"
    cfg.write_text("painter: {work_res: 32, n_candidates: 4, iters_low: 2, iters_full: 1, opt_k: 6, opt_golden: 3}\n")
    a = parser.parse_args(["easel", "paint", str(tmp_path / "ref.png"), "--budget", "5", "--out", str(tmp_path / "p"),
                           "--config", str(cfg)])
    assert a.func(a) == 0
    assert len((tmp_path / "p" / "strokes.jsonl").read_text().splitlines()) == 5
    assert (tmp_path / "p" / "s_curve.png").exists() and (tmp_path / "p" / "canvas.png").exists()
    a = parser.parse_args(["easel", "bench", "--policy", "dominant-fill", "--out", str(tmp_path / "b"),
                           "--n-per-category", "1", "--workers", "1", "--categories", "programmatic"])
    assert a.func(a) == 0 and "dominant-fill" in capsys.readouterr().out
    a = parser.parse_args(["easel", "data", "--refs", str(tmp_path / "ref.png"), "--out", str(tmp_path / "d"),
                           "--strokes", "6", "--size", "32", "--no-parquet", "--config", str(cfg)])
    assert a.func(a) == 0 and (tmp_path / "d" / "c1.jsonl").exists()
