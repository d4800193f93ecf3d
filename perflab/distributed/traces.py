"""Overlap of communication with computation, read from a profiler trace as intervals of time.

How much of a collective ran while the backward pass was computing is a question about *when*
things ran, so it is answered from the trace of the step itself (``torch.profiler``'s Chrome
trace), not from the difference of two timed steps: the intervals of the communication and those
of the computation are merged into unions, and their intersection is the overlap (the one
interval toolkit, :mod:`perflab.core.profiler`).

* GPU traces: communication = kernels (``cat == "kernel"``) whose name contains ``nccl``;
  computation = every other kernel.
* CPU traces (gloo ranks): communication = gloo's ``gloo:<op>`` events, which gloo's own worker
  threads record while they move the bytes; computation = the backward pass's
  ``autograd::engine::evaluate_function`` ops on the rank's main thread.
"""

from __future__ import annotations

from perflab.core.profiler import intersection_length, union

__all__ = ["arrival_skew", "collective_starts", "overlap_from_trace", "ranges_from_trace"]


def overlap_from_trace(trace: dict) -> dict:
    """How much communication ran while computation ran, in one Chrome trace
    (``prof.export_chrome_trace``; module docstring for what counts as which).

    Returns:
        dict with ``source`` (``"gpu kernels"`` or ``"cpu ops"``); ``comm_s`` and ``compute_s``
        (lengths of the unions, seconds); ``overlap_s`` (their intersection);
        ``overlap_fraction`` (``overlap_s / comm_s``, None without communication);
        ``comm_ops`` (how many events of each communication name: ``{"gloo:all_gather": 16}``);
        ``compute_end_s`` and ``comm_end_s`` (when the last computation and the last
        communication ended); ``exposed_s`` (``max(0, comm_end_s - compute_end_s)``: the
        communication the step still waited for after its last computation); ``span_s``;
        ``t0_host_s`` (the first event counted, on the host's clock: the trace's
        ``baseTimeNanoseconds`` added, so that several processes' times compare);
        and ``comm`` / ``compute``: the merged intervals, seconds from the first event counted.

    Raises:
        ValueError: ``trace`` has no ``traceEvents`` list.
    """
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise ValueError("trace must be a Chrome trace dict with a 'traceEvents' list")
    timed = [e for e in events if isinstance(e, dict) and "ts" in e and "dur" in e]
    kernels = [e for e in timed if e.get("cat") == "kernel"]
    if kernels:
        source = "gpu kernels"
        comm = [e for e in kernels if "nccl" in e.get("name", "").lower()]
        comp = [e for e in kernels if "nccl" not in e.get("name", "").lower()]
    else:
        source = "cpu ops"
        comm = [e for e in timed if e.get("name", "").startswith("gloo:")]
        comp = [e for e in timed if e.get("cat") == "cpu_op"
                and e.get("name", "").startswith("autograd::engine::evaluate_function")]
    t0 = min((float(e["ts"]) for e in comm + comp), default=0.0)

    def merged(evs):
        return [list(i) for i in union([((float(e["ts"]) - t0) * 1e-6,
                                         (float(e["ts"]) + float(e["dur"]) - t0) * 1e-6) for e in evs])]

    c, k = merged(comm), merged(comp)
    comm_s, overlap = sum(b - a for a, b in c), intersection_length(c, k)
    comm_end = c[-1][1] if c else 0.0
    compute_end = k[-1][1] if k else 0.0
    ops: dict[str, int] = {}
    for e in comm:
        ops[e.get("name", "")] = ops.get(e.get("name", ""), 0) + 1
    return {"source": source, "comm_s": comm_s, "compute_s": sum(b - a for a, b in k), "overlap_s": overlap,
            "comm_ops": ops,
            "overlap_fraction": overlap / comm_s if comm_s > 0 else None,
            "compute_end_s": compute_end, "comm_end_s": comm_end,
            "exposed_s": max(0.0, comm_end - compute_end) if c else 0.0,
            "span_s": max(comm_end, compute_end), "comm": c, "compute": k,
            "t0_host_s": float(trace.get("baseTimeNanoseconds", 0)) * 1e-9 + t0 * 1e-6}


def _ranges(trace: dict, prefix: str) -> list[dict]:
    """The complete events (``ph`` "X", with a ``ts``) of a Chrome trace whose name starts
    with ``prefix``; raises ValueError for a trace without a ``traceEvents`` list or an empty
    ``prefix``."""
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise ValueError("trace must be a Chrome trace dict with a 'traceEvents' list")
    if not prefix:
        raise ValueError("prefix must be a non-empty string")
    return [e for e in events if isinstance(e, dict) and "ts" in e and e.get("ph", "X") == "X"
            and str(e.get("name", "")).startswith(prefix)]


