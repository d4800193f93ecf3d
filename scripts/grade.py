#!/usr/bin/env python3
"""Grade lab submissions: each run in a sandbox of its own, verdicts decided outside it.

    python scripts/grade.py SUBMISSIONS_DIR --out results.csv
    python scripts/grade.py SUBMISSIONS_DIR --lab labs/01_roofline.md --timeout 600 --memory-gb 16

The grader is the package ``grader/`` at the root of the clone (its docstring says what it does,
``instructors.md`` how to use it); this script is its entry point, as is ``python -m grader``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
