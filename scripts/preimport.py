"""Pages' kernels started ahead of them, their first cells' imports run in them side by side.

``scripts/execute.py`` executes the pages of a call one after the other, each in a kernel of its
own. A page's first code cell is its imports (torch, matplotlib, perflab: 4-14 s on the GPU host
in run f, 184 s over 31 pages) and measures nothing, so the imports of several pages can run at
once. :class:`Ahead` starts the kernels of a group of pages together, each in its page's folder
(:func:`prestart`), sends each one, silently, the import statements its page's first
code cell begins with (:func:`leading_imports`), and waits for every reply before the group's
first page runs its first cell: no page's cell ever runs beside import work. Each page then runs
its first cell as written, recorded with its outputs and seconds as before; its imports are
already in ``sys.modules``, so the cell takes only what it does besides importing.

* Only the imports a cell **begins** with, up to its first statement of any other kind: what runs
  ahead is the start of the cell itself, so no import depends on a statement left out (a
  ``sys.path`` insert, an environment variable set before ``import torch``).
* A pre-run that fails, prints or times out hides nothing: one line in the run's log says so, and
  a page whose imports failed or timed out gets a fresh kernel, where its first cell runs them
  again and the real error, if any, is shown and stops the page as before.
* Every kernel is shut down in order (its exit handlers run: a killed kernel once left chapter 4's
  temporary folder in /tmp): a page's by :func:`execute.execute` after the page, the rest by
  :meth:`Ahead.close` when the call ends, fails or is interrupted.
* ``group`` pages at a time (``execute.py --preimport N``): on the GPU host every page of the
  call (~0.3-0.5 GB of host memory per idle kernel); on a laptop or CI a few. A group of one page
  runs nothing ahead; with ``--preimport 1`` the next page's kernel only starts while this page
  runs its first cell (:meth:`Ahead.then`), as before.

What a page's imports do at import time is checked in ``tests/test_execute.py``: they initialize
no CUDA device (an idle kernel holding a context would shift chapter 7's
``torch.cuda.mem_get_info``) and read no file that another page writes.
"""

from __future__ import annotations

import ast
import contextlib
import datetime as dt
import signal
import time
from pathlib import Path
from typing import Callable

import jupytext
from IPython.core.inputtransformer2 import TransformerManager
from jupyter_client.blocking import BlockingKernelClient
from jupyter_client.manager import KernelManager

from perflab.record import runs

ASYNC_CLIENT = "jupyter_client.asynchronous.AsyncKernelClient"

#: pages whose kernels start and import together by default where there is no CUDA device (a
#: laptop, CI's two cores): each idle kernel holds torch's ~0.3-0.5 GB of host memory
ELSEWHERE = 2


def prestart(md: Path) -> KernelManager:
    """Start the kernel that will execute ``md`` now, in the page's folder, ahead of the page
    (with the imports of other pages, or while the page before runs its first cell, which
    measures nothing). :func:`execute.execute` takes it as ``km`` and shuts it down.

    Its clients are asynchronous, as nbclient's own kernels' are: with the blocking client of a
    plain ``KernelManager``, nbclient's wait for a cell's output blocks its event loop, and a
    cell that runs past the notebook's time limit is never stopped (a prestarted page ran a
    30 s cell under a 3 s limit)."""
    km = KernelManager(kernel_name="python3", client_class=ASYNC_CLIENT)
    # as nbclient starts its own (its ipython_hist_file): no history database on disk
    km.start_kernel(cwd=str(runs.home(md)),
                    extra_arguments=["--HistoryManager.hist_file=:memory:"])
    return km


@contextlib.contextmanager
def terminate_as_exit():
    """While the pages run, SIGTERM (a time limit's ``timeout``, a device tool) raises
    SystemExit in the main thread, so every kernel is shut down in order (its exit handlers run)
    instead of left to die with this process (a second SIGTERM meanwhile is ignored)."""
    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)
    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:               # not the main thread: nothing to install
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def leading_imports(source: str) -> str:
    """The ``import``/``from ... import`` statements a code cell begins with, in order, up to its
    first statement of any other kind; ``""`` when it begins otherwise or does not parse.
    IPython syntax (``%magic``, ``!command``) is read as IPython reads it: a call, so it ends the
    imports."""
    try:
        python = TransformerManager().transform_cell(source)
        tree = ast.parse(python)
    except (SyntaxError, ValueError):
        return ""
    found = []
    for node in tree.body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            break
        found.append(ast.get_source_segment(python, node))
    return "\n".join(found)


def first_cell(md: Path) -> str | None:
    """The source of ``md``'s first code cell (None: the page has no code)."""
    cells = [c for c in jupytext.read(md).cells if c.cell_type == "code"]
    return cells[0].source if cells else None


def _when(value) -> dt.datetime | None:
    """A message's timestamp (a datetime, or an ISO string) as an aware datetime."""
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    return None


def _shut_down(kms: list[KernelManager]) -> None:
    """Shut down ``kms`` in order, side by side, as ``KernelManager.shutdown_kernel`` does one
    (an interrupt, in case it still imports; a shutdown request; killed only if it has not
    exited after jupyter_client's wait), but each step to all of them at once: their exit
    handlers run."""
    asked = []
    for km in kms:
        if km.has_kernel:
            try:
                km.interrupt_kernel()
                km.request_shutdown()
                asked.append(km)
            except Exception:   # no channel to it any more: jupyter_client's forced path
                km.shutdown_kernel(now=True)
    for km in asked:
        km.finish_shutdown()
        km.cleanup_resources()


