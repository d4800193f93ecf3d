"""The worker: one submission, outside the sandbox, talking to a kernel inside it.

``python -m grader.worker FD`` reads its job (JSON) on stdin and reports on file descriptor
``FD``, which the kernel never inherits: ``{"tamper": [...]}`` when the integrity check sees a
change, ``{"started": true}`` once the kernel runs, ``{"cell": ...}`` after each cell and
``{"done": ...}`` last. It builds the notebook (:func:`grader.notebooks.graded_notebook`),
starts the kernel in the sandbox the job describes, sends the cells one at a time, runs each
check cell's hidden tests itself (:class:`grader.remote.HiddenTests`), cuts the kernel's ledger
at every cell, and writes the feedback notebook.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import nbformat
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbclient.util import run_sync
from nbformat.v4 import new_output

from grader import notebooks, probe, remote
from grader import sandbox as sandboxing

MAX_OUTPUT_BYTES = 4 * 2**20          # outputs kept per notebook (errors are always kept)
MAX_LEDGER_BYTES = 8 * 2**20          # what a kernel may write to its ledger
MAX_LEDGER_LINE = 65536
MAX_LEDGER_INT_DIGITS = 30            # no check records a larger integer; 10**400 is refused
STARTUP_S = 180                       # kernel start and the integrity baseline, on top of --timeout
#: the ledger's name for each check of :data:`grader.notebooks.CHECKS`
CHECK_KINDS = {"check_close": "close", "check_choice": "choice", "check_true": "true",
               "check_ratio_at_least": "ratio_at_least", "check_timer": "timer"}


def _reject_constant(constant: str):
    raise ValueError(f"{constant} is not JSON data")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_LEDGER_INT_DIGITS:
        raise ValueError("an integer too large for a check")
    return int(text)


def parse_entry(line: bytes) -> dict | None:
    """One line of the ledger as a dict, or None when it is not one: not JSON, NaN or Infinity
    (the framework writes those as ``{"f": "nan"}``), an integer of more than
    :data:`MAX_LEDGER_INT_DIGITS` digits, nested too deeply, or not a JSON object."""
    if not line.strip() or len(line) > MAX_LEDGER_LINE:
        return None
    try:
        entry = json.loads(line, parse_constant=_reject_constant, parse_int=_bounded_int)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None
    return entry if isinstance(entry, dict) else None


class Ledger:
    """The kernel's ledger: a pipe its checks append JSON lines to (``$PERFLAB_GRADE_LOG``).

    The worker keeps a copy of the write end and writes a marker with a secret nonce after each
    cell; a reader thread splits the stream at the markers, so each cell gets exactly the lines
    written before its reply arrived. What a kernel wrote cannot be taken back; at most
    :data:`MAX_LEDGER_BYTES` are read (``overflow`` says when there was more); a line that is
    not a plain JSON object (:func:`parse_entry`) is dropped.
    """

    def __init__(self):
        self.read_fd, self.write_fd = os.pipe()
        self.nonce = uuid.uuid4().hex
        self.overflow = False
        self.malformed = 0                      # lines that are not plain JSON objects
        self._lines: list[dict] = []
        self._batches: dict[int, list[dict]] = {}
        self._cuts = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        buf, total = b"", 0
        while True:
            try:
                chunk = os.read(self.read_fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                return
            total += len(chunk)
            buf += chunk
            *lines, buf = buf.split(b"\n")
            if len(buf) > MAX_LEDGER_LINE:          # an endless line: not an entry
                buf = b""
                self.malformed += 1
            for line in lines:
                try:
                    self._line(line, total)
                except Exception:  # noqa: BLE001 (nothing a kernel writes may stop the reader)
                    pass

    def _line(self, line: bytes, total: int) -> None:
        entry = parse_entry(line)
        if entry is None and line.strip():
            self.malformed += 1
        with self._cond:
            if entry is not None and entry.get("mark") == self.nonce:
                self._batches[entry.get("cut")] = self._lines
                self._lines = []
                self._cond.notify_all()
            elif entry is not None and total <= MAX_LEDGER_BYTES and len(self._lines) < 2000:
                self._lines.append(entry)
            elif total > MAX_LEDGER_BYTES:
                self.overflow = True

    def cut(self, timeout: float = 10.0) -> list[dict]:
        """The entries written since the previous cut."""
        self._cuts += 1
        key = self._cuts
        os.write(self.write_fd, b"\n" + json.dumps({"mark": self.nonce, "cut": key}).encode() + b"\n")
        with self._cond:
            self._cond.wait_for(lambda: key in self._batches, timeout=timeout)
            return self._batches.pop(key, [])


def _kernel_manager_class():
    """A kernel manager whose kernel starts inside the sandbox, talking over Unix sockets in
    the submission's ipc folder (the sandbox has no network to reach TCP ports)."""
    from jupyter_client.manager import AsyncKernelManager

    class SandboxKernelManager(AsyncKernelManager):
        sandbox_argv: list[str] = []
        ipc_dir: str = ""

        def format_kernel_cmd(self, extra_arguments=None):
            info = {"shell_port": self.shell_port, "iopub_port": self.iopub_port, "stdin_port": self.stdin_port,
                    "control_port": self.control_port, "hb_port": self.hb_port, "ip": sandboxing.IPC + "/k",
                    "key": self.session.key.decode(), "transport": "ipc",
                    "signature_scheme": self.session.signature_scheme, "kernel_name": ""}
            path = Path(self.ipc_dir) / "kernel.json"
            path.write_text(json.dumps(info))
            os.chmod(path, 0o644)
            return self.sandbox_argv + [sys.executable, "-m", "ipykernel_launcher", "-f",
                                        sandboxing.IPC + "/kernel.json"] + list(extra_arguments or [])

    return SandboxKernelManager


