"""The rules docs/ARCHITECTURE.md states about perflab, each enforced here.

1. What ``scripts/architecture.py`` generates is current: the package tree and the module map of
   docs/ARCHITECTURE.md (every module, its docstring's first sentence, who uses it) and the
   packages' ``__init__`` docstrings, all from the code and the one list of subpackages
   (``SECTIONS``); the page holds no merge-conflict marker and no module table outside the map.
2. No import cycle between perflab modules, following ``from perflab.x import y``,
   ``import perflab.x`` and relative imports alike; ``core`` imports nothing else of perflab and
   nothing outside ``labs`` imports ``labs``. Book order is import order: ``record`` imports only
   ``core``, and a chapter's subpackage only ``core``, ``record`` and earlier chapters'
   subpackages (the order of ``scripts/architecture.py``'s ``SECTIONS``), but for the listed
   :data:`LAYERING_EXCEPTIONS`, a list that only shrinks.
3. Only ``core/nvml.py`` imports ``pynvml`` (in perflab, scripts/ and _ext/).
4. Only ``core/device.py`` opens ``/proc/cpuinfo`` (no call anywhere else takes that path).
5. Only ``core/timing.py`` reads a clock: no ``time.perf_counter``/``time.time``/
   ``time.monotonic``/``process_time``/``thread_time`` (or their ``_ns`` forms), no ``timeit``,
   no ``torch.cuda.Event``, no ``torch.utils.benchmark`` or ``triton.testing`` elsewhere in
   perflab; and no subtraction of two ``timing.timestamp()`` readings (a duration is a
   ``Stopwatch``'s). ``time.sleep`` is not a clock.
6. Imports sit at the top of a module (its top-level statements, ``if``/``try`` blocks
   included); an import inside a function is an optional dependency listed in
   :data:`OPTIONAL_IMPORTS`, with a comment on its line or the line above saying why.
7. A perflab module is imported under its own name, in the package, the pages, the tests and
   the scripts (``from perflab.gpt2 import model as gpt2`` keeps a vocabulary the package no
   longer has), but for the files listed in :data:`RENAMED_MODULES_WAITING`, which only shrinks.
8. No perflab module is longer than :data:`MAX_MODULE_LINES` lines: a module that grows past it
   holds more than one idea and is split along one (not squeezed by deleting blank lines).
"""

import ast
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "perflab"

_spec = importlib.util.spec_from_file_location("architecture", ROOT / "scripts" / "architecture.py")
architecture = importlib.util.module_from_spec(_spec)
sys.modules["architecture"] = architecture   # dataclasses look their module up there
_spec.loader.exec_module(architecture)

MODULES = architecture.modules(PKG)
SOURCES = sorted(PKG.rglob("*.py"))
ELSEWHERE = sorted((ROOT / "scripts").glob("*.py")) + sorted((ROOT / "_ext").glob("*.py"))

#: the only imports allowed inside functions: optional dependencies, by module file
OPTIONAL_IMPORTS = {
    "core/nvml.py": {"pynvml"},                          # the `gpu` extra
    "core/timing.py": {"triton.testing"},                # CUDA builds of torch only
    "kernels/crossentropy.py": {"triton", "triton.language"},
    "kernels/custom_ops.py": {"triton", "triton.language", "triton.runtime"},
    "kernels/axpby.py": {"triton", "triton.language"},   # generated from chapter 9's page
    "gpt2/heads.py": {"triton", "triton.language"},      # generated from chapter 10's page
    "labs/exercises.py": {"IPython", "jupytext"},        # a live kernel; the `book` extra
    "loading/datasets.py": {"skimage.data"},             # scikit-image, the `vision` extra
    "loading/transforms.py": {"torchvision.io"},         # the `vision` extra (GPU code paths)
    "machine/explorer.py": {"ipywidgets"},               # the `book` extra
    "record/provenance.py": {"myst_nb"},                 # the `book` extra
    "record/plotting.py": {"IPython", "IPython.display",  # a live kernel (inline figures)
                           "matplotlib_inline.backend_inline"},
    "record/tables.py": {"IPython.display"},             # a live kernel
}

CLOCKS = {"perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic", "monotonic_ns",
          "process_time", "process_time_ns", "thread_time", "thread_time_ns"}


