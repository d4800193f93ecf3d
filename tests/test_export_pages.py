"""scripts/export_pages.py: code taught on a page is exported into perflab, and the package's
generated modules are exactly what the pages say (d2l's ``#@save``)."""

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
