"""``python -m grader SUBMISSIONS_DIR ...``: the same as ``python scripts/grade.py``."""

import sys

from grader.cli import main

sys.exit(main())
