"""Command-line profilers driven from a notebook: Nsight Compute, Nsight Systems, py-spy and strace.

Each tool is found (:func:`find_tool`), run on a small script in a subprocess with a time limit,
and its output parsed into numbers. A tool that is missing is reported as None by the ``find_*``
functions so a notebook can say so in one sentence; a tool that is present but fails raises
``RuntimeError`` with the end of its output, never a silent empty result.

Sources for the formats parsed here: Nsight Compute CLI documentation (``--csv`` prints one row
per kernel, section and metric: ``"ID","Process ID",...,"Section Name","Metric Name","Metric
Unit","Metric Value"``); strace(1), option ``-c`` (a table of ``% time, seconds, usecs/call,
calls, errors, syscall``).
"""

from __future__ import annotations

import csv
import glob
import html
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import matplotlib.pyplot as plt

from perflab.core.validate import number
from perflab.record.plotting import COLUMN_WIDTH_IN

__all__ = [
    "NcuKernel",
    "find_ncu",
    "find_nsys",
    "find_py_spy",
    "find_strace",
    "find_tool",
    "collapsed_stacks",
    "flamegraph_samples",
    "ncu_duration_s",
    "parse_ncu_csv",
    "parse_strace_summary",
    "plot_flame",
    "py_spy_record",
    "stack_shares",
    "run_ncu",
    "run_nsys",
    "strace_summary",
]


def find_tool(name: str, candidates: Iterable[str] = ()) -> str | None:
    """Path of executable ``name``: on ``PATH`` first, else the first executable match among
    ``candidates`` (paths or glob patterns, later versions first when a glob matches several).

    Returns None when it is nowhere.

    Raises:
        ValueError: ``name`` is empty.
    """
    if not name:
        raise ValueError("name must be a non-empty string")
    found = shutil.which(name)
    if found:
        return found
    for pattern in candidates:
        for path in sorted(glob.glob(os.path.expanduser(str(pattern))), reverse=True):
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    return None


def find_ncu() -> str | None:
    """Nsight Compute's ``ncu``: on PATH, under ``/usr/local/cuda*/bin`` or ``/opt/nvidia/nsight-compute/*``."""
    return find_tool("ncu", ["/usr/local/cuda/bin/ncu", "/usr/local/cuda-*/bin/ncu",
                             "/opt/nvidia/nsight-compute/*/ncu", "/usr/local/NVIDIA-Nsight-Compute*/ncu"])


def find_nsys() -> str | None:
    """Nsight Systems' ``nsys``: on PATH, under ``/usr/local/cuda*/bin`` or
    ``/opt/nvidia/nsight-systems/*/bin``."""
    return find_tool("nsys", ["/usr/local/cuda/bin/nsys", "/usr/local/cuda-*/bin/nsys",
                              "/opt/nvidia/nsight-systems/*/bin/nsys",
                              "/opt/nvidia/nsight-systems-cli/*/bin/nsys"])


def run_nsys(script: str | os.PathLike, nsys: str, report: str | os.PathLike,
             timeout_s: float = 300, python: str | None = None) -> str:
    """Record ``script`` with Nsight Systems between ``torch.cuda.profiler.start()`` and
    ``stop()`` and return ``nsys stats``' kernel and CUDA API summaries (text).

    Runs ``nsys profile --trace=cuda,nvtx,osrt --capture-range=cudaProfilerApi
    --force-overwrite=true --output=<report> python script``, then ``nsys stats --report
    cuda_gpu_kern_sum --report cuda_api_sum <report>.nsys-rep``.

    Raises:
        FileNotFoundError: ``script`` or ``nsys`` does not exist.
        RuntimeError: either command fails (the end of its output says why).
    """
    script = Path(script)
    if not script.exists():
        raise FileNotFoundError(f"script {script} does not exist")
    if not nsys or not Path(nsys).exists():
        raise FileNotFoundError(f"nsys not found at {nsys!r}")
    report = Path(report)
    cmd = [nsys, "profile", "--trace=cuda,nvtx,osrt", "--capture-range=cudaProfilerApi",
           "--force-overwrite=true", f"--output={report}", python or sys.executable, str(script)]
    proc = _run(cmd, timeout_s, "nsys profile")
    if proc.returncode != 0:
        raise RuntimeError(f"nsys profile exited with status {proc.returncode}:\n"
                           f"{_tail(proc.stdout + proc.stderr)}")
    rep = report.with_suffix(".nsys-rep") if report.suffix != ".nsys-rep" else report
    stats = _run([nsys, "stats", "--report", "cuda_gpu_kern_sum", "--report", "cuda_api_sum",
                  str(rep)], timeout_s, "nsys stats")
    if stats.returncode != 0:
        raise RuntimeError(f"nsys stats exited with status {stats.returncode}:\n"
                           f"{_tail(stats.stdout + stats.stderr)}")
    return stats.stdout


