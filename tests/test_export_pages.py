"""scripts/export_pages.py: code taught on a page is exported into perflab, and the package's
generated modules are exactly what the pages say (d2l's ``#@save``)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
import export_pages  # noqa: E402
from myst_source import HEADER  # noqa: E402


def page(tmp_path: Path, name: str, *cells: str) -> Path:
    body = HEADER + "\n# A chapter\n\n## Accumulation\n"
    for src in cells:
        body += "\n```{code-cell} ipython3\n" + src + "\n```\n"
    path = tmp_path / "book" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    return path


SAVED = '''#@save perflab.memory.steps
import torch
from torch import nn


def double(x: torch.Tensor) -> torch.Tensor:
    """Twice x."""
    return x * 2'''


def test_the_package_matches_its_pages():
    """Every generated module is what the pages export now (fails after an edit of either)."""
    assert export_pages.main(["--check"]) == 0, "run: python scripts/export_pages.py"


def test_a_saved_cell_becomes_a_module_with_its_imports_on_top(tmp_path):
    p = page(tmp_path, "07_x.md", SAVED, "x = 1", "#@save perflab.memory.steps\nimport torch\n\n\n"
             "def triple(x):\n    return x * 3")
    mods = export_pages.collect([p])
    assert list(mods) == ["perflab.memory.steps"]
    text = mods["perflab.memory.steps"].text()
    assert text.startswith(export_pages.HEADER)
    assert text.count("import torch") == 1 and text.index("import torch") < text.index("def double")
    assert text.index("def double") < text.index("def triple") and "x = 1" not in text
    assert "Accumulation" in text                 # the section it is taught in
    ns = {}
    exec(compile(text, "steps.py", "exec"), ns)   # a valid module
    assert ns["triple"](2) == 6


def test_a_cell_that_runs_code_or_a_lab_cannot_export(tmp_path):
    p = page(tmp_path, "07_x.md", SAVED + "\nprint(double(1))")
    with pytest.raises(export_pages.ExportError, match="only imports, definitions"):
        export_pages.collect([p])
    lab = tmp_path / "labs" / "07_lab.md"
    lab.parent.mkdir()
    lab.write_text(page(tmp_path, "x.md", SAVED).read_text())
    with pytest.raises(export_pages.ExportError, match="labs never export"):
        export_pages.collect([lab])


def test_check_fails_when_a_generated_module_was_edited_by_hand(tmp_path, monkeypatch, capsys):
    p = page(tmp_path, "07_x.md", SAVED)
    monkeypatch.setattr(export_pages, "ROOT", tmp_path)
    monkeypatch.setattr(export_pages, "pages", lambda: [p])
    assert export_pages.main([]) == 0             # writes perflab/memory/steps.py under tmp_path
    target = tmp_path / "perflab" / "memory" / "steps.py"
    assert target.exists() and export_pages.main(["--check"]) == 0
    target.write_text(target.read_text().replace("x * 2", "x * 3"))
    assert export_pages.main(["--check"]) == 1
    assert "x * 3" in capsys.readouterr().out


def test_the_first_cell_s_docstring_becomes_the_module_s(tmp_path):
    first = SAVED.replace("#@save perflab.memory.steps\n",
                          '#@save perflab.memory.steps\n"""Steps that double things."""\n')
    mods = export_pages.collect([page(tmp_path, "07_x.md", first)])
    text = mods["perflab.memory.steps"].text()
    ns = {}
    exec(compile(text, "steps.py", "exec"), ns)
    assert ns["__doc__"].startswith("Steps that double things.\n\nCode taught on")
    assert text.count("Steps that double things.") == 1      # not copied again as code
    # without one, the module says where its code is taught
    plain = export_pages.collect([page(tmp_path, "08_x.md", SAVED)])["perflab.memory.steps"].text()
    exec(compile(plain, "steps.py", "exec"), ns)
    assert ns["__doc__"].startswith("Code taught on")
    later = page(tmp_path, "09_x.md", SAVED, '#@save perflab.memory.steps\n"""A second doc."""\n\n\n'
                 "def triple(x):\n    return x * 3")
    with pytest.raises(export_pages.ExportError, match="only the first cell"):
        export_pages.collect([later])


#: Generated modules whose first #@save cell does not open with a docstring yet, waiting for their
#: page's author (a list that only shrinks): chapter 8's, the distributed engineer's (issue 38).
WITHOUT_DOCSTRING = {"perflab.distributed.costs", "perflab.distributed.steps"}


def test_every_exported_module_of_the_book_says_what_it_owns():
    """The module map's "idea" column of a generated module is its first cell's docstring, not
    the generic sentence."""
    generic = {name for name, mod in export_pages.collect().items() if not mod.doc}
    assert not generic - WITHOUT_DOCSTRING, ("open the first #@save cell of these modules with a "
                                             f"docstring: {sorted(generic - WITHOUT_DOCSTRING)}")
    assert not WITHOUT_DOCSTRING - generic, ("these have a docstring now: remove them from "
                                             f"WITHOUT_DOCSTRING: {sorted(WITHOUT_DOCSTRING - generic)}")


def test_the_exporter_imports_neither_torch_nor_the_run_records():
    code = ("import sys; sys.path.insert(0, 'scripts'); import export_pages; export_pages.collect(); "
            "bad = [m for m in ('torch', 'perflab.record.runs', 'perflab.record.provenance') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
