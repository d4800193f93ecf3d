"""Every notebook in the book carries a current reference run from a CUDA device."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_notebook_has_a_current_gpu_reference_run():
    r = subprocess.run([sys.executable, "scripts/execute.py", "--check"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, "scripts/execute.py --check:\n" + r.stdout + r.stderr
