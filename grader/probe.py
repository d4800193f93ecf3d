"""Tampering checks for the grader: what a submission changed inside its own kernel.

A lab's checks run in the student's kernel (they time the student's code, hook its autograd,
call its functions), so code the student wrote runs in the same process as the checks and can
replace them. This module cannot prevent that; it *detects* it and names what changed:

* every module of perflab (all of them imported before any student code runs, so none is
  "new" later), ``builtins`` (``__import__`` included), ``math``, ``statistics``, ``time``,
  ``json``, ``copy``, ``gc``, ``tracemalloc``, ``numpy``, ``torch`` (top level, ``torch.Tensor``),
  ``torch.autograd`` and its ``function``, ``graph`` and ``gradcheck`` modules,
  ``torch.nn.functional``, ``torch.overrides``, ``torch.utils._python_dispatch``, and the
  IPython/ipykernel classes that run a cell and report its errors: a function or method
  replaced, added or removed, or its code, defaults or closures swapped;
* the kernel's error handling and hooks: ``sys.excepthook``, trace and profile hooks,
  ``sys.meta_path``, ``gc.callbacks``, active torch function and dispatch modes, the shell's
  custom exception handler (only ``perflab.labs.exercises.short_errors`` may set one), input
  and AST transformers, event callbacks, methods overridden on the shell, kernel or session;
* the notebook's names that a later check reads (:func:`grader.notebooks.watched_names`):
  rebound, deleted, defined anew (a ``tuple`` of the student's own shadowing the builtin) or,
  for containers, tensors and arrays, changed in place.

:func:`fingerprint` runs *in the kernel*: the worker sends its source and evaluates it as an
``execute_request`` user expression after every cell (user expressions bypass input and AST
transformers); it returns JSON with one digest per group of watched objects, and the objects'
identities for the groups asked for. :class:`Watch` runs in the worker, outside the sandbox:
it keeps the expected state from before any student code ran and compares.

A determined attacker who restores every object before each probe, or who edits memory with
``ctypes``, is not caught here; the grader's re-check of each check's plain inputs, its hidden
tests in its own process and its ledger of raised failures are the other lines.
"""

from __future__ import annotations

import inspect
import json
import textwrap
import uuid
from typing import Any, Callable


