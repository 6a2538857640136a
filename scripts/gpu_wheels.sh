#!/usr/bin/env bash
# Fetch, on this machine, the wheels a lent GPU machine's image lacks for scripts/gpu_check.sh:
# the packages it does not have (trl, datasets and its dill/multiprocess, diffusers) and
# transformers at the version the tests pass on (the image has an older one), each pinned by
# constraints.txt, for that image's Python (3.12, x86-64). They go to .whl/ (git-ignored, about
# 22 MB), which the device call carries; gpu_check.sh installs them there before it runs.
#
#   bash scripts/gpu_wheels.sh [PYTHON_VERSION]     # default 3.12
set -euo pipefail
cd "$(dirname "$0")/.."
PYV=${1:-3.12}
PACKAGES="trl datasets dill multiprocess diffusers transformers"
pins=()
for p in $PACKAGES; do
  pin=$(grep -i -E "^${p}==" constraints.txt) || { echo "gpu_wheels: $p is not pinned in constraints.txt" >&2; exit 2; }
  pins+=("$pin")
done
mkdir -p .whl
rm -f .whl/*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${pins[@]}"
ls .whl
