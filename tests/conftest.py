"""Shared pytest set-up: the repository root on sys.path, small CPU problem sizes, and every
cache and scratch file inside the clone.

Tests, and the notebook kernels nbval starts (they inherit this environment), write only under
the clone's ``.cache/`` (git-ignored) or pytest's ``tmp_path`` (itself under ``.cache/tmp``).
``TMPDIR`` is the setting that matters most: Inductor keeps its precompiled C++ headers in
``tempfile.gettempdir()/torchinductor_<user>/precompiled_headers`` (torch/_inductor/codecache.py,
``_HEADER_DIR``), which ``TORCHINDUCTOR_CACHE_DIR`` does not move, and the notebooks' scratch
folders (``tempfile.mkdtemp``) go there too. The Makefile sets the same variables.
"""

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PERFLAB_FORCE_CPU_SIZES", "1")

CACHE = ROOT / ".cache"
for name, sub in (("TMPDIR", "tmp"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                  ("TORCH_EXTENSIONS_DIR", "torch_extensions"), ("TRITON_CACHE_DIR", "triton"),
                  ("XDG_CACHE_HOME", "xdg"), ("MPLCONFIGDIR", "matplotlib"), ("IPYTHONDIR", "ipython"),
                  ("JUPYTER_RUNTIME_DIR", "jupyter_runtime")):
    path = Path(os.environ.get(name) or CACHE / sub)
    if not path.resolve().is_relative_to(ROOT.resolve()):
        path = CACHE / sub  # a setting outside the clone (the usual /tmp, ~/.cache) is what this prevents
    os.environ[name] = str(path)
    path.mkdir(parents=True, exist_ok=True)
tempfile.tempdir = None  # gettempdir() reads TMPDIR again
