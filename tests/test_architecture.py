"""The shape of perflab that docs/ARCHITECTURE.md describes: no import cycle, imports at the top
of modules (except optional ones, each with a comment), every module in the module map."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "perflab"
MODULES = sorted(".".join(p.relative_to(PKG).with_suffix("").parts) for p in PKG.rglob("*.py")
                 if p.stem != "__init__")


def _file(name: str) -> Path:
    return PKG.joinpath(*name.split(".")).with_suffix(".py")


def _internal_imports(name: str) -> tuple[set[str], list[tuple[int, str]]]:
    """(perflab modules imported at module level, in-function imports as (line, text))."""
    tree = ast.parse(_file(name).read_text())
    top, nested = set(), []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        at_top = node in tree.body or any(node in getattr(n, "body", []) for n in tree.body
                                          if isinstance(n, (ast.If, ast.Try)))
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("perflab."):
            if at_top:
                mod = node.module.removeprefix("perflab.")
                top.update(f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod for a in node.names)
        if not at_top:
            nested.append((node.lineno, ast.unparse(node)))
    return top, nested


def test_the_import_graph_has_no_cycle():
    graph = {m: _internal_imports(m)[0] & set(MODULES) for m in MODULES}
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for n in graph[m]:
            assert state.get(n) != 1, "import cycle: " + " -> ".join(path + [n])
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in MODULES:
        if m not in state:
            visit(m, [m])


# Modules of chapters 5-9, merged while issue 9 was under way: their perflab imports are at the top
# like everyone's, but their third-party imports inside functions (torchvision, PIL, triton,
# tokenizers, torch.distributed.checkpoint, ...) have not been reviewed one by one yet.
THIRD_PARTY_IMPORTS_NOT_YET_REVIEWED = {"kernels.attention", "kernels.compiler", "kernels.custom_ops",
                                        "speed.datamovement", "loading.datasets", "gpt2.model", "labs.lab05",
                                        "memory.training", "distributed.training", "kernels.precision",
                                        "speed.techniques", "labs.lab09", "labs.lab07"}


def test_imports_inside_functions_are_optional_ones_with_a_reason():
    lines = {m: _file(m).read_text().splitlines() for m in MODULES}
    bad = []
    for m in MODULES:
        for lineno, text in _internal_imports(m)[1]:
            window = " ".join(lines[m][max(0, lineno - 3): lineno])
            if "from perflab" in text or ("#" not in window and m not in THIRD_PARTY_IMPORTS_NOT_YET_REVIEWED):
                bad.append(f"{_file(m).relative_to(ROOT)}:{lineno}: {text}")
    assert not bad, "imports inside functions without an 'optional: why' comment:\n" + "\n".join(bad)


def test_every_module_is_in_the_architecture_map():
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    missing = [m for m in MODULES if not re.search(rf"`{m}`", doc)]
    assert not missing, f"docs/ARCHITECTURE.md's module map lacks {missing}"


def test_nothing_cites_a_file_outside_the_repository():
    texts = [p for p in ROOT.rglob("*") if p.suffix in (".md", ".py", ".yml", ".toml", ".sh")
             and not any(part in (".venv", "_build", ".cache", "student", ".git") for part in p.parts)]
    bad = [str(p.relative_to(ROOT)) for p in texts
           if re.search(r"(?<![\w/])DESIGN\.md|OUTLINE\.md|/work/shared", p.read_text(errors="ignore"))
           and p.name != "test_architecture.py"]
    assert not bad, f"files citing documents outside the repository: {bad}"
