"""The grader's sandbox: one per submission, built with bubblewrap.

Each submission's kernel runs

* in its own namespaces (``bwrap``): mount, PID (nothing it starts outlives it: when the
  sandbox's first process ends, the kernel kills every process in the namespace), network (no
  interface but its own loopback), IPC, UTS and cgroup;
* as an unprivileged user of its own: as root the grader starts ``bwrap`` and ``setpriv``
  drops to a *slot uid* (and the gid of the same number) with no capabilities, no supplementary
  groups and ``no_new_privs``. Each of the ``--jobs`` submissions graded at once has a uid of
  its own, claimed by :func:`detect` from :data:`SLOT_UIDS` (uids no account, group or running
  process uses; a lock file held for the whole run keeps two grading runs on one machine from
  claiming the same one), so that what the kernel counts per uid (``RLIMIT_NPROC``: every
  task, threads included) is counted per submission: a fork or thread bomb in one sandbox
  cannot use up the processes its neighbour needs to start its kernel. As another user
  ``bwrap`` makes a user namespace (uid 65534 inside, the grader's uid outside, for every
  sandbox) and forbids nested ones; there ``RLIMIT_NPROC`` is set *inside* the new namespace
  (``prlimit``), where the kernel counts it per namespace, so per sandbox, too (set before,
  it would cap the tasks of the grader's uid everywhere, the grader's own included);
* with a read-only view of the system (``/usr``, ``/etc``, the Python installation, ``/sys``),
  a read-only *student tree* at ``/course`` (perflab, the student editions, the reference
  chapters the labs read; no lab source, no solution), a private ``/tmp`` and ``/dev/shm``, and
  one writable folder, its home ``/home/student`` (a tmpfs: what it writes counts against its
  memory and vanishes with it). A Python environment under ``/tmp`` is bound inside the
  private ``/tmp``, so a clone or environment there works too;
* under limits on the memory and the number of processes of the *whole sandbox*: a cgroup (v2,
  else v1) per submission where one can be made, else per-process ``RLIMIT_AS``, the
  per-submission ``RLIMIT_NPROC`` above (``max_procs * TASKS_PER_PROCESS`` tasks, as the
  cgroup's pids limit) and the grader's own accounting of the sandbox's processes
  (proportional set sizes summed, processes and their tasks counted, every 0.2 s), which kills
  the sandbox when either is exceeded or its tasks reach ``RLIMIT_NPROC`` (where forks start
  to fail). :func:`detect` says which one this machine allows.

Where ``bwrap`` cannot make these namespaces (not installed, or a container that forbids them)
:func:`detect` raises :class:`SandboxUnavailable` with one line, and the grader refuses to run
submissions.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import grp
import os
import pwd
import resource
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

UID = 65534                      # "nobody": the sandbox's user (and group) inside a user namespace
#: the uids (and gids) the sandboxes run as when the grader is root, one per job slot: systemd's
#: table of uid ranges leaves 65520-65533 unused (its dynamic users end at 65519, 65534 is
#: "nobody"); :func:`claim_uids` skips any that an account, a group or a process uses
SLOT_UIDS = range(65520, 65534)
LOCKS = Path("/run/lock")        # where the claims on slot uids are held (else /tmp)
TREE = "/course"                 # the student tree, read-only
HOME = "/home/student"           # the one writable folder (tmpfs); labs run in HOME/labs
IPC = "/run/kernel"              # the kernel's connection file and sockets
HOSTNAME = "sandbox"
CGROUP = Path("/sys/fs/cgroup")


class SandboxUnavailable(RuntimeError):
    """Submissions cannot be isolated on this machine; the message says why in one line."""


@dataclass
class Sandbox:
    """How submissions are isolated on this machine (see :func:`detect`)."""

    bwrap: str
    privileged: bool                       # True: bwrap as root, then setpriv to a slot uid
    limits: str                            # "cgroup v2", "cgroup v1" or "polled"
    why_not_cgroup: str = ""
    cgroups: dict[str, Path] = field(default_factory=dict)   # controller -> this run's folder
    setpriv: str | None = None
    prlimit: str | None = None
    #: one uid per job slot: the claimed slot uids as root, else UID (inside) for every slot
    uids: list[int] = field(default_factory=lambda: [UID])
    locks: list[int] = field(default_factory=list, repr=False)   # fds holding the claims

    def describe(self) -> str:
        """One line: the isolation and the limits in force."""
        ids = ", ".join(str(u) for u in self.uids)
        who = (f"uid {ids} (one per job slot; setpriv, no capabilities)" if self.privileged
               else f"uid {UID} in a user namespace per sandbox (the grader's uid outside)")
        lim = self.limits + (f" ({self.why_not_cgroup})" if self.why_not_cgroup else "")
        return f"sandbox: bwrap, {who}, no network; memory and process limits: {lim}"

    def close(self) -> None:
        """Remove this run's cgroup folders (each submission's are removed as it ends) and give
        back its slot uids."""
        for path in self.cgroups.values():
            _rmdir(path)
        for fd in self.locks:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.locks = []


def _run_quiet(cmd: list[str], timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


def python_dirs() -> list[str]:
    """The folders the sandbox needs to run this Python (installation and environment), outermost only."""
    dirs = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix,
                                          os.path.dirname(os.path.realpath(sys.executable)))}
    dirs |= {os.path.abspath(p) for p in (sys.prefix,)}          # the venv at its own (unresolved) path
    out = []
    for d in sorted(dirs, key=len):
        if d.startswith("/usr/") or d == "/usr" or any(d == o or d.startswith(o + "/") for o in out):
            continue
        out.append(d)
    return out


def command(sandbox: Sandbox, *, tree: Path, ipc: Path, env: dict[str, str], argv: list[str],
            size_bytes: int, hide: list[Path], extra_ro: list[tuple[str, str]] = (),
            uid: int | None = None, nproc: int = 0) -> list[str]:
    """The ``bwrap`` command line that runs ``argv`` in a fresh sandbox.

    ``tree`` (with a ``hosts`` file, :func:`write_hosts`) is bound read-only at ``/course``, ``ipc`` read-write at ``/run/kernel``, each
    ``(outside, inside)`` of ``extra_ro`` read-only (after the tree, so inside it); ``env`` is
    the sandbox's whole environment; ``size_bytes`` caps each tmpfs (``/tmp``, ``/dev/shm``, the
    home). No folder in ``hide`` (the instructor's clone) may be bound, even through the Python
    installation: that raises :class:`SandboxUnavailable`. ``uid``: the job slot's uid (as root;
    default the first slot's). ``nproc`` (not as root): the ``RLIMIT_NPROC`` set inside the
    sandbox's user namespace (:meth:`Limits.nproc_inside`; 0: none).
    """
    if uid is None:
        uid = sandbox.uids[0]
    args = [sandbox.bwrap, "--die-with-parent", "--new-session", "--hostname", HOSTNAME]
    if sandbox.privileged:
        args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    else:
        args += ["--unshare-user", "--uid", str(UID), "--gid", str(UID), "--disable-userns",
                 "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    for top in ("/usr", "/etc", "/opt"):
        if os.path.isdir(top) and not os.path.islink(top):
            args += ["--ro-bind", top, top]
    # the sandbox's own name resolves to its loopback (torchrun and gloo look it up)
    args += ["--ro-bind", str(tree / "hosts"), "/etc/hosts"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    size = str(max(size_bytes, 64 * 2**20))
    # the private /tmp first: a Python environment (or a clone) under /tmp is bound inside it below
    args += ["--perms", "1777", "--size", size, "--tmpfs", "/tmp"]
    made: set[str] = {"/tmp"}

    def parents(path: str) -> list[str]:
        # bwrap would make missing parents with the mode of the outside folder (0700 for
        # /root): make them 0755, so that the unprivileged user can reach what is bound
        out = []
        for i in range(2, len(Path(path).parts)):
            p = str(Path(*Path(path).parts[:i]))
            if p not in made and not any(p == t or p.startswith(t + "/") for t in ("/usr", "/etc", "/opt")):
                made.add(p)
                out += ["--perms", "0755", "--dir", p]
        return out

    for d in python_dirs():
        for h in hide:
            h = os.path.realpath(h)
            if h == d or h.startswith(d + "/"):
                raise SandboxUnavailable(f"the Python environment {d} contains the course clone {h}: "
                                         "use a virtual environment outside it or in its .venv")
        args += parents(d) + ["--ro-bind", d, d]
    args += ["--ro-bind", "/sys", "/sys", "--proc", "/proc", "--dev", "/dev"]
    for dev in sorted(Path("/dev").glob("nvidia*")) + [Path("/dev/dri")]:
        if dev.exists():
            args += ["--dev-bind", str(dev), str(dev)]
    args += ["--perms", "1777", "--size", size, "--tmpfs", "/dev/shm",
             "--ro-bind", str(tree), TREE]
    for outside, inside in extra_ro:
        args += ["--ro-bind", outside, inside]
    args += parents(HOME) + ["--perms", "0777", "--size", size, "--tmpfs", HOME,
             "--perms", "0777", "--dir", HOME + "/labs",
             "--symlink", TREE + "/book", HOME + "/book",
             *parents(IPC), "--bind", str(ipc), IPC,
             "--chdir", HOME + "/labs", "--clearenv"]
    for k, v in sorted(env.items()):
        args += ["--setenv", k, v]
    args.append("--")
    if sandbox.privileged:
        args += [sandbox.setpriv or "setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups",
                 "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]
    elif nproc:
        # in the sandbox's user namespace, where the kernel counts the tasks of this namespace
        args += [sandbox.prlimit or "prlimit", f"--nproc={nproc}:{nproc}", "--"]
    return args + argv


def write_hosts(tree: Path) -> None:
    """The sandbox's ``/etc/hosts`` (kept in the student tree): its hostname is loopback."""
    (tree / "hosts").write_text(f"127.0.0.1\tlocalhost {HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n")


# ---------------------------------------------------------------------------------------------
# Detection
# ---------------------------------------------------------------------------------------------

def _own_cgroup(controller: str) -> str | None:
    """This process's cgroup path for ``controller`` ("" = the v2 hierarchy)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and (parts[1] == controller or controller in parts[1].split(",")):
            return parts[2]
    return None


def _rmdir(path: Path, tries: int = 50) -> None:
    for _ in range(tries):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


def _remove_stale(parent: Path) -> None:
    """Remove the empty cgroups of earlier runs whose grader is gone (killed with SIGKILL)."""
    for old in parent.glob("perflab-grade-*"):
        pid = old.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            for sub in old.iterdir():
                if sub.is_dir():
                    _rmdir(sub, tries=1)
            _rmdir(old, tries=1)


def _cgroup_v2(run: str) -> tuple[dict[str, Path], str]:
    if not (CGROUP / "cgroup.controllers").exists():
        return {}, "no cgroup v2 hierarchy"
    own = _own_cgroup("")
    if own is None:
        return {}, "no cgroup v2 entry in /proc/self/cgroup"
    parent = CGROUP / own.lstrip("/")
    try:
        available = set((parent / "cgroup.controllers").read_text().split())
    except OSError as err:
        return {}, f"cgroup v2: {err.strerror}"
    if not {"memory", "pids"} <= available:
        return {}, "cgroup v2 without the memory and pids controllers here"
    base = parent / run
    _remove_stale(parent)
    try:
        base.mkdir()
    except OSError as err:
        return {}, f"cgroup v2 not writable ({err.strerror})"
    try:
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
        if not {"memory", "pids"} <= enabled:
            (parent / "cgroup.subtree_control").write_text("+memory +pids")
        (base / "cgroup.subtree_control").write_text("+memory +pids")
    except OSError as err:
        _rmdir(base)
        return {}, f"cgroup v2 controllers cannot be delegated here ({err.strerror})"
    return {"unified": base}, ""


def _v1_mount(controller: str) -> Path | None:
    """Where the cgroup v1 hierarchy of ``controller`` is mounted, if it is."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup" and controller in parts[3].split(","):
            return Path(parts[1])
    return None


def _cgroup_v1(run: str) -> tuple[dict[str, Path], str]:
    out: dict[str, Path] = {}
    for ctl in ("memory", "pids"):
        own = _own_cgroup(ctl)
        mount = _v1_mount(ctl)
        if own is None or mount is None:
            for p in out.values():
                _rmdir(p)
            return {}, f"no cgroup v1 {ctl} hierarchy"
        base = mount / own.lstrip("/") / run
        _remove_stale(base.parent)
        try:
            base.mkdir(parents=False)
        except OSError as err:
            for p in out.values():
                _rmdir(p)
            return {}, f"cgroup v1 {ctl} not writable ({err.strerror})"
        out[ctl] = base
    return out, ""


def _uid_in_use(uid: int) -> str | None:
    """Why ``uid`` (and the gid of the same number) cannot be a sandbox's: an account or a group
    has it, or a process runs as it. None when it is free."""
    try:
        return f"the account {pwd.getpwuid(uid).pw_name!r}"
    except KeyError:
        pass
    try:
        return f"the group {grp.getgrgid(uid).gr_name!r}"
    except KeyError:
        pass
    if any(_owner(pid) == uid for pid in processes()):
        return "a running process"
    return None


def claim_uids(count: int, candidates=SLOT_UIDS, locks: Path | None = None) -> tuple[list[int], list[int]]:
    """Claim ``count`` unused uids of ``candidates`` for this run's job slots (as root).

    A uid is claimed by an exclusive ``flock`` on ``perflab-grade-uid-<uid>`` in ``locks``
    (``/run/lock``, else ``/tmp``), held until the returned fds are closed
    (:meth:`Sandbox.close`) or the grader exits, so that two grading runs on one machine never
    share one; a uid an account, a group or a process uses (:func:`_uid_in_use`) is skipped.
    Returns ``(uids, lock fds)``; raises :class:`SandboxUnavailable` when too few are free.
    """
    where = locks or (LOCKS if LOCKS.is_dir() else Path("/tmp"))
    uids: list[int] = []
    fds: list[int] = []
    for uid in candidates:
        if len(uids) == count:
            break
        if _uid_in_use(uid):
            continue
        try:
            fd = os.open(where / f"perflab-grade-uid-{uid}", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
        except OSError:                 # a file another user put there (or a link): not ours
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:                 # another grading run holds it
            os.close(fd)
            continue
        if _uid_in_use(uid):            # a process that started meanwhile
            os.close(fd)
            continue
        uids.append(uid)
        fds.append(fd)
    if len(uids) < count:
        for fd in fds:
            os.close(fd)
        raise SandboxUnavailable(
            f"--jobs {count} needs {count} unused uids for its sandboxes, only {len(uids)} of "
            f"{min(candidates)}-{max(candidates)} are free (other grading runs, accounts or processes use the rest)")
    return uids, fds


def detect(limits: str = "auto", hide: list[Path] | None = None, scratch: Path | None = None,
           jobs: int = 1) -> Sandbox:
    """What isolation this machine allows; tries a real sandbox once.

    ``limits``: ``"auto"`` (a cgroup if one can be made, else polled limits), ``"cgroup"``
    (refuse without one) or ``"polled"`` (never use cgroups). ``scratch``: a folder for the
    trial run. ``jobs``: the submissions graded at once; as root each gets a slot uid of its own
    (:func:`claim_uids`, given back by :meth:`Sandbox.close`). Raises :class:`SandboxUnavailable`
    (one line) when submissions cannot be isolated.
    """
    if limits not in ("auto", "cgroup", "polled"):
        raise ValueError(f"limits must be 'auto', 'cgroup' or 'polled', got {limits!r}")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap is not installed (apt-get install bubblewrap): "
                                 "submissions cannot be isolated")
    privileged = os.geteuid() == 0
    setpriv, prlimit = shutil.which("setpriv"), shutil.which("prlimit")
    if privileged and setpriv is None:
        raise SandboxUnavailable("setpriv (util-linux) is missing: cannot drop to an unprivileged uid")
    if not privileged and prlimit is None:
        raise SandboxUnavailable("prlimit (util-linux) is missing: cannot limit a sandbox's processes")
    box = Sandbox(bwrap=bwrap, privileged=privileged, limits="polled", setpriv=setpriv, prlimit=prlimit,
                  uids=[UID] * max(1, jobs))
    if privileged:
        box.uids, box.locks = claim_uids(max(1, jobs))
    try:
        _trial(box, hide, scratch)
    except BaseException:
        box.close()
        raise
    if limits != "polled":
        run = f"perflab-grade-{os.getpid()}"
        why = []
        for attempt in (_cgroup_v2, _cgroup_v1):
            found, reason = attempt(run)
            if found:
                box.cgroups = found
                box.limits = "cgroup v2" if "unified" in found else "cgroup v1"
                break
            why.append(reason)
        else:
            if limits == "cgroup":
                box.close()
                raise SandboxUnavailable("no cgroup can be made for the sandboxes: " + "; ".join(why))
            box.why_not_cgroup = why[-1]
    else:
        box.why_not_cgroup = "as asked"
    return box


def _trial(box: Sandbox, hide: list[Path] | None, scratch: Path | None) -> None:
    """Run one sandbox of each slot uid; raise :class:`SandboxUnavailable` when one fails."""
    trial = Path(scratch or "/nonexistent")
    tree, ipc = trial / "tree", trial / "ipc"
    tree.mkdir(parents=True, exist_ok=True)
    (tree / "book").mkdir(exist_ok=True)
    write_hosts(tree)
    ipc.mkdir(exist_ok=True)
    os.chmod(ipc, 0o777)
    for uid in dict.fromkeys(box.uids):
        try:
            cmd = command(box, tree=tree, ipc=ipc, env={"PATH": "/usr/bin:/bin"}, size_bytes=2**26,
                          hide=hide or [], uid=uid, nproc=64,
                          argv=["/bin/sh", "-c", f'[ "$(id -u)" = {uid} ] && touch {IPC}/ok-{uid}'])
            got = _run_quiet(cmd)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise SandboxUnavailable(f"bwrap could not be run: {err}") from None
        if got.returncode != 0 or not (ipc / f"ok-{uid}").exists():
            why = (got.stderr.strip().splitlines() or [f"exit status {got.returncode}"])[-1]
            raise SandboxUnavailable(f"bwrap cannot create the sandbox's namespaces here ({why}): "
                                     "submissions cannot be isolated")
    shutil.rmtree(trial, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Processes of one sandbox
# ---------------------------------------------------------------------------------------------

def _table() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, start time in clock ticks since boot)} of every process (Linux /proc).
    A pid and its start time name one process: pids are reused (``pid_max`` may be 32768)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                table[int(entry)] = (int(fields[1]), int(fields[19]))
            except (OSError, IndexError, ValueError):
                pass
    return table


