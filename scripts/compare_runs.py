#!/usr/bin/env python3
"""Compare two runs of the same pages: glued numbers, expectations and claim verdicts.

    python scripts/compare_runs.py A B [--moved 0.10]    # A, B: run records or run folders
    python scripts/compare_runs.py --record runs/ID.json [--root .] [--run ID]

A and B are run records (``runs/*.json``, written by ``--record``) or folders holding executed
``book/*.ipynb`` and ``labs/*.ipynb`` (the project root is one). For each page in both: how many
verdicts the runs agree on, every verdict that changed (within / outside / undecided, true /
false, an expectation) with what bounds it, and the numbers that moved by more than
``--moved``; then the pages present in only one run. A changed verdict is a **defect** unless its
claim is declared host-bound with a prediction that does not come from the run's own host
measurements (see :mod:`perflab.record.verdicts`: a host-bound claim whose page declared its
prediction built from the same host's parts counts), or the page's two runs differ in device or
in source (the page's code or a perflab module it imports): then its changes are listed but not
counted. A glued text that is no claim (a cause sentence, a formatted list) and
whose words changed, numbers and units masked, is listed as a changed text, not counted.

Exit status: 0 when no verdict changed except exempt host-bound ones, 1 when one did (a
defect of the page: its measurement needs rounds), 2 for bad arguments or unreadable input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from perflab.record import verdicts  # noqa: E402


def _short(v) -> str:
    text = str(v)
    return text if len(text) <= 100 else text[:97] + "..."


def near_edges(a: dict, b: dict, edge: float) -> list[tuple[str, str, str]]:
    """Device-bound verdicts that agree between the two runs but whose measured spread lies
    within ``edge`` (relative to the band's edge) of an edge of its band in either run:
    ``[(page, claim, "A: true 0.8%, B: true 2.1%"), ...]``. Such a verdict has not flipped yet,
    and the next run may flip it: its band or its measurement needs work before then. Only
    claims that record their band (``band_lo``/``band_hi``) can be checked."""
    out = []
    for page in sorted(set(a.get("pages", {})) & set(b.get("pages", {}))):
        va = a["pages"][page].get("verdicts", {})
        vb = b["pages"][page].get("verdicts", {})
        for name in sorted(set(va) & set(vb)):
            ra, rb = va[name], vb[name]
            if ra.get("bound") != "device" or ra.get("verdict") != rb.get("verdict"):
                continue
            gaps = [_gap(r) for r in (ra, rb)]
            if any(g is not None and g < edge for g in gaps):
                said = ", ".join(f"{k}: {r['verdict']} " + ("-" if g is None else f"{g:.1%}")
                                 for k, r, g in (("A", ra, gaps[0]), ("B", rb, gaps[1])))
                out.append((page, name, said))
    return out


def _gap(record: dict) -> float | None:
    """The least distance between an end of the measured spread and an edge of the band,
    relative to that edge (None without a band or a spread)."""
    lo, hi = record.get("lo"), record.get("hi")
    edges = [e for e in (record.get("band_lo"), record.get("band_hi")) if e is not None]
    if lo is None or hi is None or not edges:
        return None
    return min(abs(x - e) / (abs(e) or 1.0) for e in edges for x in (lo, hi))


def one_run_only(a: dict, b: dict, page: str) -> list[tuple[str, str, str]]:
    """The claims of ``page`` whose verdict is stored in one of the two records only:
    ``(name, bound, "A: verdict, B: none")`` each, in name order."""
    va, vb = ({**(r["pages"].get(page) or {}).get("verdicts", {})} for r in (a, b))
    found = []
    for name in sorted(set(va) ^ set(vb)):
        rec = va.get(name) or vb.get(name)
        found.append((name, str(rec.get("bound")), f"A: {va[name]['verdict']}, B: none"
                      if name in va else f"A: none, B: {vb[name]['verdict']}"))
    return found


def report(a, b, moved: float, edge: float = 0.03) -> int:
    pages, only_a, only_b = verdicts.compare(a, b, moved)
    defects = host = apart = same = 0
    for p in pages:
        print(f"\n{p.page}: {p.agreeing} of {p.verdicts} verdicts agree; "
              f"{len(p.moved)} of {p.numbers} numbers moved > {moved:.0%}")
        if p.not_comparable:
            print(f"   not two runs of one source on one device: {p.not_comparable}; "
                  "its changed verdicts are listed, not counted as defects")
        for change, key, xa, xb in p.moved[:5]:
            print(f"   {key:44s} {xa:>12.5g} -> {xb:<12.5g} x{xb / xa:.3f}")
        for c in p.changes:
            tag = "host-bound" if not c.defect else "runs differ" if p.not_comparable else (
                "DEFECT (host-bound, predicted from the same host)" if c.same_host else
                "DEFECT" if c.bound else "DEFECT (bound not declared)")
            vals = (f" (measured {c.values[0]:.4g} -> {c.values[1]:.4g})"
                    if c.values and None not in c.values else "")
            print(f"   CHANGED [{tag}] {c.name}{vals}:\n      A: {_short(c.a)}\n"
                  f"      B: {_short(c.b)}")
            defects += c.defect and not p.not_comparable
            same += c.same_host and not p.not_comparable
            host += not c.defect
            apart += c.defect and bool(p.not_comparable)
        for c in p.texts:
            print(f"   text changed (no claim, not counted) {c.name}:\n      A: {_short(c.a)}\n"
                  f"      B: {_short(c.b)}")
        # a claim one run reached and the other did not (a branch that glued no verdict, e.g.
        # no clock reading in a window) is a changed verdict too, never "agree" by omission
        for name, bound, said in one_run_only(a, b, p.page):
            defect = bound != "host" and not p.not_comparable
            tag = "DEFECT" if defect else "host-bound" if bound == "host" else "runs differ"
            print(f"   ONE RUN ONLY [{tag}] {name}: {said}")
            defects += defect
            host += bound == "host"
            apart += bound != "host" and bool(p.not_comparable)
    for name in only_a:
        print(f"\n{name}: only in A")
    for name in only_b:
        print(f"\n{name}: only in B")
    near = near_edges(a, b, edge)
    if near:
        print(f"\nAgreeing device-bound verdicts within {edge:.0%} of a band's edge in either "
              "run (the next run may flip them):")
        for page, name, said in near:
            print(f"   {page}: {name} ({said})")
    print(f"\n{defects} verdict(s) changed that are not exempt (of them {same} host-bound "
          f"with a prediction from the same host); {host} exempt host-bound verdict(s) changed; "
          f"{apart} other(s) changed on pages whose runs differ in device or source; "
          f"{len(only_a) + len(only_b)} page(s) in one run only")
    return 1 if defects else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", help="two run records or run folders (A B)")
    ap.add_argument("--moved", type=float, default=0.10, help="relative change counted as moved")
    ap.add_argument("--edge", type=float, default=0.03,
                    help="list agreeing device-bound verdicts this close to a band's edge")
    ap.add_argument("--record", type=Path, help="write the run record of --root to this file")
    ap.add_argument("--root", type=Path, default=ROOT, help="folder holding book/ and labs/")
    ap.add_argument("--run", default=None, help="the run's name stored in the record")
    args = ap.parse_args(argv)
    try:
        if args.record:
            if args.runs:
                print("compare_runs.py: --record takes no runs to compare", file=sys.stderr)
                return 2
            # with --run, the pages of that run only (a page that failed in it keeps an
            # older notebook in the tree, which is not this run's)
            doc = verdicts.snapshot(args.root, run=args.run or args.record.stem,
                                    only_run=args.run is not None)
            args.record.parent.mkdir(parents=True, exist_ok=True)
            args.record.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
            gone = doc.get("left_out", {})
            print(f"{args.record}: {len(doc['pages'])} pages"
                  + (f"; left out, from other runs: {', '.join(sorted(gone))}" if gone else ""))
            return 0
        if len(args.runs) != 2:
            print("compare_runs.py: give two runs to compare (A B), or --record FILE",
                  file=sys.stderr)
            return 2
        if args.moved < 0 or args.edge < 0:
            print("compare_runs.py: --moved and --edge must be >= 0", file=sys.stderr)
            return 2
        a, b = (verdicts.load(r) for r in args.runs)
    except (OSError, ValueError) as err:
        print(f"compare_runs.py: {err}", file=sys.stderr)
        return 2
    return report(a, b, args.moved, args.edge)


if __name__ == "__main__":
    sys.exit(main())
