"""Hidden tests in the grader's own process: the notebook's names as plain data, the student's
functions called in the kernel, only plain data coming back.

A lab's hidden tests (``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS``) never reach the
student's kernel under the grader: :func:`grader.notebooks.graded_notebook` cuts them out, and
the worker runs them here, in a process no student code runs in, right after the visible part
of their cell. Each name a block reads from the notebook is fetched once (:class:`HiddenTests`):

* plain data (numbers, strings, booleans, tuples, lists, dicts, tensors, numpy arrays, devices,
  dtypes) arrives as a copy, converted in the kernel from what the object stores (a subclass's
  ``__float__`` or ``__eq__`` is never called) and read here by a strict decoder; a dict or list
  arrives read-only, since changing the copy would not change the kernel's;
* a module, or a function of perflab, torch or numpy, is this process's own (the grader's
  genuine check functions, whatever the kernel's were replaced with);
* anything else (the student's functions and classes, the lab's objects) stays in the kernel as a
  :class:`RemoteRef`: calling it calls it in the kernel with plain arguments (or other
  references) and returns plain data. :func:`perflab.labs.exercises.in_kernel` sends a whole
  computation there (a perflab function with the notebook's objects as arguments).

Requests travel as ``execute_request`` user expressions (``silent``, never stored in the
history, ``In`` or ``_ih``); the code evaluated in the kernel (:func:`serve`) is self-contained,
defined afresh for every request. The expected values of the hidden tests, and their code,
never exist in the kernel.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import importlib
import inspect
import io
import json
import math
import textwrap
from typing import Any, Callable

import numpy as np
import torch

import perflab.labs.exercises as exercises
from grader.notebooks import free_names

#: modules (by top-level name) this process imports for itself when a name in the notebook is one
LIBRARIES = ("perflab", "torch", "numpy", "math", "statistics", "time", "copy", "json", "functools",
             "itertools", "collections", "operator", "random", "dataclasses", "pathlib", "os", "re")
MAX_REPLY_BYTES = 64 * 2**20           # one reply from the kernel
MAX_DEPTH = 12
_DTYPES = {"float16": (torch.float16, np.float16), "bfloat16": (torch.bfloat16, None),
           "float32": (torch.float32, np.float32), "float64": (torch.float64, np.float64),
           "int8": (torch.int8, np.int8), "int16": (torch.int16, np.int16),
           "int32": (torch.int32, np.int32), "int64": (torch.int64, np.int64),
           "uint8": (torch.uint8, np.uint8), "bool": (torch.bool, np.bool_)}


def serve(request: str) -> str:
    """Answer one request of the grader (runs *in the kernel*; self-contained).

    ``request`` is JSON: ``{"op": "names", "names": [...]}`` (each name of the notebook, encoded)
    or ``{"op": "call", "target": <encoded callable>, "args": [...], "kwargs": {...}}``. Values
    are encoded as JSON with tags: ``{"t": [...]}`` a tuple, ``{"d": [[k, v], ...]}`` a dict,
    ``{"f": "nan"}`` a non-finite float, ``{"tensor": [dtype, shape, base64]}``,
    ``{"ndarray": [dtype, shape, base64]}``, ``{"device": "cuda:0"}``, ``{"dtype": "float32"}``,
    ``{"module": name}``, ``{"lib": [module, qualname]}`` (a library function) and
    ``{"ref": [name, attr, ...]}`` (an object that stays in the kernel). Returns JSON:
    ``{"ok": value}`` or ``{"raised": [type name, message]}``.
    """
    import base64
    import importlib
    import json
    import math
    import sys

    import numpy as np
    import torch
    from IPython import get_ipython
    from torch.utils._python_dispatch import _disable_current_modes

    ns = get_ipython().user_ns
    libraries = ("perflab", "torch", "numpy", "math", "statistics", "time", "copy", "json",
                 "functools", "itertools", "collections", "operator", "random", "dataclasses",
                 "pathlib", "os", "re")
    dtypes = {"float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
              "uint8", "bool"}
    scalars = frozenset(t for t in set(np.sctypeDict.values())
                        if isinstance(t, type) and issubclass(t, (np.bool_, np.integer, np.floating)))
    budget = [64 * 2**20]

    class Unplain(Exception):
        pass

    def tensor_bytes(t):
        with torch._C.DisableTorchFunction(), _disable_current_modes():
            c = torch.Tensor.contiguous(torch.Tensor.to(torch.Tensor.detach(t), "cpu"))
            name = str(c.dtype).replace("torch.", "")
            if name not in dtypes:
                raise Unplain(f"a tensor of {name}")
            raw = torch.Tensor.numpy(torch.Tensor.view(torch.Tensor.reshape(c, (-1,)), torch.uint8)).tobytes()
        budget[0] -= len(raw)
        if budget[0] < 0:
            raise Unplain("more than 64 MiB")
        return [name, list(c.shape), base64.b64encode(raw).decode()]

    def enc(v, depth=0, name=None):
        t = type(v)
        if v is None or t is bool or t is int or t is str:
            return v
        if t is float:
            return v if math.isfinite(v) else {"f": repr(v)}
        if depth > 12:
            raise Unplain("nested too deeply")
        try:
            if issubclass(t, int):
                return int.__int__(v)
            if issubclass(t, float):
                return enc(float.__float__(v), depth + 1)
            if issubclass(t, str):
                return str.__str__(v)
            if t in scalars:
                return enc(v.item(), depth + 1)
            if t in (torch.Tensor, torch.nn.Parameter):
                return {"tensor": tensor_bytes(v)}
            if t is np.ndarray:
                if v.dtype.name not in dtypes:
                    raise Unplain(f"an array of {v.dtype.name}")
                raw = np.ascontiguousarray(v).tobytes()
                budget[0] -= len(raw)
                if budget[0] < 0:
                    raise Unplain("more than 64 MiB")
                return {"ndarray": [v.dtype.name, list(v.shape), base64.b64encode(raw).decode()]}
            if t is torch.device:
                return {"device": str(v)}
            if t is torch.dtype:
                return {"dtype": str(v).replace("torch.", "")}
            if issubclass(t, tuple):
                return {"t": [enc(x, depth + 1) for x in tuple.__iter__(v)]}
            if issubclass(t, list):
                return [enc(x, depth + 1) for x in list.__iter__(v)]
            if issubclass(t, dict):
                return {"d": [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in dict.items(v)]}
        except Unplain:
            raise
        except Exception as err:
            raise Unplain(f"{t.__name__} ({type(err).__name__})") from None
        raise Unplain(t.__name__)

    def describe(name):
        v = ns[name]
        if type(v).__name__ == "module" and isinstance(getattr(v, "__name__", None), str):
            return {"module": v.__name__}
        mod, qual = getattr(v, "__module__", None), getattr(v, "__qualname__", None)
        if callable(v) and isinstance(mod, str) and isinstance(qual, str) and "<" not in qual \
                and mod.split(".")[0] in libraries:
            return {"lib": [mod, qual]}
        try:
            return enc(v)
        except Unplain:
            return {"ref": [name]}

    def dec(v, depth=0):
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if depth > 12:
            raise ValueError("nested too deeply")
        if isinstance(v, list):
            return [dec(x, depth + 1) for x in v]
        (tag, x), = v.items()
        if tag == "t":
            return tuple(dec(y, depth + 1) for y in x)
        if tag == "d":
            return {dec(k, depth + 1): dec(y, depth + 1) for k, y in x}
        if tag == "f":
            return float(x)
        if tag in ("tensor", "ndarray"):
            name, shape, data = x
            raw = bytearray(base64.b64decode(data))
            if tag == "ndarray":
                return np.frombuffer(raw, dtype=name).reshape(shape).copy()
            flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
            return flat.view(getattr(torch, name)).reshape(shape).clone()
        if tag == "device":
            return torch.device(x)
        if tag == "dtype":
            return getattr(torch, x)
        if tag == "ref":
            obj = ns[x[0]]
            for attr in x[1:]:
                obj = getattr(obj, attr)
            return obj
        if tag == "lib":
            mod, qual = x
            if mod.split(".")[0] not in libraries:
                raise ValueError(f"not a library: {mod}")
            obj = importlib.import_module(mod)
            for attr in qual.split("."):
                obj = getattr(obj, attr)
            return obj
        raise ValueError(f"unknown tag {tag!r}")

    try:
        req = json.loads(request)
        if req["op"] == "names":
            return json.dumps({"ok": {n: describe(n) if n in ns else {"missing": True} for n in req["names"]}})
        if req["op"] == "call":
            fn = dec(req["target"])
            out = fn(*[dec(a) for a in req["args"]], **{k: dec(a) for k, a in req["kwargs"].items()})
            return json.dumps({"ok": enc(out)})
        return json.dumps({"raised": ["ValueError", f"unknown op {req.get('op')!r}"]})
    except Unplain as err:
        return json.dumps({"raised": ["NotPlain", f"the result is not plain data: {err}"]})
    except BaseException as err:  # the student's code raised: report it, keep the kernel alive
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        msg = str(err)
        return json.dumps({"raised": [type(err).__name__, msg[:2000]]}, default=str)
    finally:
        sys.stdout.flush()


_SOURCE = textwrap.dedent(inspect.getsource(serve))


def request_expression(request: dict) -> str:
    """A Python expression that defines :func:`serve` in a fresh namespace and answers ``request``."""
    return (f"(lambda __ns: (exec({_SOURCE!r}, __ns), __ns['serve']({json.dumps(request)!r}))[1])({{}})")


class RemoteError(Exception):
    """A request to the kernel failed: it raised, did not answer, or answered with something that
    is not plain data. The message says which."""


class ReadOnlyDict(dict):
    """A dict that came from the kernel: changing this copy would not change the kernel's."""

    def _refuse(self, *args, **kwargs):
        raise TypeError("the notebook's data is read-only in the grader's process (a hidden test "
                        "runs outside the kernel: change it with perflab.labs.exercises.in_kernel)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse


class ReadOnlyList(list):
    """A list that came from the kernel (see :class:`ReadOnlyDict`)."""

    _refuse = ReadOnlyDict._refuse
    __setitem__ = __delitem__ = append = extend = insert = pop = remove = clear = sort = reverse = \
        __iadd__ = __imul__ = _refuse


def decode(v: Any, depth: int = 0) -> Any:
    """A value the kernel sent (tagged JSON, see :func:`serve`), read strictly.

    Raises:
        RemoteError: anything but the tags :func:`serve` writes, too deep a nesting, a tensor
            whose bytes do not match its dtype and shape, a reference (``ref``/``lib``/
            ``module``: those :meth:`HiddenTests.fetch` resolves itself).
    """
    if v is None or type(v) in (bool, int, str):
        return v
    if type(v) is float:
        return v
    if depth > MAX_DEPTH:
        raise RemoteError("the kernel's answer is nested too deeply")
    if type(v) is list:
        return ReadOnlyList(decode(x, depth + 1) for x in v)
    if type(v) is not dict or len(v) != 1:
        raise RemoteError(f"the kernel's answer is not plain data: {str(v)[:80]}")
    (tag, x), = v.items()
    try:
        if tag == "t":
            return tuple(decode(y, depth + 1) for y in x)
        if tag == "d":
            return ReadOnlyDict((decode(k, depth + 1), decode(y, depth + 1)) for k, y in x)
        if tag == "f":
            if x not in ("nan", "inf", "-inf"):
                raise RemoteError(f"not a float: {x!r:.40}")
            return float(x)
        if tag in ("tensor", "ndarray"):
            name, shape, data = x
            torch_dtype, np_dtype = _DTYPES[name]
            shape = tuple(int(s) for s in shape)
            if any(s < 0 for s in shape):
                raise RemoteError("a negative size")
            raw = bytearray(base64.b64decode(data, validate=True))
            count = math.prod(shape)
            if tag == "ndarray":
                if np_dtype is None or len(raw) != count * np.dtype(np_dtype).itemsize:
                    raise RemoteError("an array whose bytes do not match its shape")
                return np.frombuffer(raw, dtype=np_dtype).reshape(shape).copy()
            if len(raw) != count * torch.empty((), dtype=torch_dtype).element_size():
                raise RemoteError("a tensor whose bytes do not match its shape")
            flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
            return flat.view(torch_dtype).reshape(shape).clone()
        if tag == "device":
            return torch.device(str(x))
        if tag == "dtype":
            return _DTYPES[str(x)][0]
    except RemoteError:
        raise
    except (KeyError, ValueError, TypeError, RuntimeError, OverflowError) as err:
        raise RemoteError(f"the kernel's answer is malformed ({type(err).__name__})") from None
    raise RemoteError(f"the kernel's answer is not plain data (tag {tag!r:.20})")


class RemoteRef:
    """An object that stays in the kernel, named by its path from the notebook's namespace."""

    __slots__ = ("_tests", "_path")

    def __init__(self, tests: "HiddenTests", path: list[str]):
        object.__setattr__(self, "_tests", tests)
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name: str) -> "RemoteRef":
        if name.startswith("__"):
            raise AttributeError(name)
        return RemoteRef(self._tests, self._path + [name])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._tests.call({"ref": self._path}, args, kwargs)

    def __repr__(self) -> str:
        return f"<{'.'.join(self._path)} in the student's kernel>"