def _rel(path: Path) -> str:
    return path.relative_to(PKG).as_posix() if path.is_relative_to(PKG) else path.relative_to(ROOT).as_posix()


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _dotted(node: ast.AST) -> str:
    """``a.b.c`` for an attribute chain on a name, else ''."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id] + parts[::-1]) if isinstance(node, ast.Name) else ""


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and not node.level:
        return [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return []


# 1. the map cannot drift ------------------------------------------------------------------------

def test_the_module_map_is_generated_from_the_code():
    page = architecture.PAGE.read_text(encoding="utf-8")
    assert architecture.BEGIN in page and architecture.END in page, "the map's marker lines are missing"
    stale = [path.relative_to(ROOT).as_posix() for path, text in architecture.wanted().items()
             if not path.exists() or path.read_text(encoding="utf-8") != text]
    assert not stale, (f"out of date: {stale}: run make generate (python scripts/architecture.py --check "
                       "shows the diff)")


def test_the_page_holds_no_conflict_marker_and_no_map_outside_its_markers():
    page = architecture.PAGE.read_text(encoding="utf-8")
    assert architecture.problems(page) == []


@pytest.mark.parametrize("bad, what", [
    ("<<<<<<< HEAD\n", "merge conflict"),
    ("=======\n", "merge conflict"),
    (">>>>>>> main\n", "merge conflict"),
    ("| module | the idea it owns | used by |\n|---|---|---|\n", "outside the generated map"),
])
def test_the_page_checks_catch_a_conflict_block_and_a_hand_written_map(bad, what):
    page = architecture.PAGE.read_text(encoding="utf-8")
    head, rest = page.split(architecture.BEGIN, 1)
    found = architecture.problems(head + bad + architecture.BEGIN + rest)
    assert found and what in found[0]
    inside = head + architecture.BEGIN + "\n" + bad + rest      # the map's own table is fine
    assert [p for p in architecture.problems(inside) if "outside" in p] == []


def test_one_list_of_subpackages_makes_the_tree_the_inits_and_the_package_docstring():
    names = [sec.name for sec in architecture.SECTIONS]
    on_disk = sorted(p.parent.name for p in PKG.glob("*/__init__.py"))
    assert sorted(names) == on_disk, "SECTIONS and the subpackages on disk differ"
    tree = architecture.render_tree()
    doc = architecture.init_docstring()
    for sec in architecture.SECTIONS:
        assert f"  {sec.name}/" in tree and f"``{sec.name}``" in doc
        assert architecture.subpackage_init(sec).count(f"perflab.{sec.name}: ") == 1
    import perflab
    assert perflab.__doc__.strip() == doc.strip('"').strip()


def test_the_map_lists_every_module_with_its_users():
    page = architecture.PAGE.read_text(encoding="utf-8")
    missing = [m for m in MODULES if f"| `{m}` |" not in page]
    assert not missing, f"modules missing from the map: {missing}"
    assert MODULES["core.nvml"].idea, "a module without a docstring has no idea in the map"


def test_the_map_follows_imports_in_notebooks_modules_and_scripts(tmp_path):
    names = {"a.x", "a.y", "b.z"}
    code = ("import perflab\nfrom perflab.a import x as ex\nimport perflab.b.z as zed\n"
            "perflab.a.y.f()\nex.g()\nrun(['-m', 'perflab.b.z'])\n")
    assert architecture.referenced(ast.parse(code), names) == names
    assert architecture.referenced(ast.parse("import perflab\n"), names) == set()
    relative = "from .x import f\nfrom ..b import z\n"
    assert architecture.referenced(ast.parse(relative), names, module="a.y") == {"a.x", "b.z"}
    assert architecture.first_sentence("One idea (of ``a.b``). More.\n\nDetails.") == "One idea (of ``a.b``)."


# 2. no import cycle -------------------------------------------------------------------------------

def test_the_import_graph_has_no_cycle():
    graph = {m: MODULES[m].imports for m in MODULES}
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for n in sorted(graph[m]):
            assert state.get(n) != 1, "import cycle: " + " -> ".join(path + [n])
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(MODULES):
        if m not in state:
            visit(m, [m])


def test_core_stands_alone_and_only_labs_import_labs():
    bad = [f"{m} imports {n}" for m in MODULES for n in MODULES[m].imports
           if (m.startswith("core.") and not n.startswith("core."))
           or (n.startswith("labs.") and not m.startswith("labs."))]
    assert not bad, "layering broken: " + "; ".join(bad)


#: Imports against book order, allowed for now: ``(importer, imported)`` subpackages -> why, and
#: for a temporary one who removes it. The list only shrinks: an entry that no longer occurs fails
#: the test as well (remove it in the commit that removes the import). Goal: at most one
#: permanent exception.
LAYERING_EXCEPTIONS: dict[tuple[str, str], str] = {
    # empty since the collectives became machine.interconnect and GPT-2's torchrun tasks moved into
    # gpt2 (the distributed engineer, issue 38); record -> machine went with the ceilings' move
}


def upward_imports(modules: dict, sections: list) -> dict[tuple[str, str], list[str]]:
    """Imports against book order, by (importer, imported) subpackage: ``record`` importing
    anything but ``core``; a chapter's subpackage importing a later chapter's (or ``labs``).
    ``core`` and ``labs`` have their own rules (``test_core_stands_alone_and_only_labs_import_labs``)."""
    rank = {sec.name: i for i, sec in enumerate(sections)}
    kind = {sec.name: sec.kind for sec in sections}
    found: dict[tuple[str, str], list[str]] = {}
    for m, mod in modules.items():
        src = m.split(".")[0]
        for n in sorted(mod.imports):
            dst = n.split(".")[0]
            if src == dst or kind.get(src) in ("labs", None) or src == "core":
                continue
            if src == "record":
                ok = dst == "core"
            else:
                ok = kind.get(dst) == "infrastructure" or (kind.get(dst) == "chapter" and rank[dst] < rank[src])
            if not ok:
                found.setdefault((src, dst), []).append(f"{m} -> {n}")
    return found


def test_imports_follow_book_order():
    found = upward_imports(MODULES, architecture.SECTIONS)
    new = {k: v for k, v in found.items() if k not in LAYERING_EXCEPTIONS}
    assert not new, ("imports against book order (a chapter imports core, record and earlier "
                     "chapters only; record imports core only):\n"
                     + "\n".join(f"{a} -> {b}: {', '.join(v)}" for (a, b), v in new.items()))
    gone = sorted(set(LAYERING_EXCEPTIONS) - set(found))
    assert not gone, f"no longer imported, remove from LAYERING_EXCEPTIONS: {gone}"


def test_the_book_order_rule_catches_an_upward_import():
    Mod = type("Mod", (), {})

    def mods(**imports):
        out = {}
        for name, deps in imports.items():
            out[name.replace("__", ".")] = m = Mod()
            m.imports = set(deps)
        return out

    sections = architecture.SECTIONS
    fine = mods(machine__roofline={"core.timing", "record.plotting"}, speed__measure={"machine.waves"},
                record__tables={"core.validate"}, labs__lab10={"gpt2.train"})
    assert upward_imports(fine, sections) == {}
    bad = mods(machine__report={"distributed.collectives"}, record__ceilings={"machine.roofline"},
               internals__overhead={"labs.exercises"})
    assert set(upward_imports(bad, sections)) == {("machine", "distributed"), ("record", "machine"),
                                                  ("internals", "labs")}
    assert len(LAYERING_EXCEPTIONS) <= 1


def test_the_cycle_check_sees_absolute_imports():
    assert "core.nvml" in MODULES["core.device"].imports          # from perflab.core import nvml
    assert "core.timing" in MODULES["core.sampler"].imports       # from perflab.core.timing import ...


# 3. one NVML reader -------------------------------------------------------------------------------

def test_only_core_nvml_imports_pynvml():
    bad = [f"{_rel(p)}:{node.lineno}" for p in SOURCES + ELSEWHERE if _rel(p) != "core/nvml.py"
           for node in ast.walk(_tree(p)) if any(n.split(".")[0] == "pynvml" for n in _imported(node))]
    assert not bad, f"pynvml imported outside perflab/core/nvml.py: {bad}"


# 4. one /proc/cpuinfo reader ------------------------------------------------------------------------

def test_only_core_device_opens_proc_cpuinfo():
    bad = []
    for p in SOURCES + ELSEWHERE:
        if _rel(p) == "core/device.py":
            continue
        for node in ast.walk(_tree(p)):
            if isinstance(node, ast.Call) and any(isinstance(a, ast.Constant) and isinstance(a.value, str)
                                                  and "/proc/cpuinfo" in a.value for a in node.args):
                bad.append(f"{_rel(p)}:{node.lineno}")
    assert not bad, f"/proc/cpuinfo read outside perflab/core/device.py (use device.cpuinfo()): {bad}"


# 5. one place that reads a clock ----------------------------------------------------------------------

def clock_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for every clock read the rule forbids outside core/timing.py."""
    found = []
    stamps = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = _dotted(node)
            if (name.startswith("time.") and name[5:] in CLOCKS) or name in ("torch.cuda.Event",) \
                    or name.startswith(("torch.utils.benchmark", "timeit.", "triton.testing")):
                found.append((node.lineno, name))
        for mod in _imported(node):
            if mod in ("timeit", "torch.utils.benchmark", "triton.testing") or \
                    (mod.startswith("time.") and mod[5:] in CLOCKS) or mod == "torch.utils.benchmark":
                found.append((node.lineno, f"import {mod}"))
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and _dotted(node.value.func).endswith("timestamp"):
            stamps.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            for side in (node.left, node.right):
                if (isinstance(side, ast.Call) and _dotted(side.func).endswith("timestamp")) or \
                        (isinstance(side, ast.Name) and side.id in stamps):
                    found.append((node.lineno, "a difference of timestamps"))
    return found