def fingerprint(nonce: str, only: list[str] | None, imports: list[str], ns_names: list[str]) -> str:
    """The watched state of this kernel as JSON (runs in the kernel; self-contained).

    ``imports``: modules to import first (so that a later student cell cannot patch a module
    before it is watched; ``"perflab.**"`` stands for every module of perflab); each is watched.
    ``ns_names``: the notebook's names to watch. With ``only`` None, returns every group's
    digest; otherwise the object identities of the groups in ``only`` as well. Returns
    ``{"nonce", "digests", "detail", "errors"}`` as a JSON string.
    """
    import builtins
    import gc
    import hashlib
    import importlib
    import inspect
    import json
    import os
    import pkgutil
    import sys
    import types

    errors = []
    wanted = []
    for name in imports:
        if name.endswith(".**"):
            root = name[:-3]
            try:
                pkg = importlib.import_module(root)
                wanted += [root] + sorted(m.name for m in pkgutil.walk_packages(pkg.__path__, root + "."))
            except Exception as err:
                errors.append(f"{root}: {type(err).__name__}")
        else:
            wanted.append(name)
    for name in wanted:
        try:
            importlib.import_module(name)
        except Exception as err:  # a module this machine lacks (an optional dependency): not watched
            errors.append(f"{name}: {type(err).__name__}")

    torch = sys.modules.get("torch")
    torch_private = os.path.join(os.path.dirname(getattr(torch, "__file__", None) or "/nonexistent"), "_")

    def ident(v):
        # torch wraps some of its own functions when torch._dynamo loads (torch.manual_seed in
        # torch/_compile.py): such a wrapper stands for what it wraps
        code, inner = getattr(v, "__code__", None), getattr(v, "__wrapped__", None)
        if inner is not None and code is not None and code.co_filename.startswith(torch_private):
            return ident(inner)
        out = [id(v)]
        func = getattr(v, "__func__", None)
        if isinstance(v, (types.MethodType, classmethod, staticmethod)) and func is not None:
            v = func
            out.append(id(v))
        code = getattr(v, "__code__", None) if isinstance(v, types.FunctionType) else None
        if code is not None:
            out += [id(code), id(v.__defaults__), id(v.__kwdefaults__)]
            for cell in v.__closure__ or ():
                try:
                    out.append(id(cell.cell_contents))
                except ValueError:   # an empty cell
                    out.append(0)
        return out

    def callables(ns, prefix, skip=()):
        out = {}
        for k, v in list(ns.items()):
            if k in skip or isinstance(v, types.ModuleType):
                continue
            if k.startswith("__") and not k.endswith("__"):
                continue     # torch.compile's artifacts in a compiled function's module (__compiled_fn_7_...)
            if callable(v) or isinstance(v, (classmethod, staticmethod, property)):
                out[prefix + k] = ident(v)
        return out

    heap = 1 << 9   # Py_TPFLAGS_HEAPTYPE: a class defined in Python, whose methods can be replaced
    watched = sorted(set(wanted) | {n for n in list(sys.modules) if n == "perflab" or n.startswith("perflab.")}
                     | {"IPython.core.interactiveshell", "ipykernel.ipkernel", "ipykernel.kernelbase",
                        "ipykernel.zmqshell", "jupyter_client.session"})
    try:
        from IPython import get_ipython
        ip = get_ipython()
    except Exception as err:
        ip = None
        errors.append(f"IPython: {type(err).__name__}")

    def module_group(name):
        if name == "builtins":
            bskip = {"exit", "quit", "get_ipython", "display", "help", "copyright", "credits", "license"}
            under = {k for k in vars(builtins) if k.startswith("_") and k not in ("__import__", "__build_class__")}
            return callables(vars(builtins), "", under | bskip)
        mod = sys.modules.get(name)
        entries = callables(vars(mod), "") if mod is not None else {}
        for k, v in list(vars(mod).items()) if mod is not None else ():
            if isinstance(v, type) and v.__flags__ & heap and getattr(v, "__module__", None) == name:
                entries.update(callables(vars(v), k + "."))
        return entries

    def sys_group():
        out = {"modules": {n: id(sys.modules.get(n)) for n in watched},
               "excepthook": ident(sys.excepthook), "displayhook": ident(sys.displayhook),
               "breakpointhook": ident(sys.breakpointhook), "trace": ident(sys.gettrace()),
               "profile": ident(sys.getprofile()), "meta_path": [id(f) for f in sys.meta_path],
               "path_hooks": [id(f) for f in sys.path_hooks], "gc.callbacks": [id(f) for f in gc.callbacks]}
        threading = sys.modules.get("threading")
        out["thread_trace"] = ident(getattr(threading, "_trace_hook", None))
        out["thread_profile"] = ident(getattr(threading, "_profile_hook", None))
        c = getattr(torch, "_C", None)
        for label, fn in (("torch function modes", "_len_torch_function_stack"),
                          ("torch dispatch modes", "_len_torch_dispatch_stack")):
            try:
                out[label] = getattr(c, fn)()
            except Exception:
                out[label] = None
        return out

    def shell_group():
        shell = {}
        for obj, label, names in (
                (ip, "shell.", ("run_cell", "run_cell_async", "_run_cell", "run_code", "run_ast_nodes",
                                "transform_cell", "transform_ast", "showtraceback", "_showtraceback",
                                "showsyntaxerror", "showindentationerror", "user_expressions",
                                "should_run_async", "get_exception_only", "set_custom_exc", "ex", "ev",
                                "run_line_magic", "run_cell_magic", "safe_execfile")),
                (getattr(ip, "kernel", None), "kernel.", ("do_execute", "execute_request", "dispatch_shell",
                                                          "send_response", "_publish_status",
                                                          "_publish_execute_input", "process_one",
                                                          "dispatch_queue")),
                (getattr(getattr(ip, "kernel", None), "session", None), "session.",
                 ("send", "serialize", "sign", "msg", "msg_header", "feed_identities", "deserialize"))):
            if obj is None:
                continue
            for n in names:
                try:
                    shell[label + n] = ident(inspect.getattr_static(obj, n))
                except AttributeError:
                    shell[label + n] = None
        handlers = getattr(getattr(ip, "kernel", None), "shell_handlers", None) or {}
        shell["kernel.shell_handlers"] = {k: ident(v) for k, v in sorted(handlers.items())}
        shell["custom_exceptions"] = sorted(f"{c.__module__}.{c.__qualname__}"
                                            for c in (ip.custom_exceptions or ()))
        tb = inspect.getattr_static(ip, "CustomTB")
        if isinstance(tb, types.MethodType):     # set by set_custom_exc: whose handler is inside?
            inner = [c.cell_contents for c in (tb.__func__.__closure__ or ())
                     if callable(getattr(c, "cell_contents", None))]
            owners = {getattr(f, "__module__", "") or "" for f in inner}
            shell["CustomTB"] = ("perflab" if owners and all(o.startswith(("perflab", "IPython")) for o in owners)
                                 else ident(tb))
        else:
            shell["CustomTB"] = "default" if isinstance(tb, types.FunctionType) else ident(tb)
        manager = getattr(ip, "input_transformer_manager", None)
        for n in ("input_transformers_cleanup", "input_transformers_post", "ast_transformers"):
            shell[n] = [id(t) for t in getattr(ip, n, []) or []]
        for n in ("cleanup_transforms", "line_transforms", "token_transformers"):
            shell["manager." + n] = [id(t) for t in getattr(manager, n, []) or []]
        allowed = ("matplotlib", "matplotlib_inline", "IPython", "ipykernel")
        shell["events"] = {ev: [id(cb) for cb in cbs if not (getattr(cb, "__module__", "") or "").startswith(allowed)]
                           for ev, cbs in sorted(getattr(ip.events, "callbacks", {}).items())}
        shell["displayhook"] = id(ip.displayhook)
        shell["display_pub"] = id(ip.display_pub)
        return shell

    def content(v):
        # what can change in place without a new identity: a container's items, a tensor's data
        t = type(v)
        if torch is not None and t in (torch.Tensor, torch.nn.Parameter):
            try:
                return ["tensor", v._version, v.data_ptr(), list(v.shape), str(v.dtype)]
            except Exception:
                return ["tensor"]
        if t in (list, tuple, set, frozenset, dict):
            items = list(v.items()) if t is dict else list(v)
            flat = []
            for item in items[:10000]:
                for x in (item if t is dict else (item,)):
                    flat.append(x if x is None or type(x) in (bool, int, float, str) else ["id", id(x)])
            return [t.__name__, len(items), hashlib.sha1(json.dumps(flat, default=str).encode()).hexdigest()]
        if type(v).__name__ == "ndarray" and type(v).__module__ == "numpy":
            try:
                data = v.tobytes() if v.nbytes <= 2**20 else b""
                return ["ndarray", v.ctypes.data, list(v.shape), hashlib.sha1(data).hexdigest()]
            except Exception:
                return ["ndarray"]
        return None

    def ns_group():
        ns = {}      # each watched name: [identity, content], or absent
        for k in ns_names:
            if k in ip.user_ns:
                v = ip.user_ns[k]
                ns[k] = [id(v), content(v)]
        return ns

    builders = {"module:builtins": lambda: module_group("builtins"), "sys": sys_group}
    for name in watched:
        builders["module:" + name] = (lambda n: lambda: module_group(n))(name)
    if ip is not None:
        builders.update(shell=shell_group, ns=ns_group)
    groups = {g: build() for g, build in builders.items() if only is None or g in only}

    def digest(obj):
        return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()

    return json.dumps({"nonce": nonce, "digests": {g: digest(v) for g, v in groups.items()},
                       "detail": groups if only is not None else {}, "errors": errors}, default=str)


