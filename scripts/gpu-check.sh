#!/usr/bin/env bash
# GPU checks for a machine with an NVIDIA GPU: CUDA/CuPy tests, then the GPU benchmarks.
# Usage: bash scripts/gpu-check.sh   (expects torch with CUDA; installs CuPy if missing)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}"
python3 -c "import cupy" 2>/dev/null || python3 -m pip install -q cupy-cuda12x || true
python3 -m pytest -q -o addopts= -m gpu tests/ || status=$?
python3 benchmarks/bench_eigh.py --device cuda
python3 benchmarks/bench_svd.py --device cuda
python3 benchmarks/bench_pinv.py --device cuda 2>/dev/null || true
exit ${status:-0}
