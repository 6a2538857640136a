#!/usr/bin/env bash
# Run the whole test suite on the CPU (one OpenMP thread: more threads thrash on 2-core VMs).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1
export TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0
exec .venv/bin/python -m pytest -q "$@"
