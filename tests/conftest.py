"""Shared set-up of the unit tests: the repository root on sys.path and small CPU problem sizes.
(Caches and scratch files are kept inside the clone by the root conftest.py.)"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PERFLAB_FORCE_CPU_SIZES", "1")

# The built book (one build per session, shared by tests/test_book.py and tests/test_reader.py).
from book_site import build, rendered, server  # noqa: E402,F401

# Heavy, independent work (chapter executions, lab runs, book builds) starts when the session
# does, two pieces at a time, ahead of the tests that read it (tests/background.py). Each test
# module that has such work names it in ``background_jobs(items, tmp_path_factory)``.
import background  # noqa: E402
import pytest  # noqa: E402


def pytest_collection_finish(session):
    if session.config.option.collectonly or not session.items:
        return
    factory = session.config._tmp_path_factory
    jobs, seen = [], set()
    for plan in background.FIXTURE_PLANS:      # session fixtures' jobs (the book), then modules'
        jobs += plan(session.items, factory)
    for item in session.items:
        module = getattr(item, "module", None)
        plan = getattr(module, "background_jobs", None)
        if plan is not None and module not in seen:
            seen.add(module)
            jobs += plan(session.items, factory)
    if any(background.CEILINGS in after for *_, after in jobs):
        jobs += background.ceilings_job(session.items)
    background.start(jobs)


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session):
    try:
        return (yield)
    finally:
        background.stop()


def pytest_configure(config):
    config.addinivalue_line("markers", "alone: runs with no background job beside it (tests/background.py)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if item.get_closest_marker("alone") is None:
        return (yield)
    with background.quiet():
        return (yield)
