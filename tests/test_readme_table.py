"""The README's table says which machine ran each chapter and lab: it must agree with the
provenance the committed notebooks carry (a re-run on another machine updates both)."""
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def gpus(md_link: str) -> int | None:
    """How many GPUs the committed run of ``md_link`` used; None when it has no run yet."""
    nb = ROOT / Path(md_link).with_suffix(".ipynb")
    if not nb.exists():
        return None
    return len(json.loads(nb.read_text())["metadata"]["reference_run"]["devices"])


def test_readme_status_column_names_the_machines_that_ran_the_notebooks():
    rows = [ln for ln in (ROOT / "README.md").read_text().splitlines() if re.match(r"\| \d+ \|", ln)]
    assert len(rows) == 10
    for row in rows:
        links = re.findall(r"\]\(((?:book|labs)/[^)]+\.md)\)", row)
        status = row.rstrip(" |").rsplit("|", 1)[1]
        counts = [gpus(link) for link in links]
        named = [int(n) for n in re.findall(r"(\d)× NVIDIA H200", status)]
        if None in counts:      # a page awaiting its first run: the row says so, names no run
            assert status.strip().startswith("awaiting its first reference run"), (
                f"{row}: {[l for l, c in zip(links, counts) if c is None]} ha(s) no run yet")
            continue
        if len(set(counts)) == 1:
            assert named == counts[:1], f"{row}: the notebooks ran on {counts[0]} GPU(s)"
        else:
            assert named == counts, f"{row}: chapter and lab ran on {counts} GPU(s)"
