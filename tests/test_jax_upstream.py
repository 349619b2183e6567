"""JAX's own derivative tests of its linear algebra (``tests/jax_upstream.py``: JAX 0.10.2's
``linalg_test.py`` and ``eigh_test.py``, vendored), run with ``adjointgen.jax`` swapped in for
``jnp.linalg``, ``jax.scipy.linalg`` and ``lax.linalg`` inside the test modules only, under JAX's
``JaxTestCase`` configuration (strict dtype promotion, rank promotion ``'raise'``), with x64 on and
off: no failure, and as many passes and skips as JAX's own functions get.

Each run is a subprocess (x64 is fixed when JAX starts).  JAX's own counts are measured with the
same harness (``python tests/jax_upstream.py --x64 --cases 5``) and recorded in
:data:`JAX_OWN`; ``ADJOINTGEN_JAX_UPSTREAM_BASELINE=1`` (or a JAX version without a record)
measures them again in the test."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")

HERE = Path(__file__).resolve().parent
CASES = 5

#: (JAX version, x64) -> JAX's own functions' (passed, skipped) at JAX_NUM_GENERATED_CASES=5
JAX_OWN = {
    ("0.10.2", True): (92, 4),
    ("0.10.2", False): (94, 2),
}


def _run(agj: bool, x64: bool) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    command = [sys.executable, str(HERE / "jax_upstream.py"), "--x64" if x64 else "--no-x64", "--cases", str(CASES),
               "--json"] + (["--agj"] if agj else [])
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=HERE.parent, timeout=3600)
    if done.returncode == 2:
        pytest.skip(done.stderr.strip())
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the harness printed no result (exit {done.returncode}):\n{done.stderr[-3000:]}"
    return json.loads(lines[-1])


@pytest.mark.slow  # two subprocesses of JAX's check_grads (minutes each): CI's slow step
@pytest.mark.parametrize("x64", [False, True], ids=["x64-off", "x64-on"])
def test_jax_own_linalg_tests_pass_with_agj_swapped_in(x64):
    ours = _run(agj=True, x64=x64)
    failures = "\n".join(f"{f['test']}\n{f['error']}" for f in ours["failures"])
    assert ours["failed"] == 0, f"{ours['failed']} of JAX's tests fail with adjointgen.jax:\n{failures}"
    key = (ours["jax"], x64)
    if key in JAX_OWN and not os.environ.get("ADJOINTGEN_JAX_UPSTREAM_BASELINE"):
        passed, skipped = JAX_OWN[key]
    else:
        theirs = _run(agj=False, x64=x64)
        assert theirs["failed"] == 0, theirs["failures"]
        passed, skipped = theirs["passed"], theirs["skipped"]
    assert (ours["passed"], ours["skipped"]) == (passed, skipped), (ours["skips"], ours["passed"])