class HiddenTests:
    """Runs a cell's hidden tests in this process against one kernel.

    ``ask(expression, timeout) -> str | None`` evaluates a user expression in the kernel (as
    :class:`grader.probe.Watch` does) and returns its value; ``deadline() -> float`` gives the
    seconds left for this notebook.
    """

    def __init__(self, ask: Callable[[str, float], Any], deadline: Callable[[], float]):
        self.ask, self.deadline = ask, deadline
        self._origin: dict[int, list[str]] = {}      # id of a fetched value -> its name in the kernel
        self._keep: list[Any] = []                   # the fetched values (their ids stay unique)

    def _request(self, request: dict) -> Any:
        left = self.deadline()
        if left <= 0:
            raise RemoteError("no time left for the hidden tests")
        text = self.ask(request_expression(request), left)
        if not isinstance(text, str):
            raise RemoteError("the kernel did not answer the grader (it is busy, or it died)")
        if len(text) > MAX_REPLY_BYTES:
            raise RemoteError("the kernel's answer is too large")
        try:
            reply = json.loads(text, parse_constant=_reject)
        except (ValueError, RecursionError) as err:
            raise RemoteError(f"the kernel's answer is not JSON ({type(err).__name__})") from None
        if not isinstance(reply, dict):
            raise RemoteError("the kernel's answer is malformed")
        if "raised" in reply:
            kind, msg = (list(reply["raised"]) + ["", ""])[:2]
            raise RemoteError(f"{str(kind)[:60]}: {str(msg)[:300]}")
        if "ok" not in reply:
            raise RemoteError("the kernel's answer is malformed")
        return reply["ok"]

    def fetch(self, names: set[str]) -> dict[str, Any]:
        """The notebook's ``names`` for this process (see the module docstring); names the
        notebook lacks are left out."""
        if not names:
            return {}
        got = self._request({"op": "names", "names": sorted(names)})
        if not isinstance(got, dict):
            raise RemoteError("the kernel's answer is malformed")
        out: dict[str, Any] = {}
        for name in sorted(names):
            if name not in got:
                continue
            v = got[name]
            if isinstance(v, dict) and len(v) == 1:
                (tag, x), = v.items()
                if tag == "missing":
                    continue
                if tag in ("module", "lib", "ref"):
                    out[name] = self._resolve(tag, x, name)
                    continue
            value = decode(v)
            if isinstance(value, (ReadOnlyDict, ReadOnlyList, torch.Tensor, np.ndarray)):
                self._origin[id(value)] = [name]      # sent back as the kernel's own object
                self._keep.append(value)
            out[name] = value
        return out

    def _resolve(self, tag: str, x: Any, name: str) -> Any:
        if tag == "ref":
            return RemoteRef(self, [name])
        if tag == "module":
            if isinstance(x, str) and x.split(".")[0] in LIBRARIES:
                return importlib.import_module(x)
            return RemoteRef(self, [name])
        mod, qual = (list(x) + ["", ""])[:2] if isinstance(x, list) else ("", "")
        if isinstance(mod, str) and isinstance(qual, str) and mod.split(".")[0] in LIBRARIES:
            try:
                obj: Any = importlib.import_module(mod)
                for attr in qual.split("."):
                    obj = getattr(obj, attr)
                return obj
            except (ImportError, AttributeError):
                pass
        return RemoteRef(self, [name])

    def encode(self, v: Any, depth: int = 0) -> Any:
        """A value of this process for the kernel: plain data, tensors, a :class:`RemoteRef` or a
        value fetched from the kernel (sent back as a reference to the kernel's own object), a
        library function."""
        if id(v) in self._origin:
            return {"ref": self._origin[id(v)]}
        if isinstance(v, RemoteRef):
            return {"ref": object.__getattribute__(v, "_path")}
        t = type(v)
        if v is None or t in (bool, int, str):
            return v
        if t is float:
            return v if math.isfinite(v) else {"f": repr(v)}
        if depth > MAX_DEPTH:
            raise RemoteError("an argument nested too deeply")
        if isinstance(v, torch.Tensor):
            c = v.detach().to("cpu").contiguous()
            name = str(c.dtype).replace("torch.", "")
            raw = c.reshape(-1).view(torch.uint8).numpy().tobytes()
            return {"tensor": [name, list(c.shape), base64.b64encode(raw).decode()]}
        if isinstance(v, np.ndarray):
            return {"ndarray": [v.dtype.name, list(v.shape), base64.b64encode(np.ascontiguousarray(v).tobytes()).decode()]}
        if isinstance(v, np.generic):
            return self.encode(v.item(), depth + 1)
        if t is torch.device:
            return {"device": str(v)}
        if t is torch.dtype:
            return {"dtype": str(v).replace("torch.", "")}
        if isinstance(v, tuple):
            return {"t": [self.encode(x, depth + 1) for x in v]}
        if isinstance(v, list):
            return [self.encode(x, depth + 1) for x in v]
        if isinstance(v, dict):
            return {"d": [[self.encode(k, depth + 1), self.encode(x, depth + 1)] for k, x in v.items()]}
        mod, qual = getattr(v, "__module__", None), getattr(v, "__qualname__", None)
        if callable(v) and isinstance(mod, str) and isinstance(qual, str) and "<" not in qual \
                and mod.split(".")[0] in LIBRARIES:
            return {"lib": [mod, qual]}
        raise RemoteError(f"cannot send a {t.__name__} to the kernel")

    def call(self, target: dict, args: tuple, kwargs: dict) -> Any:
        """Call ``target`` (an encoded reference or library function) in the kernel; its result
        as plain data."""
        got = self._request({"op": "call", "target": target, "args": [self.encode(a) for a in args],
                             "kwargs": {str(k): self.encode(a) for k, a in kwargs.items()}})
        return decode(got)

    def in_kernel(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """:func:`perflab.labs.exercises.in_kernel` while hidden tests run here."""
        return self.call(self.encode(fn), args, kwargs)

    def run(self, block: str) -> tuple[str, str]:
        """Run one hidden-test block; returns ``(error, printed text)``: ``error`` is ``""``
        when it passed, else one line (an :class:`~perflab.labs.exercises.ExerciseFailed`'s
        message, or what else went wrong)."""
        out = io.StringIO()
        try:
            code = compile(block, "<hidden tests>", "exec")
        except SyntaxError as err:
            return f"SyntaxError in the hidden tests: {err.msg}", ""
        names = free_names(block) - set(vars(builtins))
        previous = exercises._IN_KERNEL
        error = ""
        try:
            scope: dict[str, Any] = {"__name__": "__hidden_tests__", "__builtins__": builtins}
            with contextlib.redirect_stdout(out):
                scope.update(self.fetch(names))
                exercises._IN_KERNEL = self.in_kernel
                exec(code, scope)
        except exercises.ExerciseFailed as err:
            error = f"{type(err).__name__}: {err}"
        except RemoteError as err:
            error = f"the hidden tests could not run: {err}"
        except Exception as err:  # a student's object that misbehaves here, or a broken test
            error = f"{type(err).__name__} in the hidden tests: {err}"
        finally:
            exercises._IN_KERNEL = previous
        return _first_line(error), out.getvalue()


def _reject(constant: str) -> Any:
    raise ValueError(f"{constant} is not plain JSON")


def _first_line(text: str, limit: int = 300) -> str:
    lines = (text or "").strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"
