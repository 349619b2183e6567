#!/usr/bin/env bash
# GPU checks for a machine with an NVIDIA GPU: the CUDA tests (tests/test_cuda.py: every public
# function on the GPU against the CPU and torch, the degeneracy sweep on the GPU, the CuPy rules on
# every audit instance, JAX on the GPU; torch's OpInfo gradient checks on CUDA; the generated
# kernels), the JAX suite on the GPU, then the GPU benchmarks.  Logs go to $OUT (or ./gpu-check/).
# Usage: bash scripts/gpu-check.sh [tests|bench|all]   (torch with CUDA; CuPy and JAX where installed)
set -uo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
LOG="${OUT:-$PWD/gpu-check}"
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -c "import adjointgen.generated" 2>/dev/null ||
    python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3
python3 -c "import cupy" 2>/dev/null || python3 -m pip install -q cupy-cuda12x 2>/dev/null || true
# torch's OpInfos need expecttest (a machine without a registry: a wheel carried in .whl/)
python3 -c "import expecttest" 2>/dev/null || { [ -d .whl ] && python3 -m pip install -q --no-index --no-deps \
    .whl/expecttest-*.whl; } || python3 -m pip install -q expecttest 2>/dev/null || true
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" 2>&1 | tail -1
status=0
if [ "$what" != bench ]; then
    timeout 200 python3 -m pytest -q -o addopts= -m gpu -n 8 -p no:cacheprovider -rs tests/ 2>&1 |
        tee "$LOG/gpu-tests.log" | tail -60
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    JAX_PLATFORMS=cuda,cpu timeout 100 python3 -m pytest -v --tb=short -o addopts= -n 8 -p no:cacheprovider \
        tests/test_jax.py 2>&1 | tee "$LOG/jax-on-gpu.log" | grep -E "FAILED|ERROR|passed|failed" | tail -25
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [ "$what" != tests ]; then
    for bench in bench_eigh bench_svd bench_factorizations bench_funm bench_pinv; do
        echo "== $bench --device cuda"
        extra=""; [ "$bench" = bench_eigh ] && extra="--no-generate"
        timeout 60 python3 "benchmarks/$bench.py" --device cuda $extra 2>&1 | tee "$LOG/$bench.log" | tail -30
    done
fi
exit $status