def _client_class():
    from nbclient import NotebookClient

    class GradingClient(NotebookClient):
        """nbclient with a cap on the outputs it keeps (error outputs always kept, shortened)."""

        kept = 0
        truncated = False

        def output(self, outs, msg, display_id, cell_index):
            if msg.get("msg_type") == "error":
                content = msg.get("content", {})
                content["traceback"] = [t[:2000] for t in (content.get("traceback") or [])[-30:]]
                return super().output(outs, msg, display_id, cell_index)
            size = len(json.dumps(msg.get("content", {}), default=str))
            if self.kept + size > MAX_OUTPUT_BYTES:
                if not self.truncated:
                    self.truncated = True
                    outs.append(new_output("stream", name="stderr",
                                           text=f"[grader: outputs past {MAX_OUTPUT_BYTES // 2**20} MiB not kept]\n"))
                return None
            self.kept += size
            return super().output(outs, msg, display_id, cell_index)

    return GradingClient


def first_line(text: str, limit: int = 160) -> str:
    """The first line of ``text`` (ANSI colours removed), at most ``limit`` characters."""
    lines = re.sub(r"\x1b\[[0-9;]*m", "", text or "").strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def worker(job: dict, send) -> None:
    """Run one submission (see :func:`grader.notebooks.graded_notebook`) in a sandboxed kernel;
    ``send(msg)`` reports to the grader (see the module docstring)."""
    t0 = time.monotonic()
    try:
        submission = nbformat.reads(Path(job["submission"]).read_text(), as_version=4)
        nbformat.validate(submission)
    except Exception as err:  # any parse failure is the submission's, reported in its row
        send({"done": {"status": "not a notebook", "note": first_line(f"{type(err).__name__}: {err}")}})
        return
    lab = Path(job["lab"])
    instructor = notebooks.instructor_notebook(lab)
    nb = notebooks.graded_notebook(instructor, submission)
    watched = notebooks.watched_names(nb, instructor)
    ledger = Ledger()
    if os.geteuid() == 0:      # the kernel (its slot's uid) reopens the pipe as /dev/fd/N: give it the pipe
        os.fchown(ledger.write_fd, job["uid"], job["uid"])
    env = dict(job["env"], PERFLAB_GRADE_LOG=f"/dev/fd/{ledger.write_fd}")
    box = sandboxing.Sandbox(**{k: v for k, v in job["sandbox"].items() if k != "cgroups"})
    argv = sandboxing.command(box, tree=Path(job["tree"]), ipc=Path(job["ipc"]), env=env, argv=[],
                              size_bytes=job["tmpfs_bytes"], hide=[Path(p) for p in job["hide"]],
                              extra_ro=[tuple(p) for p in job["extra_ro"]], uid=job["uid"],
                              nproc=job["nproc_inside"])
    client = _client_class()(nb, timeout=job["timeout"], allow_errors=True, kernel_name="python3",
                             startup_timeout=STARTUP_S, shutdown_kernel="immediate",
                             kernel_manager_class=_kernel_manager_class())
    replies: dict[int, dict] = {}
    client.on_cell_executed = lambda cell, cell_index, execute_reply: replies.__setitem__(
        cell_index, execute_reply.get("content", {}))
    km = client.km = client.create_kernel_manager()
    km.sandbox_argv, km.ipc_dir = argv, job["ipc"]
    km.transport, km.ip = "ipc", "k"            # socket names relative to the ipc folder (the cwd)
    km.connection_file = str(Path(job["ipc"]) / "client.json")
    status, note, kernel_exit, process = "graded", "", None, None
    deadline = time.monotonic() + STARTUP_S + job["timeout"]

    def ask(expression: str, timeout: float):
        msg_id = client.kc.execute("", silent=True, store_history=False, user_expressions={"p": expression},
                                   allow_stdin=False)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                reply = run_sync(client.kc.get_shell_msg)(timeout=max(0.1, end - time.monotonic()))
            except Exception:  # no reply in time (queue.Empty) or the kernel went away
                return None
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                got = reply.get("content", {}).get("user_expressions", {}).get("p", {})
                if got.get("status") != "ok":
                    return None
                try:
                    return ast.literal_eval(got.get("data", {}).get("text/plain", ""))
                except (ValueError, SyntaxError, MemoryError, RecursionError):
                    return None
        return None

    all_watched = set().union(*watched.values()) if watched else set()
    # names the lab's own cells bind, and those they have bound so far (see probe.Watch.after)
    lab_names = set().union(*(notebooks.stored_names(c.source) for c in nb.cells if c.cell_type == "code"
                              and c.metadata.get("perflab_origin") != "student"))
    bound_by_lab: set[str] = set()
    lab_mutates = set().union(*(notebooks.mutated_names(c.source) for c in nb.cells if c.cell_type == "code"
                                and c.metadata.get("perflab_origin") != "student"))
    watch = probe.Watch(ask, probe.WATCHED_MODULES, all_watched)
    hidden_tests = remote.HiddenTests(ask, lambda: deadline - time.monotonic())
    stderr = _Tail()
    index = -1
    try:
        with client.setup_kernel(env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, cwd=job["ipc"],
                                 pass_fds=(ledger.write_fd,), stdout=subprocess.DEVNULL, stderr=stderr.fd,
                                 preexec_fn=lambda: sandboxing.enter(job["procs_files"], job["rlimits"])):
            process = getattr(km.provisioner, "process", None)
            stderr.close_write()
            _lock_ipc(Path(job["ipc"]))
            findings = watch.baseline()
            if findings:
                send({"tamper": findings})
            send({"started": True})
            deadline = time.monotonic() + job["timeout"]
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                client.timeout = max(1, int(deadline - time.monotonic()))
                origin = cell.metadata.get("perflab_origin", "instructor")
                try:
                    client.execute_cell(cell, index)
                except CellTimeoutError:
                    status, note = "time limit", f"over {job['timeout']} s (cell {index})"
                except DeadKernelError:
                    status, note = "kernel died", f"in cell {index}"
                if status != "graded":
                    send({"cell": _cell_result(cell, index, replies.get(index), [], origin)})
                    break
                entries = ledger.cut()
                where = f"cell {index} ({'your code' if origin == 'student' else 'the lab'})"
                binds = notebooks.stored_names(cell.source) if origin != "student" else set()
                bound_by_lab |= binds
                findings = watch.after(origin, where, watched.get(index, set()), binds, lab_names - bound_by_lab,
                                       lab_mutates)
                hidden = {}
                if cell.metadata.get("perflab_hidden") and origin != "student" and _ran(replies.get(index)):
                    hidden = _run_hidden(hidden_tests, cell)
                    ledger.cut()                       # what the kernel wrote meanwhile is not the check's
                    findings += watch.after("student", f"the hidden tests of cell {index} (your code, called)",
                                            watched.get(index, set()), unset=lab_names - bound_by_lab,
                                            mutable=lab_mutates)
                send({"cell": _cell_result(cell, index, replies.get(index), entries, origin, hidden)})
                if findings:
                    send({"tamper": findings})
                if time.monotonic() > deadline:
                    status, note = "time limit", f"over {job['timeout']} s (cell {index})"
                    break
            if ledger.overflow:
                send({"tamper": [f"the kernel wrote more than {MAX_LEDGER_BYTES // 2**20} MiB to the check ledger"]})
            if ledger.malformed:
                send({"tamper": [f"the kernel wrote {ledger.malformed} line(s) to the check ledger that no check "
                                 "writes (not plain JSON: NaN, an integer of more than "
                                 f"{MAX_LEDGER_INT_DIGITS} digits, ...)"]})
    except DeadKernelError as err:
        status, note = "kernel died", first_line(str(err))
    except Exception as err:  # the kernel would not start, or shut down badly: this row only
        if status == "graded":
            why = stderr.last_line()
            status, note = "error", first_line(f"{type(err).__name__}: {err}" + (f" ({why})" if why else ""))
    stderr.close_write()
    if process is not None:
        try:
            kernel_exit = process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            kernel_exit = None
    if status == "kernel died" and index >= 0:
        note = f"in cell {index}"
    try:
        out = Path(job["executed"])
        out.write_text(nbformat.writes(notebooks.feedback_notebook(nb)), errors="replace")
    except Exception:  # feedback is best effort; the verdict does not depend on it
        pass
    send({"done": {"status": status, "note": note, "kernel_exit": kernel_exit,
                   "seconds": time.monotonic() - t0}})