def test_only_core_timing_reads_a_clock():
    bad = [f"{_rel(p)}:{line}: {what}" for p in SOURCES if _rel(p) != "core/timing.py"
           for line, what in clock_reads(_tree(p))]
    assert not bad, "clocks read outside perflab/core/timing.py (use Stopwatch, seconds_per_call, " \
                    "best_of, Deadline or timestamp there):\n" + "\n".join(bad)


@pytest.mark.parametrize("code", [
    "import time\nt0 = time.perf_counter()\n",
    "import time\nstart = time.monotonic()\n",
    "from time import perf_counter\n",
    "import timeit\n",
    "import torch\ne = torch.cuda.Event(enable_timing=True)\n",
    "from torch.utils import benchmark\n",
    "from perflab.core.timing import timestamp\nt = timestamp()\nx = timestamp() - t\n",
])
def test_the_clock_rule_catches_each_way_of_reading_a_clock(code):
    assert clock_reads(ast.parse(code)), code


def test_the_clock_rule_leaves_sleep_and_timestamps_alone():
    assert clock_reads(ast.parse("import time\ntime.sleep(1)\nfrom x import timestamp\nt = timestamp()\n"
                                 "ok = timestamp() < t + 1\n")) == []


# 6. imports at the top --------------------------------------------------------------------------------