_SOURCE = textwrap.dedent(inspect.getsource(fingerprint))


def probe_expression(nonce: str, only: list[str] | None, imports: list[str], ns_names: list[str]) -> str:
    """A Python expression that defines :func:`fingerprint` in a fresh namespace and calls it."""
    return (f"(lambda __ns: (exec({_SOURCE!r}, __ns), "
            f"__ns['fingerprint']({nonce!r}, {only!r}, {imports!r}, {ns_names!r}))[1])({{}})")


#: what every kernel imports and watches before any student code runs (see the module docstring)
WATCHED_MODULES = ["perflab.**", "math", "statistics", "time", "json", "copy", "gc", "tracemalloc",
                   "numpy", "torch", "torch.autograd", "torch.autograd.function", "torch.autograd.graph",
                   "torch.autograd.gradcheck", "torch.nn.functional", "torch.overrides",
                   "torch.utils._python_dispatch", "torch.testing"]

# the shell entries a lab's own cells may change: perflab.labs.exercises.short_errors sets the handler
_INSTRUCTOR_MAY_SET = {"custom_exceptions", "CustomTB"}


def _changed(old: Any, new: Any, prefix: str) -> list[str]:
    """Keys of ``old`` whose value differs in ``new``, and keys only one of them has (nested one
    level)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            if k not in new:
                out.append(f"{prefix}{k} (removed)")
            elif k not in old:
                out.append(f"{prefix}{k} (new)")
            elif new[k] != old[k]:
                if isinstance(old[k], dict) and isinstance(new[k], dict):
                    out += _changed(old[k], new[k], f"{prefix}{k}.")
                else:
                    out.append(prefix + k)
        return out
    return [prefix.rstrip(".")] if old != new else []


class Watch:
    """The expected state of one kernel, compared after every cell (runs in the worker).

    ``ask(expression, timeout) -> str | None`` evaluates a user expression in the kernel and
    returns its value (a JSON string), or None when the kernel did not answer in ``timeout`` s.
    ``ns_names``: every notebook name some check reads (:func:`grader.notebooks.watched_names`).
    """

    def __init__(self, ask: Callable[[str, float], str | None], imports: list[str], ns_names: set[str] = frozenset()):
        self.ask = ask
        self.imports = list(dict.fromkeys(imports))
        self.ns_names = sorted(ns_names)
        self.digests: dict[str, str] = {}
        self.detail: dict[str, dict] = {}
        self.seen: set[str] = set()
        self.errors: list[str] = []

    def _probe(self, only: list[str] | None, timeout: float = 30) -> dict | None:
        nonce = uuid.uuid4().hex
        text = self.ask(probe_expression(nonce, only, self.imports, self.ns_names), timeout)
        try:
            got = json.loads(text) if isinstance(text, str) else None
        except (ValueError, RecursionError):
            return None
        if not isinstance(got, dict) or got.get("nonce") != nonce:
            return None
        return got

    def baseline(self) -> list[str]:
        """Record the state before any student code runs. Returns findings (empty when fine)."""
        got = self._probe(None, timeout=180)            # it imports torch and all of perflab first
        full = self._probe(list(got["digests"])) if got is not None else None
        if full is None:
            return ["the kernel did not answer the first integrity check"]
        self.digests, self.detail = dict(full["digests"]), dict(full["detail"])
        self.errors = [str(e) for e in got.get("errors", [])][:20]
        return []

    def after(self, origin: str, where: str, watched: set[str] = frozenset(),
              binds: set[str] = frozenset(), unset: set[str] = frozenset(),
              mutable: set[str] = frozenset()) -> list[str]:
        """Compare after a cell (``origin``: ``"student"`` or ``"instructor"``); returns new findings.

        Any change to a watched module, hook or mode is tampering, whoever's cell it followed
        (a lab cell calls the student's functions). Of the notebook's names, those in
        ``watched`` (read by a later check) count: after a student cell any change to them
        (rebound, deleted, defined anew, changed in place), except names in ``unset``: names a
        lab cell binds later but none has bound yet (a student's copy of a set-up cell runs
        before the set-up itself, which binds them again), and, for names the lab's own code
        changes in place (``mutable``: a ``state`` dict its function updates when the student's
        code calls it), anything but a new binding; after a lab cell, rebinding one the cell
        does not bind itself (``binds``; its own check code may change data in place). After a
        lab cell the state it leaves becomes the expected one.
        """
        got = self._probe(None)
        if got is None:
            return self._new([f"the kernel did not answer the integrity check after {where}"])
        changed = [g for g, d in got["digests"].items() if g in self.digests and self.digests[g] != d]
        new_groups = [g for g in got["digests"] if g not in self.digests]
        findings: list[str] = []
        if changed or new_groups:
            full = self._probe(changed + new_groups)
            if full is None:
                return self._new([f"the kernel did not answer the integrity check after {where}"])
            for g in changed:
                keys = _changed(self.detail.get(g, {}), full["detail"].get(g, {}), "")
                if g == "ns":
                    old_ns, new_ns = self.detail.get(g, {}), full["detail"].get(g, {})

                    def rebound(key):   # a new identity (or a name added or removed), not only new content
                        name = key.split(" ")[0]
                        return name not in old_ns or name not in new_ns or old_ns[name][0] != new_ns[name][0]

                    keys = [k for k in keys if k.split(" ")[0] in watched and (
                        k.split(" ")[0] not in unset and (k.split(" ")[0] not in mutable or rebound(k))
                        if origin == "student" else k.split(" ")[0] not in binds and rebound(k))]
                if g == "shell" and origin == "instructor":
                    keys = [k for k in keys if not (k in _INSTRUCTOR_MAY_SET and
                                                    full["detail"]["shell"].get("CustomTB") == "perflab")]
                if keys:
                    label = {"ns": "names of the notebook"}.get(g, g.split(":", 1)[-1])
                    shown = ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")
                    findings.append(f"{label} changed after {where} ({shown})")
            for g in changed + new_groups:
                self.detail[g] = full["detail"].get(g, {})
            self.digests.update(full["digests"])
        return self._new(findings)

    def _new(self, findings: list[str]) -> list[str]:
        out = [f for f in findings if f not in self.seen]
        self.seen.update(out)
        return out