def _ran(reply: dict | None) -> bool:
    """Whether a cell's visible part ran without an error (its hidden tests then run too)."""
    return bool(reply) and reply.get("status") == "ok"


def _run_hidden(tests: remote.HiddenTests, cell) -> dict:
    """Run a check cell's hidden tests in this process; their printed lines (and the failure,
    if any) join the cell's outputs, as they would in a notebook."""
    errors, texts = [], []
    for block in cell.metadata.get("perflab_hidden", []):
        error, text = tests.run(block)
        texts.append(text)
        if error:
            errors.append(error)
            break
    text = "".join(texts)
    shown = text + (f"{errors[0]}\n" if errors else "")
    if shown:
        cell.outputs.append(new_output("stream", name="stdout", text=shown))
    return {"error": errors[0] if errors else "", "text": text}


class _Tail:
    """A pipe for the sandbox's stderr, drained by a thread that keeps only its last 4 KiB."""

    def __init__(self):
        self._read, self.fd = os.pipe()
        self.data = b""
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        while chunk := os.read(self._read, 65536):
            self.data = (self.data + chunk)[-4096:]
        os.close(self._read)

    def close_write(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def last_line(self) -> str:
        lines = self.data.decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else ""


def _lock_ipc(ipc: Path) -> None:
    """After the kernel made its sockets: the sandbox may no longer add, remove or replace any
    entry in its ipc folder (a socket swapped for a symlink would be followed by the worker)."""
    try:
        if os.geteuid() == 0:
            os.chown(ipc, 0, 0)
        os.chmod(ipc, 0o555)
    except OSError:
        pass


def _cell_result(cell, index: int, reply: dict | None, entries: list[dict], origin: str,
                 hidden: dict | None = None) -> dict:
    error = ""
    if reply and reply.get("status") == "error":
        error = first_line(f"{reply.get('ename', '')}: {reply.get('evalue', '')}")
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error" and not error:
            error = first_line(f"{out.get('ename', '')}: {out.get('evalue', '')}")
    g = notebooks.nbgrader(cell)
    text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
    graded = bool(g.get("grade"))
    return {"index": index, "grade_id": g.get("grade_id"), "grade": graded,
            "points": g.get("points", 0) if graded else 0, "error": error, "origin": origin,
            "replied": reply is not None, "text": text[-4000:] if graded else "",
            "checks": sorted(CHECK_KINDS[c] for c in notebooks.checks_called(cell.source)) if graded else [],
            "hidden": bool(cell.metadata.get("perflab_hidden")) if graded else False,
            "hidden_error": (hidden or {}).get("error", ""), "ledger": entries}


def main(argv: list[str] | None = None) -> int:
    """The worker process: the job arrives on stdin, messages go to the file descriptor in
    ``argv`` (never inherited by the kernel)."""
    argv = sys.argv[1:] if argv is None else argv
    fd = int(argv[0])
    os.set_inheritable(fd, False)
    sandboxing.die_with_parent()
    job = json.loads(sys.stdin.read())
    if os.getppid() != job["parent"]:      # the grader died before we could ask to die with it
        return 1
    out = os.fdopen(fd, "w", buffering=1)

    def send(msg: dict) -> None:
        out.write(json.dumps(msg, default=str) + "\n")

    worker(job, send)
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