def processes() -> dict[int, int]:
    """{pid: parent pid} of every process (Linux /proc)."""
    return {pid: ppid for pid, (ppid, _) in _table().items()}


def has_token(pid: int, token: bytes) -> bool:
    """Whether process ``pid`` was started with ``token`` in its environment."""
    try:
        return token in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def _pidns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


class Tracker:
    """The processes of one submission: its worker's descendants, those in the sandbox's PID
    namespace (which none can leave), and any carrying its environment token.

    Nothing of another submission may count as this one's (its processes would be killed with
    this one's, its tasks counted against this one's limits): a process is known by its pid
    *and* start time, since a pid is reused once its process is gone (a sandbox that forks and
    exits in a loop turns 32768 pids over in seconds), and each PID namespace found is held open
    (:meth:`close` lets go), since the kernel reuses a dead namespace's inode number, the name
    it is known by, for the next namespace made: the next sandbox's.
    """

    def __init__(self, root_pid: int, token: str):
        self.root = root_pid
        self.token = f"PERFLAB_GRADE_TOKEN={token}".encode()
        start = _table().get(root_pid)
        self.known: dict[int, int] = {root_pid: start[1]} if start else {}
        self.namespaces: set[str] = set()
        self._ns_fds: list[int] = []
        self.own_ns = _pidns(os.getpid())

    def _hold(self, pid: int, ns: str) -> None:
        """Hold ``pid``'s PID namespace ``ns`` open, so that its name stays its own."""
        try:
            fd = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        if os.readlink(f"/proc/self/fd/{fd}") == ns:      # still that process's namespace
            self._ns_fds.append(fd)
            self.namespaces.add(ns)
        else:
            os.close(fd)

    def scan(self) -> set[int]:
        """The submission's live processes (the worker included)."""
        table = _table()
        alive = {p for p, start in self.known.items() if p in table and table[p][1] == start}
        changed = True
        while changed:
            changed = False
            for pid, (ppid, _) in table.items():
                if pid not in alive and (ppid in alive or _pidns(pid) in self.namespaces
                                         or has_token(pid, self.token)):
                    alive.add(pid)
                    changed = True
        for pid in alive:
            ns = _pidns(pid)
            if ns and ns != self.own_ns and ns not in self.namespaces:
                self._hold(pid, ns)
        for pid in alive:
            self.known[pid] = table[pid][1]
        return alive

    def close(self) -> None:
        """Let go of the PID namespaces held (after :meth:`kill_all`)."""
        for fd in self._ns_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._ns_fds = []

    def sandboxed(self) -> set[int]:
        """The live processes inside the sandbox's PID namespace."""
        return {p for p in self.scan() if _pidns(p) in self.namespaces}

    def kill_all(self) -> None:
        """SIGKILL every process of the submission until none is left (and reap our children)."""
        for _ in range(40):
            alive = self.scan()
            if not alive:
                return
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            _reap()
            time.sleep(0.05)


