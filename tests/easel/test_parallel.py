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


def test_ray_tasks_match_local():
    ray = pytest.importorskip("ray")
    refs = [tasks.make_reconstruction("programmatic", i).reference for i in range(2)]
    local = paint_many(refs, [2, 2], TINY)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = paint_many(refs, [2, 2], TINY, workers=2, ray=True)
        assert ray.is_initialized()  # an existing Ray session is left to its owner
    finally:
        ray.shutdown()
    assert all(np.array_equal(a.strokes, b.strokes) for a, b in zip(local, remote))
