"""EASEL: the brush tool family, reconstruction and semantic benchmarks, our painter and EASEL-Data.

How to run everything, the metric settings and the measured tables are in ``docs/EASEL.md``;
the exact rasterisation is documented in :mod:`canvasagent.easel.render`.
"""
