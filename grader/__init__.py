"""The course's grader: lab submissions run in a sandbox each, verdicts decided outside it.

    python scripts/grade.py SUBMISSIONS_DIR --out results.csv      # or: python -m grader ...
    python scripts/grade.py SUBMISSIONS_DIR --lab labs/01_roofline.md --timeout 600 --memory-gb 16

Every entry of ``SUBMISSIONS_DIR`` is one submission and gets one row (``alice.ipynb``,
``01_roofline-bob.ipynb``; a file that is not a notebook, a dotfile or a folder gets a row that
says so). Its lab is ``--lab`` if given, else the lab whose number starts the file name
(``01_...``). The grader reads every submission and lab before it runs any, checks that a kernel
starts in its sandbox (or refuses with one line and exit status 2), then, for each submission:

1. builds the notebook to run from the **instructor's** lab source (set-up, checks, closing
   cells), with the submission's solution cells (nbgrader ``solution: true``) put in by
   ``grade_id`` (a missing one is the student stub) and any code cells the student added after
   the solution they followed (:mod:`grader.notebooks`). Checks are re-inserted, never taken
   from the submission; their hidden tests are cut out of what the kernel runs;
2. runs it cell by cell in a fresh kernel inside a sandbox (:mod:`grader.sandbox`): bubblewrap
   namespaces (PID, network, mount, IPC), an unprivileged uid, a read-only *student tree*
   (perflab, the student editions, the reference chapters the labs read; no lab source, no
   solution, no other submission, no clone), a private ``/tmp`` and one writable tmpfs home,
   and limits on the memory and process count of the whole sandbox and on time. A worker
   process *outside* the sandbox (:mod:`grader.worker`), which the kernel cannot see or signal,
   sends the cells;
3. runs each check cell's hidden tests in that worker, a process the student's code never runs
   in (:mod:`grader.remote`): names of the notebook arrive as plain data, a student's function
   is called in the kernel with plain arguments and only plain data comes back, and the expected
   values never exist in the kernel;
4. decides each check's verdict outside the sandbox (:mod:`grader.verdicts`): a check cell
   passes when the kernel reports no error, no :class:`~perflab.labs.exercises.ExerciseFailed`
   was created while it ran, every check it called recorded a passing verdict with plain inputs
   that the grader's own copy of the check confirms (a verdict it cannot re-check is a failure),
   every kind of check the cell calls unconditionally recorded one, and its hidden tests passed
   in the worker. After every cell the worker compares the kernel's state with the state before
   any student code ran (:mod:`grader.probe`: every perflab module, torch, torch.autograd,
   numpy, the builtins, error handling, modes and hooks, and the notebook names the later checks
   read): a change, a new key included, is reported as ``tampering seen: <what>``;
5. writes, once and atomically at the end (or on SIGINT/SIGTERM, with the rows finished so far),
   ``results.csv``, ``results-exercises.csv`` and a feedback folder per submission
   (:mod:`grader.results`). A row whose grading raised is written as ``error``, naming the
   submission, and every other row is written as usual.

Statuses: ``graded``, ``tampering seen``, ``time limit``, ``memory limit`` (of the whole
sandbox), ``process limit``, ``killed by signal N``, ``crashed`` (the kernel exited),
``not a notebook``, ``unknown lab``, ``error`` (the grader failed on this row; the note says
how). The grader is an instructor's tool beside ``perflab``, not part of it: the sandbox gets
``perflab``, never this package.
"""

from pathlib import Path

#: the course clone the grader runs from
ROOT = Path(__file__).resolve().parent.parent