def reclaim(uid: int, tries: int = 40) -> bool:
    """SIGKILL every process whose real uid is the slot uid ``uid`` (as root: only the sandboxes
    of its slot run as it) until none is left; True when none is. Called before the slot's uid
    passes to the next submission."""
    for _ in range(tries):
        left = [pid for pid in processes() if _owner(pid) == uid]
        if not left:
            return True
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        _reap()
        time.sleep(0.05)
    return False


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _pss(pid: int) -> int:
    """Proportional set size of ``pid`` in bytes (shared pages divided among their users)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


TASKS_PER_PROCESS = 8     # the cgroup's pids limit counts threads: allow this many per process


class Limits:
    """The memory and process limits of one submission's sandbox.

    ``memory_bytes`` (0: none) and ``max_procs`` apply to the whole sandbox; ``cpu_seconds`` and a
    1 GiB file-size limit to each process. In a cgroup the kernel enforces the memory limit (its
    OOM killer) and a limit of ``max_procs * TASKS_PER_PROCESS`` tasks (threads count as tasks:
    a fork bomb meets it within microseconds); :meth:`exceeded` reads the cgroup's counters and
    counts its processes. In polled mode the same number of tasks is the sandbox's
    ``RLIMIT_NPROC``, counted for its own ``uid`` (its job slot's, as root) or its own user
    namespace (:attr:`nproc_inside`, not as root), never shared with another sandbox; and
    :meth:`exceeded` adds up the sandbox's processes and their tasks.
    """

    def __init__(self, sandbox: Sandbox, name: str, memory_bytes: int, max_procs: int, cpu_seconds: int,
                 uid: int | None = None):
        self.sandbox, self.memory, self.max_procs, self.cpu = sandbox, memory_bytes, max_procs, cpu_seconds
        self.uid = sandbox.uids[0] if uid is None else uid
        self.tasks = max_procs * TASKS_PER_PROCESS
        self.dirs: dict[str, Path] = {}
        self.peak = 0
        self.polled_over: str | None = None
        self.nproc = 0
        self.nproc_inside = 0
        for ctl, base in sandbox.cgroups.items():
            d = base / name
            d.mkdir()
            self.dirs[ctl] = d
        if "unified" in self.dirs:
            d = self.dirs["unified"]
            if memory_bytes:
                (d / "memory.max").write_text(str(memory_bytes))
                if (d / "memory.swap.max").exists():
                    (d / "memory.swap.max").write_text("0")
            (d / "pids.max").write_text(str(max_procs * TASKS_PER_PROCESS))
        if "memory" in self.dirs and memory_bytes:
            (self.dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory_bytes))
            memsw = self.dirs["memory"] / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                memsw.write_text(str(memory_bytes))
        if "pids" in self.dirs:
            (self.dirs["pids"] / "pids.max").write_text(str(max_procs * TASKS_PER_PROCESS))
        if not self.dirs and sandbox.privileged:
            # RLIMIT_NPROC counts every task (thread) of the uid, which is this job slot's alone
            # (claim_uids): none should run as it yet; if one does, it is not the sandbox's
            self.nproc = sum(_tasks(pid) for pid in processes() if _owner(pid) == self.uid) + self.tasks
        elif not self.dirs:
            self.nproc_inside = self.tasks      # set in the sandbox's user namespace (command())

    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files the sandbox's first process writes its pid to."""
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def rlimits(self) -> dict[str, int]:
        """Per-process limits for the sandbox's first process (inherited by all it starts)."""
        out = {"RLIMIT_CPU": self.cpu, "RLIMIT_CORE": 0, "RLIMIT_FSIZE": 2**30}
        if not self.dirs:
            if self.memory:
                out["RLIMIT_AS"] = self.memory
            if self.nproc:
                out["RLIMIT_NPROC"] = self.nproc
        return out

    def exceeded(self, tracker: Tracker | None = None) -> str | None:
        """``"memory"`` or ``"processes"`` when the sandbox hit a limit, else None."""
        if self.dirs:
            use = self.usage()
            if use["oom_kills"]:
                return "memory"
            procs = next(iter(self.dirs.values())) / "cgroup.procs"
            try:
                count = len(procs.read_text().split())
            except OSError:
                count = 0
            if use["fork_refused"] or count > self.max_procs + 1:   # + bwrap's own monitor process
                self.polled_over = "processes"
            return self.polled_over
        if tracker is None:
            return None
        inside = tracker.sandboxed()
        total = sum(_pss(p) for p in inside)
        self.peak = max(self.peak, total)
        # the tasks RLIMIT_NPROC counts: as root those of the slot's uid (bwrap's own run as
        # root), else all of the sandbox's user namespace
        tasks = sum(_tasks(p) for p in inside if not self.sandbox.privileged or _owner(p) == self.uid)
        if len(inside) > self.max_procs or tasks >= self.tasks:
            self.polled_over = "processes"
        elif self.memory and total > self.memory:
            self.polled_over = "memory"
        return self.polled_over

    def usage(self) -> dict:
        """``peak_bytes`` (the sandbox's largest memory use seen), ``oom_kills``, ``fork_refused``."""
        out = {"peak_bytes": self.peak, "oom_kills": 0, "fork_refused": 0}
        if "unified" in self.dirs:
            d = self.dirs["unified"]
            out["peak_bytes"] = _int(d / "memory.peak") or self.peak
            out["oom_kills"] = _field(d / "memory.events", "oom_kill") + _field(d / "memory.events", "oom_group_kill")
            out["fork_refused"] = _field(d / "pids.events", "max")
        if "memory" in self.dirs:
            d = self.dirs["memory"]
            out["peak_bytes"] = _int(d / "memory.max_usage_in_bytes")
            out["oom_kills"] = _field(d / "memory.oom_control", "oom_kill")
        if "pids" in self.dirs:
            out["fork_refused"] = _field(self.dirs["pids"] / "pids.events", "max")
        if self.polled_over == "memory":
            out["oom_kills"] = max(out["oom_kills"], 1)
        if self.polled_over == "processes":
            out["fork_refused"] = max(out["fork_refused"], 1)
        self.peak = max(self.peak, out["peak_bytes"])
        return out

    def kill(self) -> None:
        """SIGKILL every process in the sandbox's cgroups (a no-op in polled mode)."""
        for d in self.dirs.values():
            if (d / "cgroup.kill").exists():
                try:
                    (d / "cgroup.kill").write_text("1")
                    continue
                except OSError:
                    pass
            for _ in range(40):
                try:
                    pids = [int(p) for p in (d / "cgroup.procs").read_text().split()]
                except OSError:
                    break
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                time.sleep(0.02)

    def close(self) -> None:
        """Kill what is left and remove the cgroups."""
        self.kill()
        for d in self.dirs.values():
            _rmdir(d)


def _tasks(pid: int) -> int:
    """The tasks (threads) of process ``pid``: what ``RLIMIT_NPROC`` and a pids cgroup count."""
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def _owner(pid: int) -> int | None:
    """The real uid of process ``pid`` (the one ``RLIMIT_NPROC`` counts it for)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _int(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _field(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == key:
                return int(parts[1])
    except (OSError, ValueError):
        pass
    return 0


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent thread exits (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def enter(procs_files: list[str], rlimits: dict[str, int]) -> None:
    """In the sandbox's first process, before ``exec``: join its cgroups, set its rlimits.

    Only async-signal-safe-ish calls (``os.open``/``os.write``, ``setrlimit``): it runs between
    ``fork`` and ``exec`` in a process that may have threads.
    """
    pid = str(os.getpid()).encode()
    for path in procs_files:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, pid)
        finally:
            os.close(fd)
    for name, value in rlimits.items():
        hard = value + 5 if name == "RLIMIT_CPU" else value      # SIGXCPU first, SIGKILL 5 s later
        resource.setrlimit(getattr(resource, name), (value, hard))