def ranges_from_trace(trace: dict, prefix: str) -> dict:
    """The time a step spent inside the ranges (``record_function`` events) whose name starts
    with ``prefix``, in one Chrome trace: FSDP2's hooks (``"FSDP::"``: the all-gathers, their
    copy-in and copy-out, the reduce-scatters, resharding), the optimizer's step
    (``"Optimizer.step#"``), or one collective (``"gloo:all_gather"``).

    A name's text from `` (`` on (FSDP2 appends the module, ``FSDP::pre_forward (0)``) is left
    out, so that the ranges of every block add up under one name.

    Returns:
        dict with ``seconds`` (the length of the union of all such ranges: nested ranges, such as
        the all-gather inside FSDP's pre-forward, count once); ``count`` (how many ranges); and
        ``by_name``: ``{name: {"count": n, "seconds": total of their durations}}`` (nested
        ranges count in their own names too).

    Raises:
        ValueError: ``trace`` has no ``traceEvents`` list, or an empty ``prefix``.
    """
    hits = [e for e in _ranges(trace, prefix) if "dur" in e]
    by_name: dict[str, dict] = {}
    for e in hits:
        name = str(e["name"]).split(" (", 1)[0]
        entry = by_name.setdefault(name, {"count": 0, "seconds": 0.0})
        entry["count"] += 1
        entry["seconds"] += float(e["dur"]) * 1e-6
    spans = union([(float(e["ts"]) * 1e-6, (float(e["ts"]) + float(e["dur"])) * 1e-6) for e in hits])
    return {"seconds": sum(b - a for a, b in spans), "count": len(hits), "by_name": by_name}


def collective_starts(trace: dict, prefix: str = "gloo:", ends: bool = False) -> list[tuple]:
    """``[(name, start in seconds on the host's clock)]`` of every range whose name starts with
    ``prefix`` (gloo's collectives), in order of start; with ``ends``, ``(name, start, end)``.
    The trace's ``baseTimeNanoseconds`` is added to each event's ``ts``, so that the traces of
    several processes on one host share a clock (:func:`arrival_skew`).

    Raises:
        ValueError: ``trace`` has no ``traceEvents`` list, or an empty ``prefix``.
    """
    base = float(trace.get("baseTimeNanoseconds", 0)) * 1e-9
    hits = [(str(e["name"]), base + float(e["ts"]) * 1e-6)
            + ((base + (float(e["ts"]) + float(e.get("dur", 0.0))) * 1e-6,) if ends else ())
            for e in _ranges(trace, prefix)]
    return sorted(hits, key=lambda h: h[1])


def arrival_skew(per_rank: list) -> dict:
    """How long a step's synchronous collectives waited for their last rank: for the k-th
    collective of every rank (:func:`collective_starts`, one list per rank, on one host's
    clock), the latest start minus the earliest. A collective cannot finish before its last
    rank arrives, so the first to arrive spends that skew inside it, counted as communication.

    With every collective's end too (``collective_starts(..., ends=True)``), where the lateness
    came from: the k-th skew is exactly the late rank's exit from collective k-1 minus the early
    rank's (``left_apart_s``, summed) plus the late rank's time between the two collectives
    minus the early rank's (``between_s``: it worked longer in between), the first collective's
    skew apart (``first_s``: the ranks began the step apart); and ``late_by_rank``, how many
    collectives each rank arrived at last (one rank late at most of them is a slower rank, not
    chance); and ``all_in_s``, the length of the union of the intervals from each collective's
    last arrival to its first end: the time the collectives ran with every rank in them, their
    own time net of any wait for a rank (asynchronous collectives queue and overlap, so their
    summed skews can exceed the time they span: a difference would count the overlap twice).

    Returns:
        dict with ``count`` (collectives matched: the fewest any rank ran), ``skew_s`` (the sum
        of their skews), ``median_skew_s``, ``same_order`` (every rank ran the same names in
        the same order; when False the pairs are not one collective and the sum means nothing),
        and with ends ``first_s``, ``left_apart_s``, ``between_s`` (seconds; the three add up
        to ``skew_s``), ``late_by_rank`` (a count per rank) and ``all_in_s``.

    Raises:
        ValueError: fewer than two ranks.
    """
    if len(per_rank) < 2:
        raise ValueError(f"need the collectives of at least 2 ranks, got {len(per_rank)}")
    n = min(len(r) for r in per_rank)
    skews = [max(r[k][1] for r in per_rank) - min(r[k][1] for r in per_rank) for k in range(n)]
    same = all(len(r) == n for r in per_rank) and all(
        len({r[k][0] for r in per_rank}) == 1 for k in range(n))
    ordered = sorted(skews)
    median = (ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2) if n else 0.0
    out = {"count": n, "skew_s": sum(skews), "median_skew_s": median, "same_order": same}
    if n and all(len(e) >= 3 for r in per_rank for e in r[:n]):
        late_by_rank, left, between = [0] * len(per_rank), 0.0, 0.0
        for k in range(n):
            starts = [r[k][1] for r in per_rank]
            late = max(range(len(per_rank)), key=starts.__getitem__)
            early = min(range(len(per_rank)), key=starts.__getitem__)
            late_by_rank[late] += 1
            if k:
                exits = [r[k - 1][2] for r in per_rank]
                left += exits[late] - exits[early]
                between += (starts[late] - exits[late]) - (starts[early] - exits[early])
        spans = [(max(r[k][1] for r in per_rank), min(r[k][2] for r in per_rank))
                 for k in range(n)]
        all_in = sum(b - a for a, b in union([(a, b) for a, b in spans if b > a]))
        out.update(first_s=skews[0], left_apart_s=left, between_s=between,
                   late_by_rank=late_by_rank, all_in_s=all_in)
    return out
