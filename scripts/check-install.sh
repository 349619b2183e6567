#!/usr/bin/env bash
# A plain, non-editable `pip install` in a fresh virtualenv, used as a user does outside the
# checkout: the catalogue audits from any folder, a new project is written, generated and tested,
# the example projects are in sync and pass, docs/derivations.md's project (three derivations of a
# user's own) is generated and passes its tests, and the installed functions import and differentiate.
# Usage: bash scripts/check-install.sh   (TORCH_SPEC overrides the torch requirement, default torch==2.13.0)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install --quiet "${TORCH_SPEC:-torch==2.13.0}"
"$py" -m pip install --quiet "$repo" pytest
export PATH="$work/venv/bin:$PATH"
cd "$work"
adjointgen --catalogue list > /dev/null
adjointgen --catalogue audit inv --numeric-only > /dev/null
adjointgen --catalogue generate --check inv cholesky > /dev/null
adjointgen init "$work/proj" --copy funm
(cd "$work/proj" && adjointgen generate && python -m pytest -q)
cp -r "$repo/examples/lstsq_layer" "$work/lstsq_layer"
(cd "$work/lstsq_layer" && adjointgen generate --check && python -m pytest -q && adjointgen audit --html "$work/audit" > /dev/null)
cp -r "$repo/examples/polar" "$work/polar"
(cd "$work/polar" && adjointgen generate --check && python -m pytest -q)
# docs/derivations.md as written: a project from `adjointgen init` with three derivations (a Lyapunov
# solve, the sign function, the geometric mean), generated and tested against SciPy and finite differences
python "$repo/tests/docproject.py" "$work/doc"
python - <<'PY'
import torch
import adjointgen.torch as agt

A = torch.randn(4, 4, dtype=torch.float64)
A = ((A + A.mT) / 2).requires_grad_()
w, V = agt.eigh(A)
(agt.expm(A).sum() + w.sum()).backward()
print("installed adjointgen works:", A.grad.shape)
PY