def find_py_spy() -> str | None:
    """``py-spy``: on PATH, beside this Python (a virtualenv's ``bin``), or in ``<entry>/bin`` of a
    ``PYTHONPATH`` entry (where ``pip install --target`` puts console scripts)."""
    extra = [str(Path(sys.executable).parent / "py-spy")]
    extra += [str(Path(p) / "bin" / "py-spy") for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return find_tool("py-spy", extra)


def find_strace(root: str | os.PathLike | None = None) -> str | None:
    """``strace``: on PATH, else ``<root>/.tools/bin/strace`` (filled by ``scripts/fetch_tools.sh``).

    ``root`` defaults to the repository root (the folder above this package).
    """
    root = Path(root) if root is not None else Path(__file__).resolve().parent.parent.parent
    return find_tool("strace", [str(root / ".tools" / "bin" / "strace")])


def _run(cmd: Sequence[str], timeout_s: float, what: str) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as err:
        raise RuntimeError(f"{what} did not finish within {timeout_s:.0f} s: {' '.join(cmd)}") from err
    return proc


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# ---------------------------------------------------------------------------------------------
# Nsight Compute
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NcuKernel:
    """One profiled kernel from ``ncu --csv``.

    Attributes:
        id: ncu's kernel ID (launch order among profiled kernels).
        name: kernel name as ncu prints it.
        metrics: ``{metric name: value}`` (floats; thousands separators removed; ``n/a`` dropped).
        units: ``{metric name: unit}`` as printed (``"%"``, ``"ns"``, ``"us"``, ``"Ghz"``, ...).
    """

    id: str
    name: str
    metrics: dict = field(default_factory=dict)
    units: dict = field(default_factory=dict)

    def get(self, metric: str) -> float:
        """The value of ``metric``.

        Raises:
            KeyError: ncu did not report it (the message lists what it did report).
        """
        if metric not in self.metrics:
            raise KeyError(f"ncu reported no {metric!r} for {self.name!r}; it has {sorted(self.metrics)}")
        return self.metrics[metric]


def parse_ncu_csv(text: str) -> list[NcuKernel]:
    """Kernels and metrics from ``ncu --csv`` output (the default ``details`` page).

    Lines before the CSV header (``==PROF==`` messages, the program's own output) are skipped;
    rows without a metric name (rule results) are ignored. Kernels are returned in ID order.

    Raises:
        ValueError: no CSV header with ``"Metric Name"`` and ``"Metric Value"`` columns.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.startswith('"') and '"Metric Name"' in line and '"Metric Value"' in line), None)
    if start is None:
        raise ValueError("no ncu CSV table found (expected a header with \"Metric Name\" and \"Metric Value\")")
    rows = csv.DictReader(io.StringIO("\n".join(l for l in lines[start:] if l.startswith('"'))))
    kernels: dict[str, NcuKernel] = {}
    for row in rows:
        metric = (row.get("Metric Name") or "").strip()
        if not metric:
            continue
        kid = row.get("ID", "0")
        k = kernels.setdefault(kid, NcuKernel(kid, row.get("Kernel Name", "?")))
        raw = (row.get("Metric Value") or "").replace(",", "").strip()
        try:
            k.metrics[metric] = float(raw)
        except ValueError:
            continue  # "n/a" and text values
        k.units[metric] = row.get("Metric Unit", "")
    return [kernels[k] for k in sorted(kernels, key=lambda s: int(s) if s.isdigit() else s)]


_TIME_UNITS = {"ns": 1e-9, "nsecond": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3,
               "s": 1.0, "second": 1.0}


def ncu_duration_s(kernel: NcuKernel) -> float:
    """The kernel's ``Duration`` from the SpeedOfLight section, converted to seconds.

    Raises:
        KeyError: no Duration metric.
        ValueError: a unit this function does not know.
    """
    value = kernel.get("Duration")
    unit = kernel.units.get("Duration", "")
    if unit not in _TIME_UNITS:
        raise ValueError(f"unknown Duration unit {unit!r}")
    return value * _TIME_UNITS[unit]


def run_ncu(script: str | os.PathLike, ncu: str, sections: Sequence[str] = ("SpeedOfLight",),
            timeout_s: float = 300, python: str | None = None) -> tuple[str, list[NcuKernel]]:
    """Profile the kernels that ``script`` launches between ``torch.cuda.profiler.start()`` and
    ``stop()`` with Nsight Compute, clocks left as they are.

    Runs ``ncu --clock-control none --profile-from-start off --section <s>... --csv python script``:
    ``--clock-control none`` keeps the GPU at the clocks it would run at anyway (by default ncu
    locks them to base clocks, which makes every kernel look slower than in real runs), and
    ``--profile-from-start off`` limits profiling to the start/stop range, so the script's
    warm-up and setup kernels are not replayed.

    Returns:
        (the raw ncu output, the parsed kernels).

    Raises:
        FileNotFoundError: ``script`` or ``ncu`` does not exist.
        RuntimeError: ncu exits with an error or profiles no kernel (its output's end says why,
            e.g. ``ERR_NVGPUCTRPERM`` when performance counters are restricted to admin users).
    """
    script = Path(script)
    if not script.exists():
        raise FileNotFoundError(f"script {script} does not exist")
    if not ncu or not Path(ncu).exists():
        raise FileNotFoundError(f"ncu not found at {ncu!r}")
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--csv"]
    for s in sections:
        cmd += ["--section", s]
    cmd += [python or sys.executable, str(script)]
    proc = _run(cmd, timeout_s, "ncu")
    raw = proc.stdout + ("\n" + proc.stderr if proc.stderr.strip() else "")
    if proc.returncode != 0:
        raise RuntimeError(f"ncu exited with status {proc.returncode}:\n{_tail(raw)}")
    try:
        kernels = parse_ncu_csv(proc.stdout)
    except ValueError:
        kernels = []
    if not kernels:
        raise RuntimeError(f"ncu profiled no kernel (did the script call torch.cuda.profiler.start()?):\n{_tail(raw)}")
    return raw, kernels


# ---------------------------------------------------------------------------------------------
# py-spy
# ---------------------------------------------------------------------------------------------

def py_spy_record(script: str | os.PathLike, svg: str | os.PathLike, py_spy: str, duration_s: int = 3,
                  rate_hz: int = 100, args: Sequence[str] = (), timeout_s: float = 120,
                  python: str | None = None, output_format: str = "flamegraph") -> str:
    """Sample ``python script args...`` with ``py-spy record`` and write its samples to ``svg``.

    ``py-spy record -o SVG --duration N --rate R -- python script`` starts the program itself and
    reads its Python stacks from outside the process ``rate_hz`` times a second (it does not slow
    the program down the way an in-process profiler does). ``output_format="flamegraph"`` writes
    py-spy's interactive SVG; ``"raw"`` writes the collapsed stacks (one line per distinct stack:
    ``frame;frame;... count``, read by :func:`collapsed_stacks`). Returns py-spy's own report
    (its stdout and stderr).

    Raises:
        FileNotFoundError: ``script`` or ``py_spy`` does not exist.
        ValueError: ``duration_s`` or ``rate_hz`` not positive, or an unknown ``output_format``.
        PermissionError: the system forbids reading another process's memory (ptrace; common in
            containers without ``CAP_SYS_PTRACE``); the message quotes py-spy.
        RuntimeError: any other failure, or no SVG written.
    """
    script, svg = Path(script), Path(svg)
    if not script.exists():
        raise FileNotFoundError(f"script {script} does not exist")
    if not py_spy or not Path(py_spy).exists():
        raise FileNotFoundError(f"py-spy not found at {py_spy!r}")
    number("duration_s", duration_s, minimum=1)
    number("rate_hz", rate_hz, minimum=1)
    if output_format not in ("flamegraph", "raw"):
        raise ValueError(f"output_format must be 'flamegraph' or 'raw', got {output_format!r}")
    svg.parent.mkdir(parents=True, exist_ok=True)
    cmd = [py_spy, "record", "-o", str(svg), "--format", output_format, "--duration", str(duration_s),
           "--rate", str(rate_hz), "--", python or sys.executable, str(script), *args]
    proc = _run(cmd, timeout_s, "py-spy")
    report = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        low = report.lower()
        if "permission denied" in low or "operation not permitted" in low or "ptrace" in low:
            raise PermissionError(f"py-spy may not read the process here: {_tail(report, 3)}")
        raise RuntimeError(f"py-spy exited with status {proc.returncode}:\n{_tail(report)}")
    if not svg.exists() or svg.stat().st_size == 0:
        raise RuntimeError(f"py-spy wrote no flame graph:\n{_tail(report)}")
    return report


def flamegraph_samples(svg_text: str) -> dict[str, int]:
    """Samples per Python function in a py-spy flame graph (SVG text), inclusive of callees.

    py-spy labels each box ``function (file:line) (N samples, P%)``; boxes of the same function
    (different lines, or different callers) are added up, which counts a recursive function more
    than once. The root box is returned as ``"all"``.

    Raises:
        ValueError: no py-spy box titles in ``svg_text``.
    """
    found: dict[str, int] = {}
    for title in re.findall(r"<title>(.*?)</title>", svg_text, flags=re.S):
        m = re.match(r"(.*) \(([\d,]+) samples?, [\d.]+%\)$", html.unescape(title).strip())
        if not m:
            continue
        label, samples = m.group(1), int(m.group(2).replace(",", ""))
        func = re.sub(r" \([^()]*:\d+\)$", "", label).strip()
        found[func] = found.get(func, 0) + samples
    if not found:
        raise ValueError("no py-spy flame-graph boxes found in the SVG text")
    return found


_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def collapsed_stacks(text: str, files: Iterable[str]) -> dict[tuple[str, ...], int]:
    """The samples of py-spy's collapsed stacks (``--format raw``), kept to the frames of ``files``.

    Each line of ``text`` is ``frame;frame;... count`` from the outermost frame inwards, a frame
    being ``function (path:line)``. Only frames whose file's base name is in ``files`` are kept
    (the program's own code: no interpreter start-up, no library internals, no build paths), and
    each is named by its function alone, so the lines of one function add up; a library call
    made by a kept function counts as that function's own time. Stacks with no kept frame (the
    interpreter starting, imports) are dropped, and so are samples with an empty stack (py-spy
    writes them as a line holding only the count, `` 1``).

    Returns:
        ``{(outermost, ..., innermost): samples}``.

    Raises:
        ValueError: ``files`` is empty, or a line is not ``stack count``.
    """
    keep = {Path(f).name for f in files}
    if not keep:
        raise ValueError("files must name at least one source file")
    stacks: dict[tuple[str, ...], int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        stack, sep, count = line.rpartition(" ")
        if not sep or not count.isdigit():
            raise ValueError(f"not a collapsed stack line: {line[:80]!r}")
        if not stack.strip():       # a sample with no Python frame at all (py-spy writes
            continue                # " 1" for one taken as the interpreter starts or exits)
        frames = []
        for frame in stack.split(";"):
            m = _FRAME.match(frame.strip())
            if m and Path(m.group("file")).name in keep:
                frames.append(m.group("func"))
        if frames:
            key = tuple(frames)
            stacks[key] = stacks.get(key, 0) + int(count)
    return stacks


def stack_shares(stacks: dict[tuple[str, ...], int], functions: Iterable[str],
                 within: str | None = None) -> dict[str, float]:
    """The share of the samples in which each of ``functions`` was on the stack.

    Shares are of the samples whose stack holds ``within`` (e.g. the program's main loop, so
    that set-up does not count), or of all the samples when ``within`` is None. A function on a
    stack twice (recursion) counts once per sample.

    Raises:
        ValueError: no sample holds ``within`` (or no samples at all).
    """
    pool = {k: v for k, v in stacks.items() if within is None or within in k}
    total = sum(pool.values())
    if total == 0:
        raise ValueError(f"no samples{'' if within is None else f' inside {within!r}'}")
    return {f: sum(v for k, v in pool.items() if f in k) / total for f in functions}


def plot_flame(stacks: dict[tuple[str, ...], int], ax=None, root: str = "all samples",
               min_label: float = 0.04):
    """Draw ``stacks`` (from :func:`collapsed_stacks`) as a flame graph, the root at the bottom.

    Each box is a function on a path from the root; its width is the share of the samples in
    which that path was on the stack, its callers below it. Boxes narrower than ``min_label`` of
    the whole are drawn without a label, and a label wider than its box is cut short (``…``);
    ``.<locals>`` is left out of nested functions' names. Returns the axes.
    """
    total = sum(stacks.values())
    if total == 0:
        raise ValueError("no samples to draw")
    if ax is None:
        depth = max(len(k) for k in stacks) + 1
        # drawn at the text column's width, so that its 8-point labels are shown at 8 points
        # (drawn 12 in wide, the page shrank them to ~5 px)
        _, ax = plt.subplots(figsize=(COLUMN_WIDTH_IN, 0.45 * depth + 0.8),
                             layout="constrained")
    # about how many 8-point characters span the axes
    chars = ax.get_position().width * ax.figure.get_figwidth() * 72 / 5.5

    def draw(prefix: tuple[str, ...], x0: float, level: int) -> None:
        children: dict[str, int] = {}
        for k, v in sorted(stacks.items()):
            if len(k) > len(prefix) and k[:len(prefix)] == prefix:
                children[k[len(prefix)]] = children.get(k[len(prefix)], 0) + v
        x = x0
        for name, n in children.items():
            w = n / total
            ax.barh(level, w, left=x, height=0.9, color=plt.cm.YlOrRd(0.3 + 0.5 * ((level * 7 + len(name)) % 5) / 4),
                    edgecolor="white")
            if w >= min_label:
                label = f"{name.replace('.<locals>', '')} ({w:.0%})"
                room = int(w * chars)              # characters that fit in the box
                if len(label) > room:
                    label = label[:max(room - 1, 1)] + "…"
                ax.text(x + w / 2, level, label, ha="center", va="center", fontsize=8, clip_on=True)
            draw(prefix + (name,), x, level + 1)
            x += w

    ax.barh(0, 1.0, left=0.0, height=0.9, color="0.8", edgecolor="white")
    ax.text(0.5, 0, f"{root} ({total:,})", ha="center", va="center", fontsize=8)
    draw((), 0.0, 1)
    ax.set_xlim(0, 1)
    ax.set_yticks([])
    ax.set_xlabel("share of the samples")
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    return ax


# ---------------------------------------------------------------------------------------------
# strace
# ---------------------------------------------------------------------------------------------

def parse_strace_summary(text: str) -> dict[str, dict[str, float]]:
    """The table ``strace -c`` prints, as ``{syscall: {"calls", "errors", "seconds", "pct_time"}}``.

    The ``total`` row is kept under ``"total"``. Lines that are not table rows are skipped.

    Raises:
        ValueError: no table header (``% time ... syscall``) in ``text``.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("% time") and "syscall" in line), None)
    if start is None:
        raise ValueError("no strace -c table found (expected a '% time ... syscall' header)")
    out: dict[str, dict[str, float]] = {}
    for line in lines[start + 1:]:
        parts = line.split()
        if not parts or set(line.strip()) <= {"-", " "}:
            continue
        try:
            pct, seconds = float(parts[0]), float(parts[1])
        except (ValueError, IndexError):
            continue
        name = parts[-1]
        numbers = parts[2:-1]  # usecs/call, calls and (when any failed) errors
        if len(numbers) == 3:
            _, calls, errors = numbers
        elif len(numbers) == 2:
            (_, calls), errors = numbers, "0"
        else:
            continue
        out[name] = {"pct_time": pct, "seconds": seconds, "calls": float(calls), "errors": float(errors)}
    return out


