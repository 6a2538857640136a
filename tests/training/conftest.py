import os

for _k, _v in (("OMP_NUM_THREADS", "1"), ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TRL_EXPERIMENTAL_SILENCE", "1")):
    os.environ.setdefault(_k, _v)

from tests.fixtures_models import tiny_qwen3vl_dir  # noqa: E402,F401  (session fixture)
