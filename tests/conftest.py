"""Shared set-up of the unit tests: the repository root on sys.path and small CPU problem sizes.
(Caches and scratch files are kept inside the clone by the root conftest.py.)"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PERFLAB_FORCE_CPU_SIZES", "1")

# The built book (one build per session, shared by tests/test_book.py and tests/test_reader.py).
from book_site import build, rendered, server  # noqa: E402,F401