def nested_imports(tree: ast.Module) -> list[ast.stmt]:
    top = set()
    for node in tree.body:
        top.add(node)
        if isinstance(node, (ast.If, ast.Try)):
            top.update(ast.walk(node))
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and n not in top]


def test_imports_inside_functions_are_listed_optional_ones_with_a_reason():
    bad = []
    for p in SOURCES:
        lines = p.read_text(encoding="utf-8").splitlines()
        allowed = OPTIONAL_IMPORTS.get(_rel(p), set())
        for node in nested_imports(_tree(p)):
            names = [a.name if isinstance(node, ast.Import) else node.module for a in node.names]
            window = " ".join(lines[max(0, node.lineno - 3): node.lineno])
            if any(n not in allowed for n in names) or "#" not in window:
                bad.append(f"perflab/{_rel(p)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not bad, ("imports inside functions that are not listed optional dependencies with a "
                     "comment (move them to the top, or list them in OPTIONAL_IMPORTS):\n" + "\n".join(bad))


def test_nothing_cites_a_file_outside_the_repository():
    texts = [p for p in ROOT.rglob("*") if p.suffix in (".md", ".py", ".yml", ".toml", ".sh")
             and not any(part in (".venv", "_build", ".cache", "student", ".git") for part in p.parts)]
    bad = [str(p.relative_to(ROOT)) for p in texts
           if re.search(r"(?<![\w/])DESIGN\.md|OUTLINE\.md|/work/shared", p.read_text(errors="ignore"))
           and p.name != "test_architecture.py"]
    assert not bad, f"files citing documents outside the repository: {bad}"


# 7. a module under its own name --------------------------------------------------------------------

