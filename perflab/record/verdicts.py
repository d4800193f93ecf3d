"""Two runs of the same pages, compared: glued numbers, expectations and claim verdicts.

A verdict that changes between two runs of one source was drawn inside the noise of its
measurement. To see it, each reference run leaves a small **run record** (:func:`snapshot`:
every page's glued numbers, its expectations and its claims' verdicts with what bounds them,
``runs/<run>.json`` in the repository), and :func:`compare` sets two records (or two folders of
executed notebooks) side by side:

* a claim's verdict is read from the record stored beside its glued sentence
  (:data:`perflab.record.claims.VERDICT_MIME`: ``true``, ``false`` or ``undecided``, and
  ``device``, ``host`` or ``exact``); for a notebook from before verdicts were stored, the
  sentence with its numbers masked stands in for it (a different wording is a changed
  verdict, bound unknown);
* any change of a verdict counts (within / outside / undecided), and is a **defect** of the
  page unless the claim declared itself host-bound (``bound="host"``) **and** its prediction
  does not come from this run's own host measurements: a host figure (a rate, a time, a
  speedup) judged against a fixed number may change between hosts, and the status page shows
  both values; but a ratio of a host measurement to a prediction built from the same host's
  parts (in the same rounds) is the model's test, which a drift of the host cancels, so its
  change is a defect like any other. A page declares such claims with
  :func:`same_host_prediction` (stored as ``samehost_<claim>``, :data:`SAME_HOST_PREFIX`);
  the record then marks the verdict ``"prediction": "this host"``;
* pages present in only one of the runs are reported;
* a claim's spread sentence (``<name>_spread``, :func:`perflab.record.claims.compare`) is
  left out: the claim's record holds its numbers;
* a glued text that is no claim (a cause sentence, a list of numbers) is no verdict when the
  page's runs store verdicts: a change of its words, numbers and their units masked, is listed
  as a changed text (:attr:`PageComparison.texts`), not counted.

Command line: ``python scripts/compare_runs.py A B`` (A and B: run records or folders holding
``book/`` and ``labs/``); ``--record FILE`` writes a record of the current tree.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perflab.core.validate import number
from perflab.record.claims import EXPECT_PREFIX, SPREAD_SUFFIX, read_verdicts
from perflab.record.provenance import glue, read_glued, reference_run

__all__ = ["RUNS_FOLDER", "SAME_HOST_PREFIX", "SCHEMA", "Change", "PageComparison", "compare",
           "last_two", "latest_comparable", "load", "same_host_prediction", "snapshot",
           "source_key"]

#: Glue-name prefix of a page's declaration that a claim's prediction is built from this run's
#: own host measurements (:func:`same_host_prediction`).
SAME_HOST_PREFIX = "samehost_"

#: Where the repository keeps its run records (one JSON file per reference run).
RUNS_FOLDER = "runs"

SCHEMA = "perflab-run-record/1"
_FOLDERS = ("book", "labs")
_TELEMETRY = "measured over"      # a telemetry sentence states readings, not a verdict


# a number with its sign, exponent, SI prefix and unit ("-3.11 ms", "588.4k", "1,551 MHz",
# "91.3 %", "1.85x"): two runs that print one value in other units say the same thing
_NUMBER = re.compile(r"[-\u2212]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"
                     r"(?:\s?(?:[kMGTPnuµm]?(?:FLOP/s|B/s|iB|Hz|B|W|s)\b|%|x\b|[kMGT]\b))?")


def same_host_prediction(*names: str) -> None:
    """Declare, in an executed page, that each named claim judges a host measurement against a
    prediction built from this run's own host measurements (parts timed in the same rounds, on
    the same host): its ``bound="host"`` then exempts nothing, and a change of its verdict
    between two runs of one source is a defect (:func:`compare`).

    Glues ``True`` under ``samehost_<name>`` for each name (bookkeeping: the prose quotes
    none of them); call it in a remove-cell beside the claims.

    Raises:
        ValueError: no name, or a name that is not a Python identifier.
    """
    if not names:
        raise ValueError("same_host_prediction needs at least one claim name")
    for name in names:
        if not (isinstance(name, str) and name.isidentifier()):
            raise ValueError(f"names must be claim names (identifiers), got {name!r}")
    for name in names:
        glue(SAME_HOST_PREFIX + name, True)


def _masked(text: str) -> str:
    """``text`` with every number (and its unit) replaced by ``#``."""
    return _NUMBER.sub("#", text)