def strace_summary(cmd: Sequence[str], strace: str, syscalls: Sequence[str] = (),
                   timeout_s: float = 120) -> tuple[str, dict[str, dict[str, float]]]:
    """Count the system calls of ``cmd`` with ``strace -c`` (follows child processes with ``-f``).

    Args:
        cmd: the program and its arguments.
        strace: path of the strace binary (:func:`find_strace`).
        syscalls: limit tracing to these (``-e trace=read,pread64``); empty: all.

    Returns:
        (strace's summary text, :func:`parse_strace_summary` of it).

    Raises:
        FileNotFoundError: ``strace`` does not exist.
        ValueError: empty ``cmd``.
        RuntimeError: strace or the program fails.
    """
    if not cmd:
        raise ValueError("cmd must name a program to run")
    if not strace or not Path(strace).exists():
        raise FileNotFoundError(f"strace not found at {strace!r}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "summary.txt"
        full = [strace, "-f", "-c", "-o", str(out)]
        if syscalls:
            full += ["-e", "trace=" + ",".join(syscalls)]
        proc = _run(full + list(cmd), timeout_s, "strace")
        if proc.returncode != 0:
            raise RuntimeError(f"strace exited with status {proc.returncode}:\n{_tail(proc.stdout + proc.stderr)}")
        text = out.read_text()
    return text, parse_strace_summary(text)