#: Files that still import a perflab module under another name, each waiting for its owner (the
#: list only shrinks: a listed file that no longer does fails the test too).
RENAMED_MODULES_WAITING = {
    # the distributed engineer's (issue 38), who moved them here with GPT-2's torchrun tasks
    "perflab/gpt2/multi_gpu.py": {"perflab.gpt2.model as gpt2_model", "perflab.gpt2.steps as gpt2_steps"},
    "tests/test_distributed.py": {"perflab.distributed.launch as L", "perflab.distributed.worker as w"},
    "tests/test_interconnect.py": {"perflab.machine.interconnect as D"},
    # the tests of the lead's and the grader's modules, theirs to rename
    "tests/test_ceilings.py": {"perflab.machine.ceilings as C"},
    "tests/test_exercises.py": {"perflab.labs.exercises as E"},
    "tests/test_sampler.py": {"perflab.core.sampler as T"},
    "tests/test_telemetry.py": {"perflab.core.telemetry as T"},
}


def renamed_modules(tree: ast.AST, modules: set[str]) -> set[str]:
    """``"perflab.x.y as z"`` for every import in ``tree`` that binds a perflab module (or
    subpackage) ``y`` to another name ``z``; renamed functions and classes are fine."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("perflab.") and a.asname and a.asname != a.name.rsplit(".", 1)[1]:
                    found.add(f"{a.name} as {a.asname}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("perflab") \
                and not node.level:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if a.asname and a.asname != a.name and full.split(".", 1)[1] in modules:
                    found.add(f"{full} as {a.asname}")
    return found


def _sources_of(path: Path) -> str:
    if path.suffix == ".md":
        return "\n\n".join(architecture.code_cells(path))
    return path.read_text(encoding="utf-8")


def test_modules_are_imported_under_their_own_names():
    names = set(MODULES) | {sec.name for sec in architecture.SECTIONS}
    files = (SOURCES + ELSEWHERE + sorted((ROOT / "tests").glob("*.py"))
             + sorted((ROOT / "grader").glob("*.py")) + architecture.pages(ROOT))
    found = {}
    for path in files:
        renamed = renamed_modules(ast.parse(_sources_of(path)), names)
        if renamed:
            found[path.relative_to(ROOT).as_posix()] = renamed
    new = {f: sorted(r - RENAMED_MODULES_WAITING.get(f, set())) for f, r in found.items()}
    new = {f: r for f, r in new.items() if r}
    assert not new, f"modules imported under another name (import them under their own): {new}"
    gone = {f: sorted(r - found.get(f, set())) for f, r in RENAMED_MODULES_WAITING.items()}
    gone = {f: r for f, r in gone.items() if r}
    assert not gone, f"no longer renamed: remove from RENAMED_MODULES_WAITING: {gone}"


def test_the_renaming_rule_tells_modules_from_functions():
    names = {"gpt2.model", "core.device", "core"}
    code = ("from perflab.gpt2 import model as gpt2\nimport perflab.core.device as hardware\n"
            "from perflab.core.device import device as default_device\nfrom perflab import core as c\n"
            "import perflab.core.device as device\nfrom perflab.gpt2 import model\n")
    assert renamed_modules(ast.parse(code), names) == {
        "perflab.gpt2.model as gpt2", "perflab.core.device as hardware", "perflab.core as c"}


# 8. modules small enough to hold one idea -------------------------------------------------------------

#: The longest a perflab module may be, in lines (as ``wc -l`` counts them).
MAX_MODULE_LINES = 600


def long_modules(paths, limit: int = MAX_MODULE_LINES) -> list[tuple[str, int]]:
    """``(path, lines)`` for every file of ``paths`` longer than ``limit`` lines, longest first."""
    lengths = [(p, len(Path(p).read_text(encoding="utf-8").splitlines())) for p in paths]
    return sorted(((Path(p).as_posix(), n) for p, n in lengths if n > limit), key=lambda t: -t[1])


def test_no_module_is_longer_than_600_lines():
    found = long_modules(SOURCES)
    assert not found, (f"perflab modules over {MAX_MODULE_LINES} lines (split each along one of its "
                       "ideas into a module of its own):\n"
                       + "\n".join(f"perflab/{Path(p).relative_to(PKG).as_posix()}: {n} lines"
                                    for p, n in found))


def test_the_length_rule_catches_a_long_module(tmp_path):
    short, edge, long = tmp_path / "short.py", tmp_path / "edge.py", tmp_path / "long.py"
    short.write_text("x = 1\n" * 10)
    edge.write_text("x = 1\n" * MAX_MODULE_LINES)
    long.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert long_modules([short, edge, long]) == [(long.as_posix(), MAX_MODULE_LINES + 1)]
    assert long_modules([short], limit=9) == [(short.as_posix(), 10)]
