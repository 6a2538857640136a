#!/usr/bin/env bash
# Offline GPU check (no downloads): one GRPO step of a random-weight Qwen3-VL-8B-shaped policy with
# the tiny tools, and one 512x512 call of a random-weight FLUX.2-klein-shaped pipeline; prints peak
# GPU memory and times as JSON. Shapes and details: scripts/gpu_check.py.
#
#   bash scripts/gpu_check.sh              # on a GPU machine (about 20 GB disk for the policy)
#   bash scripts/gpu_check.sh --dry-run    # anywhere: configs and parameter counts only
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
# -P: the scripts folder must not shadow packages on the import path.
exec "$PY" -P scripts/gpu_check.py "$@"
