"""The house style, as CI enforces it: ruff's lint and import order (configured in pyproject.toml;
ruff comes with the test extras)."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is not installed: pip install -e '.[test]'"
    done = subprocess.run([ruff, "check", "--no-cache", "swarm", "engine", "kernels", "tests"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