class Ahead:
    """The kernels of a call's pages, started and given their imports ``group`` pages at a time.

    ``pages``: the call's pages in order; ``timeout_s``: how long a kernel may take to start and
    import; ``log``: one line of the run's log; ``start(md)``: starts ``md``'s kernel in its
    folder (default :func:`prestart`). Use as a context manager (:meth:`close` at its end), and
    for page ``k`` (0-based) take :meth:`kernel` right before executing it."""

    def __init__(self, pages: list[Path], group: int, timeout_s: float = 600,
                 log: Callable[[str], None] = print,
                 start: Callable[[Path], KernelManager] | None = None):
        self.pages, self.group = list(pages), max(1, int(group))
        self.start = start or (lambda md: prestart(md))    # looked up when called (tests patch it)
        self.timeout_s, self.log = timeout_s, log
        self._kms: dict[int, KernelManager] = {}     # started, not yet handed to a page
        self._seconds: dict[int, float] = {}         # each page's imports run ahead, its kernel's clock
        self._started: set[int] = set()

    def __enter__(self) -> Ahead:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Shut down, in order, every kernel started and not handed to its page."""
        kms, self._kms = list(self._kms.values()), {}
        _shut_down(kms)

    def kernel(self, k: int) -> tuple[KernelManager | None, float]:
        """Page ``k``'s kernel (None: :func:`execute.execute` starts one) and the seconds its
        imports took ahead (0.0: none ran). With groups of several pages, the first page of a
        group starts the group's kernels and returns only once every one's imports replied; a
        page left alone in its group (a call of one page, the last of an odd number) runs as
        without ``--preimport``."""
        if self.group > 1 and k not in self._started:
            ks = range(k, min(k + self.group, len(self.pages)))
            if len(ks) > 1:
                self._prepare(ks)
            self._started.update(ks)          # a group of one: nothing to run beside it
        return self._kms.pop(k, None), self._seconds.pop(k, 0.0)

    def then(self, k: int) -> Callable[[], None] | None:
        """With groups of one page: what page ``k`` calls before its first cell, to start page
        ``k + 1``'s kernel meanwhile (its first cell measures nothing). Otherwise None."""
        if self.group > 1 or k + 1 >= len(self.pages):
            return None
        nxt = k + 1

        def start_next():
            self._started.add(nxt)
            self._start(nxt)
        return start_next

    def _start(self, k: int) -> None:
        """Start page ``k``'s kernel; one that fails to start is a line of the log, and the
        page starts its own when its turn comes (where a real failure then shows)."""
        try:
            self._kms[k] = self.start(self.pages[k])
        except Exception as err:       # a kernel spec, a port, a file limit
            self.log(f"[imports] {self.pages[k].name}: its kernel did not start ahead "
                     f"({type(err).__name__}: {err}); the page starts its own")

    def _prepare(self, ks: range) -> None:
        t0 = time.monotonic()
        sources = {k: first_cell(self.pages[k]) for k in ks}
        for k in ks:
            if sources[k] is not None:           # a page without code needs no kernel
                self._start(k)
        sent = {}
        for k in ks:
            if k in self._kms and (code := leading_imports(sources[k])):
                sent[k] = self._send(k, code)
        for k, (kc, msg_id) in sent.items():
            self._collect(k, kc, msg_id, t0)
        took = sorted(self._seconds[k] for k in sent if k in self._seconds)
        if took:
            self.log(f"[imports] {len(took)} page(s) ran their first cell's imports side by side "
                     f"in {time.monotonic() - t0:.1f} s, kernels' start included (each "
                     f"{took[0]:.1f}-{took[-1]:.1f} s, {sum(took):.1f} s in all)")

    def _send(self, k: int, code: str):
        """Connect to page ``k``'s kernel once it is up and send it its imports."""
        km = self._kms[k]
        kc = BlockingKernelClient(**km.get_connection_info(session=True),
                                  connection_file=km.connection_file, parent=km)
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=self.timeout_s)
        except RuntimeError as err:
            kc.stop_channels()
            self._drop(k, f"its kernel did not start ({err})")
            return None, None
        return kc, kc.execute(code, silent=True, store_history=False)

    def _collect(self, k: int, kc, msg_id, t0: float) -> None:
        """Wait for page ``k``'s reply; note what it printed; drop its kernel if it failed."""
        if kc is None:
            return
        reply, printed = None, []
        try:
            while reply is None:
                left = self.timeout_s - (time.monotonic() - t0)
                msg = kc.get_shell_msg(timeout=max(left, 0.1))
                if msg["parent_header"].get("msg_id") == msg_id:
                    reply = msg
            while True:                    # its outputs, up to its 'idle' (they come before)
                msg = kc.get_iopub_msg(timeout=10)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "stream":
                    printed.append(msg["content"]["text"])
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    break
        except Exception:                  # queue.Empty: no reply or no 'idle' in time
            pass
        finally:
            kc.stop_channels()
        if reply is None:
            self._drop(k, f"its imports did not finish within {self.timeout_s:.0f} s")
            return
        began, ended = _when(reply["metadata"].get("started")), _when(reply["header"].get("date"))
        if began and ended:
            self._seconds[k] = (ended - began).total_seconds()
        text = " ".join("".join(printed).split())
        if text:
            self.log(f"[imports] {self.pages[k].name}: its imports, run ahead, printed: "
                     f"{text[:200]}")
        content = reply["content"]
        if content.get("status") != "ok":
            self._seconds.pop(k, None)
            self._drop(k, f"its imports failed ahead ({content.get('ename')}: "
                          f"{content.get('evalue')})")

    def _drop(self, k: int, why: str) -> None:
        """Shut page ``k``'s kernel down; the page starts a fresh one and runs its cell there."""
        self.log(f"[imports] {self.pages[k].name}: {why}; the page runs its first cell in a "
                 "fresh kernel")
        km = self._kms.pop(k, None)
        if km is not None:
            if km.has_kernel:
                km.shutdown_kernel()
