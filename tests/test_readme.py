"""Every code block of the README runs as written (the first, the install and test commands, is
what CI itself runs): python blocks each in a fresh interpreter, bash blocks from the checkout's
root, with this interpreter's scripts first on PATH."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"^```(\w+)\n(.*?)^```", (ROOT / "README.md").read_text(), flags=re.M | re.S)


def test_the_readme_starts_with_the_install_and_test_commands():
    lang, code = BLOCKS[0]
    lines = [line.split("#")[0].strip() for line in code.strip().splitlines()]
    assert lang == "bash" and lines == ["pip install -e '.[test]' && adjointgen generate", "python -m pytest -q"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m pytest -q" in ci or "python -m pytest -q" in ci


@pytest.mark.slow  # each block in a fresh interpreter (100 s in all): CI's slow step
@pytest.mark.parametrize("index", range(1, len(BLOCKS)), ids=lambda i: f"block{i}-{BLOCKS[i][0]}")
def test_block_runs(index, tmp_path):
    lang, code = BLOCKS[index]
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONPATH", None)
    if lang == "python":
        r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=600)
    elif lang == "bash":
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=900)
    else:
        pytest.fail(f"README block {index} has the language {lang!r}: only python and bash blocks are run")
    assert r.returncode == 0, f"README block {index} ({lang}) failed:\n{code}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
