"""Painting across images as Ray tasks gives the local result."""
import numpy as np
import pytest

from canvasagent.easel import parallel, tasks
from canvasagent.easel.painter import PainterConfig, paint_many

TINY = PainterConfig(work_res=16, n_candidates=2, iters_low=1, iters_full=1, opt_k=6, opt_golden=2)


def _square(x):
    return x * x


def test_local_backend_orders_by_index():
    out = dict(parallel.imap_jobs(_square, [1, 2, 3], workers=1))
    assert out == {0: 1, 1: 4, 2: 9}
    with pytest.raises(ValueError):
        list(parallel.imap_jobs(_square, [1], backend="dask"))


def test_ray_tasks_match_local(tmp_path):
    ray = pytest.importorskip("ray")
    from dataclasses import replace

    from canvasagent.easel import bench, data
    suite = [tasks.make_reconstruction("programmatic", i) for i in range(2)]
    refs = [t.reference for t in suite]
    local = paint_many(refs, [2, 2], TINY)
    cfg = bench.BenchConfig(budgets=(2,), workers=2, ray=True, painter=TINY)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = paint_many(refs, [2, 2], TINY, workers=2, ray=True)
        # the bench and the data builder take the same path (--ray on the CLI)
        rows = bench.run("painter", cfg, tmp_path / "b", suite=suite)
        counts = data.build_dataset([("a", refs[0]), ("b", refs[1])], tmp_path / "d", n_strokes=2,
                                    painter_cfg=TINY, workers=2, parquet=False, ray=True)
        assert ray.is_initialized()  # an existing Ray session is left to its owner
    finally:
        ray.shutdown()
    assert all(np.array_equal(a.strokes, b.strokes) for a, b in zip(local, remote))
    assert [r.task_id for r in rows] == [t.task_id for t in suite]  # job order restored
    local_rows = bench.run("painter", replace(cfg, ray=False, workers=1), None, suite=suite)
    assert [r.final for r in rows] == [r.final for r in local_rows]
    assert counts["references"] == 2 and (tmp_path / "d" / "c1.jsonl").exists()
