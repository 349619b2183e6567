#!/usr/bin/env bash
# adjointgen.petsc on 2 MPI ranks.  PyPI has no petsc/slepc wheels (petsc4py and slepc4py build
# from source for a long time), so this uses Debian's packages: PETSc/SLEPc 3.18 (real, double,
# with MUMPS) for the system Python 3.11 and its NumPy 1.x, in a virtualenv that sees them, with
# torch's CPU wheel, NumPy < 2 (the packages' ABI) and adjointgen from this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
if ! /usr/bin/python3 -c "import petsc4py, slepc4py, mpi4py" 2>/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    python3-petsc4py python3-slepc4py python3-mpi4py python3-venv openmpi-bin >/dev/null
fi
# Debian's petsc4py/slepc4py look for /usr/lib/petsc and /usr/lib/slepc (links the -dev packages set up)
export PETSC_DIR="${PETSC_DIR:-$(ls -d /usr/lib/petscdir/petsc3.*/x86_64-linux-gnu-real | head -1)}"
export SLEPC_DIR="${SLEPC_DIR:-$(ls -d /usr/lib/slepcdir/slepc3.*/x86_64-linux-gnu-real | head -1)}"
VENV="${PETSC_VENV:-/tmp/adjointgen-petsc-venv}"
/usr/bin/python3 -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
"$VENV/bin/python" -m pip install --quiet -e '.[petsc]' "numpy<2" "scipy<1.14" pytest pytest-xdist
echo "petsc environment ready in ${SECONDS} s"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -n 0 tests/test_petsc.py
echo "check-petsc: ${SECONDS} s in all"
