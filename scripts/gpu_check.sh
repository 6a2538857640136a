#!/usr/bin/env bash
# Offline GPU check (no downloads): one GRPO step of a random-weight Qwen3-VL-8B-shaped policy with
# the tiny tools, and one 512x512 call of a random-weight FLUX.2-klein-shaped pipeline; prints peak
# GPU memory and times as JSON. Shapes and details: scripts/gpu_check.py.
#
#   bash scripts/gpu_check.sh              # on a GPU machine (about 20 GB disk for the policy)
#   bash scripts/gpu_check.sh --smoke      # the same check at toy sizes (GPU if any, else CPU), ~1 min
#   bash scripts/gpu_check.sh --dry-run    # anywhere: configs and parameter counts only
#
# Python: $PYTHON, else the project's .venv, else python3 (a GPU machine's own image, which has
# torch but not this project's pins). Wheels in .whl/ (`bash scripts/gpu_wheels.sh` fetches the
# ones such an image lacks) are installed into a folder of their own first, ahead of the image's.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3
fi
if [ "$PY" != .venv/bin/python ] && compgen -G ".whl/*.whl" >/dev/null; then
  SITE=${GPU_CHECK_SITE:-/tmp/gpu_check_site}
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
elif [ "$PY" != .venv/bin/python ]; then
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the project from this checkout, uninstalled
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
# -P: the scripts folder must not shadow packages on the import path.
exec "$PY" -P scripts/gpu_check.py "$@"