def source_key(run: dict[str, Any]) -> str | None:
    """One SHA-256 (hex) of what a page's run executed: its code cells' hash and the hashes of
    the perflab modules they import (``source_sha256``, ``perflab_sha256`` of the notebook's
    reference-run metadata); None for a run that recorded no source hash. Two runs of a page
    with the same key ran the same source."""
    if not run.get("source_sha256"):
        return None
    body = json.dumps({"source": run.get("source_sha256"),
                       "perflab": run.get("perflab_sha256") or {}}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


def _page(ipynb: Path) -> dict[str, Any]:
    glued = read_glued(ipynb)
    verdicts = read_verdicts(ipynb)
    numbers, expectations, sentences = {}, {}, {}
    same_host = {name[len(SAME_HOST_PREFIX):] for name, value in glued.items()
                 if name.startswith(SAME_HOST_PREFIX) and value in (True, "True")}
    for name, value in glued.items():
        if name.startswith(SAME_HOST_PREFIX):
            continue
        if name.startswith(EXPECT_PREFIX):
            expectations[name[len(EXPECT_PREFIX):]] = value is True or str(value) == "True"
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            numbers[name] = value
        elif (name not in verdicts and isinstance(value, str) and _TELEMETRY not in value
              and not (name.endswith(SPREAD_SUFFIX)
                       and name[:-len(SPREAD_SUFFIX)] in verdicts)):
            # (a claim's spread sentence, compare's <name>_spread, is that claim's record
            # again in words: the verdict and its numbers are recorded with the claim)
            sentences[name] = value
    run = reference_run(ipynb) or {}
    return {"run": {**{k: run.get(k) for k in ("git", "started", "devices", "torch")},
                    "source": source_key(run)},
            "numbers": numbers, "expectations": expectations,
            "verdicts": {k: {"verdict": v.get("verdict"), "bound": v.get("bound"),
                             **({"prediction": "this host"} if k in same_host else {}),
                             **({"measured": v["measured"]} if "measured" in v else {}),
                             # lo, hi: the measured spread's edges, NOT the band's; the
                             # band is predicted x (1 -/+ tolerance) where a claim has one
                             **({"lo": v["lo"], "hi": v["hi"]} if "lo" in v else {}),
                             **({"band_lo": v["predicted"] * (1 - v["tolerance"]),
                                 "band_hi": v["predicted"] * (1 + v["tolerance"])}
                                if "predicted" in v and "tolerance" in v else {})}
                         for k, v in verdicts.items()},
            "sentences": sentences}


def snapshot(root: str | Path, run: str | None = None,
             only_run: bool = False) -> dict[str, Any]:
    """The run record of the executed notebooks under ``root`` (``book/*.ipynb``,
    ``labs/*.ipynb``): ``{"schema", "run", "pages": {"book/01_x": {...}}, "left_out": {...}}``.

    With ``only_run``, a notebook whose ceilings name another reference run than ``run`` (a page
    that failed in this run keeps an older notebook in the tree) is left out of ``pages`` and
    listed in ``left_out`` with the run it came from, so the record holds this run only.

    Raises:
        FileNotFoundError: ``root`` holds no executed notebook.
        ValueError: ``only_run`` without ``run``.
    """
    if only_run and not run:
        raise ValueError("only_run needs the run's name (run=...)")
    root = Path(root)
    pages, left_out = {}, {}
    for folder in _FOLDERS:
        for ipynb in sorted((root / folder).glob("*.ipynb")):
            name = f"{folder}/{ipynb.stem}"
            came_from = ((reference_run(ipynb) or {}).get("ceilings") or {}).get("run")
            if only_run and came_from != run:
                left_out[name] = came_from or "no run named"
                continue
            pages[name] = _page(ipynb)
    if not pages:
        raise FileNotFoundError(f"no executed notebook under {root}/book or {root}/labs"
                                + (f" from run {run!r}" if only_run else ""))
    started = sorted(p["run"]["started"] for p in pages.values() if p["run"].get("started"))
    doc = {"schema": SCHEMA, "run": run, "started": started[0] if started else None,
           "pages": pages}
    if left_out:
        doc["left_out"] = left_out
    return doc


def load(source: str | Path) -> dict[str, Any]:
    """A run record from a record file, or made from a folder of executed notebooks.

    Raises:
        FileNotFoundError: no such file or folder, or a folder without notebooks.
        ValueError: a file that is not a run record.
    """
    source = Path(source)
    if source.is_dir():
        return snapshot(source, run=source.name)
    doc = json.loads(source.read_text())
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{source} is not a run record ({SCHEMA})")
    return doc


@dataclass(frozen=True)
class Change:
    """One verdict that differs between run A and run B.

    Attributes:
        name: the glue name (a claim, or ``expect_<name>``).
        a, b: the verdict (or masked sentence) in each run.
        bound: ``"device"``, ``"host"``, ``"exact"`` or None (not declared: an older run).
        values: the measured medians in A and B where the records hold them.
        predicted: the predictions (the bands' centres) in A and B where the records hold
            them, so that a change can be shown as measured over predicted, without a unit.
        same_host: either run's page declared the claim's prediction built from that run's
            own host measurements (:func:`same_host_prediction`).
    """

    name: str
    a: str
    b: str
    bound: str | None = None
    values: tuple[Any, Any] | None = None
    predicted: tuple[Any, Any] | None = None
    same_host: bool = False

    @property
    def over_predicted(self) -> tuple[float, float] | None:
        """Measured over predicted in A and B (unitless), or None where either is unknown."""
        if not self.values or not self.predicted or None in self.values + self.predicted:
            return None
        if 0 in self.predicted:
            return None
        return (self.values[0] / self.predicted[0], self.values[1] / self.predicted[1])

    @property
    def defect(self) -> bool:
        """A change that is not exempt: a claim not declared host-bound, or a host-bound one
        whose prediction comes from the same run's host measurements (the model missed a
        host-dependent term, or the measurement needs rounds)."""
        return self.bound != "host" or self.same_host


@dataclass
class PageComparison:
    """One page in two runs: how many verdicts agree, which changed, how far numbers moved."""

    page: str
    verdicts: int = 0
    changes: list[Change] = field(default_factory=list)
    moved: list[tuple[float, str, float, float]] = field(default_factory=list)
    numbers: int = 0
    #: why the two runs are not two runs of one source on one device (None: they are, or the
    #: records cannot tell): then a changed verdict is no defect of the page's measurement
    not_comparable: str | None = None
    #: glued texts that are no claim and whose words changed (numbers masked), when both runs
    #: store verdicts: shown, never counted (a cause sentence's branch, a formatted list)
    texts: list[Change] = field(default_factory=list)

    @property
    def agreeing(self) -> int:
        """Verdicts (claims and expectations) the two runs agree on."""
        return self.verdicts - len(self.changes)

    @property
    def defects(self) -> list[Change]:
        """Changes that are not exempt (:attr:`Change.defect`), between two runs of one source
        on one device (none when :attr:`not_comparable` says the runs differ in either)."""
        return [] if self.not_comparable else [c for c in self.changes if c.defect]


def _centre(verdict: dict[str, Any]) -> float | None:
    """The prediction a recorded verdict was judged against: its band's centre (None without
    a band)."""
    if "band_lo" not in verdict or "band_hi" not in verdict:
        return None
    return (verdict["band_lo"] + verdict["band_hi"]) / 2


def _devices_text(devices: Any) -> str:
    return " + ".join(devices) if isinstance(devices, list) else str(devices)


def _not_comparable(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    ra, rb = a.get("run") or {}, b.get("run") or {}
    da, db = ra.get("devices"), rb.get("devices")
    if da and db and da != db:
        return f"different devices ({_devices_text(da)}; {_devices_text(db)})"
    sa, sb = ra.get("source"), rb.get("source")
    if sa and sb and sa != sb:
        return "different source (the page's code or a perflab module it imports changed)"
    return None


def _compare_page(name: str, a: dict[str, Any], b: dict[str, Any],
                  moved: float) -> PageComparison:
    out = PageComparison(name, not_comparable=_not_comparable(a, b))
    for key in sorted(set(a["expectations"]) & set(b["expectations"])):
        out.verdicts += 1
        if a["expectations"][key] != b["expectations"][key]:
            out.changes.append(Change(EXPECT_PREFIX + key, str(a["expectations"][key]),
                                      str(b["expectations"][key]), "exact"))
    va, vb = a["verdicts"], b["verdicts"]
    for key in sorted(set(va) & set(vb)):
        out.verdicts += 1
        if va[key]["verdict"] != vb[key]["verdict"]:
            bounds = {va[key].get("bound"), vb[key].get("bound")}
            bound = "host" if bounds == {"host"} else (vb[key].get("bound") or
                                                       va[key].get("bound"))
            same = "this host" in (va[key].get("prediction"), vb[key].get("prediction"))
            out.changes.append(Change(key, va[key]["verdict"], vb[key]["verdict"], bound,
                                      (va[key].get("measured"), vb[key].get("measured")),
                                      (_centre(va[key]), _centre(vb[key])), same))
    sa, sb = a.get("sentences", {}), b.get("sentences", {})
    # a claim recorded in one run only as a sentence (an older run, which stored no verdicts):
    # compare its words; where both runs store verdicts, a text that is no claim in either is
    # no verdict, and a change of its words is listed apart
    for key in sorted((set(sa) | set(va)) & (set(sb) | set(vb)) - (set(va) & set(vb))):
        ta = sa.get(key) if key in sa else None
        tb = sb.get(key) if key in sb else None
        if ta is None or tb is None or not isinstance(ta, str) or not isinstance(tb, str):
            continue
        if _masked(ta) == _masked(tb):
            if not (va and vb):
                out.verdicts += 1
            continue
        if va and vb:
            out.texts.append(Change(key, ta, tb, None))
        else:
            out.verdicts += 1
            out.changes.append(Change(key, ta, tb, None))
    na, nb = a["numbers"], b["numbers"]
    for key in sorted(set(na) & set(nb)):
        out.numbers += 1
        xa, xb = na[key], nb[key]
        if xa:
            change = abs(xb / xa - 1)
            if change > moved:
                out.moved.append((change, key, xa, xb))
    out.moved.sort(reverse=True)
    return out


def compare(a: dict[str, Any], b: dict[str, Any],
            moved: float = 0.10) -> tuple[list[PageComparison], list[str], list[str]]:
    """Compare two run records (:func:`load`).

    Args:
        a, b: run records.
        moved: relative change above which a glued number counts as moved (>= 0).

    Returns:
        ``(pages present in both, pages only in A, pages only in B)``.

    Raises:
        ValueError: a negative ``moved``.
    """
    number("moved", moved, minimum=0)
    pa, pb = a["pages"], b["pages"]
    both = [_compare_page(name, pa[name], pb[name], moved) for name in sorted(set(pa) & set(pb))]
    return both, sorted(set(pa) - set(pb)), sorted(set(pb) - set(pa))


def _records(root: str | Path) -> list[dict[str, Any]]:
    """The readable run records in ``root/runs/`` that name a start, oldest first."""
    records = []
    for path in sorted((Path(root) / RUNS_FOLDER).glob("*.json")):
        try:
            records.append(load(path))
        except (OSError, ValueError):
            continue
    return sorted((r for r in records if r.get("started")), key=lambda r: r["started"])


def last_two(root: str | Path) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The two most recent run records in ``root/runs/`` (by the time their first page
    started), older first; None when there are fewer than two."""
    records = _records(root)
    return (records[-2], records[-1]) if len(records) >= 2 else None


def latest_comparable(root: str | Path) -> tuple[str | None, dict[str, tuple[str, str, PageComparison]]]:
    """Each page's newest run in ``root/runs/`` (the newest record that holds the page), compared
    with the latest earlier record that ran the same source on the same device
    (:func:`source_key`; a record without source hashes counts as the same source when its
    device matches).

    A record of a partial re-run (some pages only) is the newest run of its pages; the other
    pages keep their comparison from the records before it.

    Returns:
        ``(newest record's name, {page: (its newest run's name, the earlier run's name,
        PageComparison)})``; a page with no such earlier run is absent; ``(None, {})`` when
        ``runs/`` holds no record.
    """
    records = _records(root)
    if not records:
        return None, {}
    found, seen = {}, set()
    for i in range(len(records) - 1, -1, -1):
        newer = records[i]
        for name, page in newer["pages"].items():
            if name in seen:
                continue
            seen.add(name)
            for older in reversed(records[:i]):
                other = older["pages"].get(name)
                if other is not None and _not_comparable(other, page) is None:
                    found[name] = (newer.get("run"), older.get("run"),
                                   _compare_page(name, other, page, 0.10))
                    break
    return records[-1].get("run"), found
