"""Every notebook in the book carries a current reference run from a CUDA device."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_notebook_has_a_current_gpu_reference_run():
    r = subprocess.run([sys.executable, "scripts/execute.py", "--check"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, "scripts/execute.py --check:\n" + r.stdout + r.stderr


def test_no_committed_notebook_contradicts_its_own_expectations():
    """A typed sentence backed by perflab.claims.expect must hold on the run the page shows."""
    from perflab.claims import failed_expectations
    from perflab.runs import toc_files

    bad = {}
    for entry in toc_files(ROOT / "_toc.yml"):
        nb = ROOT / (entry + ".ipynb")
        if nb.exists():
            failed = failed_expectations(nb)
            if failed:
                bad[entry] = failed
    assert not bad, f"expectations glued False by the committed runs: {bad}"
