"""The README's table says which machine ran each chapter and lab: it must agree with the
provenance the committed notebooks carry (a re-run on another machine updates both)."""
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def devices(md_link: str) -> list[str] | None:
    """The devices of the committed run of ``md_link``; None when it has no run yet."""
    nb = ROOT / Path(md_link).with_suffix(".ipynb")
    if not nb.exists():
        return None
    return json.loads(nb.read_text())["metadata"]["reference_run"]["devices"]


def test_readme_status_column_names_the_machines_that_ran_the_notebooks():
    rows = [ln for ln in (ROOT / "README.md").read_text().splitlines() if re.match(r"\| \d+ \|", ln)]
    assert len(rows) == 10
    for row in rows:
        links = re.findall(r"\]\(((?:book|labs)/[^)]+\.md)\)", row)
        status = row.rstrip(" |").rsplit("|", 1)[1]
        runs = [devices(link) for link in links]
        if None in runs:        # a page awaiting its first run: the row says so, names no run
            assert status.strip().startswith("awaiting its first reference run"), (
                f"{row}: {[l for l, c in zip(links, runs) if c is None]} ha(s) no run yet")
            continue
        assert not status.strip().startswith("awaiting"), f"{row}: every page of it has a run"
        # the device and the count the notebooks name (an H100 run is not an H200 run)
        for run in runs:
            named = f"{len(run)}× {run[0]}"
            assert named in status, f"{row}: its notebooks ran on {named}"
