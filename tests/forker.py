"""Test helper: a process that imports the scripts of the session's background jobs once, then
forks one child per job (tests/background.py, :class:`background.Forker`).

A background job that executes a page (``scripts/execute.py``) or runs a lab
(``tests/lab_runs.py``) was a fresh ``python`` process, and each one imported torch, matplotlib,
jupytext and the rest before doing anything (~2.6 CPU-s: 3.3 -> 0.7 CPU-s for a page without
code, 38 such jobs in a session). Here they are imported once; each job is a ``fork()`` of this
process, which runs the script's ``main(argv)`` exactly as ``python SCRIPT ARGV...`` would: in a
process group of its own, its environment and working folder set from the request, its output
into the request's two files, ``atexit`` handlers run at its end. Its page still runs in a
fresh Jupyter kernel of its own (the script starts it), so no page shares anything with another.

``python tests/forker.py MODULE...`` preloads MODULE... and then reads requests, one JSON object
per line on stdin (``module``, ``function``, ``script``, ``argv``, ``env``, ``cwd``, ``out``,
``err``), and answers each on stdout with ``pid PID`` once the child is forked, then
``exit CODE CPU`` when it has ended (its exit status as ``subprocess`` gives it, and the CPU
seconds of it and of the descendants it waited for, from ``os.wait4``). One job at a time; the
process exits at the end of its input.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import sys
import traceback

REQ, REP = os.dup(0), os.dup(1)      # the protocol's pipes, apart from fd 0 and 1


def _child(req: dict) -> None:
    """The forked job: never returns."""
    code = 1
    try:
        os.setpgid(0, 0)
        os.close(REQ)
        os.close(REP)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd, path in ((1, req["out"]), (2, req["err"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(f, fd)
            os.close(f)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        sys.path.insert(0, os.path.dirname(req["script"]))   # as `python SCRIPT` does
        sys.argv = [req["script"], *req["argv"]]
        result = getattr(importlib.import_module(req["module"]), req["function"])(req["argv"])
        code = result if isinstance(result, int) else 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - reported as the script's traceback would be
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code if 0 <= code < 256 else 1)


def _lines():
    buf = b""
    while True:
        while b"\n" not in buf:
            chunk = os.read(REQ, 1 << 16)
            if not chunk:
                return
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        yield line


def _say(text: str) -> None:
    os.write(REP, (text + "\n").encode())


def main() -> None:
    os.dup2(2, 1)                    # stray prints of the imports go to stderr, not the protocol
    for name in sys.argv[1:]:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the child imports it again and reports the error
            pass
    for line in _lines():
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(req)
        try:
            os.setpgid(pid, pid)     # also here: no kill of its group may come before it exists
        except OSError:
            pass
        _say(f"pid {pid}")
        _, status, usage = os.wait4(pid, 0)
        _say(f"exit {os.waitstatus_to_exitcode(status)} {usage.ru_utime + usage.ru_stime:.3f}")


if __name__ == "__main__":
    main()
