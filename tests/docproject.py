"""The project of docs/derivations.md ("Writing a derivation"), built from the page itself: its
``# file:`` blocks written in order, its bash blocks run (or, for the cheap tests, only the first,
``adjointgen init``)."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "derivations.md"


def blocks():
    return re.findall(r"^```(\w+)\n(.*?)^```", PAGE.read_text(), flags=re.M | re.S)


def environment():
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONPATH", None)
    return env


def run_page(folder: Path, *, bash: str = "all") -> int:
    """Write the page's files into ``folder`` and run its bash blocks (``bash="first"``: only the
    first, which makes the project); returns the number of bash blocks run."""
    ran = 0
    for index, (lang, code) in enumerate(blocks()):
        first = code.splitlines()[0] if code.strip() else ""
        if lang == "python" and first.startswith("# file: "):
            path = folder / first.removeprefix("# file: ").strip()
            path.parent.mkdir(parents=True, exist_ok=True)
            body = code.split("\n", 1)[1]
            with path.open("a") as f:
                f.write(("\n" if path.exists() and path.stat().st_size else "") + body)
            continue
        assert lang == "bash", f"block {index} of {PAGE.name}: only bash blocks and '# file:' python blocks, got {lang}"
        if bash == "first" and ran:
            continue
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=folder, env=environment(),
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, (f"block {index} of {PAGE.name} failed:\n{code}\n--- stdout\n{r.stdout[-3000:]}"
                                   f"\n--- stderr\n{r.stderr[-3000:]}")
        ran += 1
    return ran


def build(folder: Path) -> Path:
    """The page's project in ``folder``/demo, its files written, nothing generated."""
    folder.mkdir(parents=True, exist_ok=True)
    run_page(folder, bash="first")
    return folder / "demo"


if __name__ == "__main__":  # scripts/check-install.sh: the whole page, from a plain install
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    print(f"{PAGE.name}: {run_page(target)} bash blocks ran in {target}")
