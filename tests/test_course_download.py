"""Chapter 8 and lab 8 are executed by the course download, installed as its README says (issue 39).

The executions themselves are ``tests/test_chapters.py``'s (chapter 8) and
``tests/test_lab_checks.py``'s (lab 8, reference answers and wrong ones); here, cheaply, that
those executions are the download's: the zip ships both pages, and the tests' execution of each
goes through :func:`course_download.execute` / the installed course, not the repository.
"""

import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import background  # noqa: E402
import course_download  # noqa: E402
import lab_runs  # noqa: E402

CHAPTER_8 = ROOT / "book" / "08_distributed_training.md"
LAB_8 = ROOT / "labs" / "08_distributed.md"


def test_the_course_zip_ships_chapter_8_and_lab_8(tmp_path):
    names = set(zipfile.ZipFile(course_download.write_course_zip(tmp_path / "c.zip")).namelist())
    for page in (CHAPTER_8, LAB_8):
        assert page.relative_to(ROOT).as_posix() in names
        assert course_download.from_download(page)
    assert not course_download.from_download(ROOT / "book" / "02_hardware.md")


def test_chapter_8_is_executed_by_the_download(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(course_download, "execute", lambda md, out, timeout_s: calls.append(md) or "ran")
    assert background._execute(CHAPTER_8, tmp_path) == "ran" and calls == [CHAPTER_8]


def test_lab_8_is_run_by_the_download(monkeypatch, tmp_path):
    got = {}

    def fake_run(cmd, timeout, **kw):
        got.update(cmd=cmd, **kw)
        return "ran"

    monkeypatch.setattr(course_download, "installed", lambda tmp: (tmp / "course", tmp / "venv/bin/python",
                                                                   {"E": "1"}))
    monkeypatch.setattr(background, "run", fake_run)
    assert lab_runs._run_elsewhere(LAB_8, tmp_path / "run.pickle") == "ran"
    assert got["cmd"][0] == str(tmp_path / "download" / "venv/bin/python")
    assert got["cmd"][2] == str(tmp_path / "download" / "course" / "labs" / "08_distributed.md")
    assert got["cwd"] == tmp_path / "download" / "course" and got["env"] == {"E": "1"}
