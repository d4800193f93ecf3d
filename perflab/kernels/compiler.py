"""Looking inside ``torch.compile``: graph breaks, recompilations, and the graphs of each stage.

``torch.compile`` has three stages (Ansel et al., ASPLOS 2024): TorchDynamo captures Python
bytecode into FX graphs (breaking the graph where it cannot trace), AOTAutograd traces the
forward and backward together into a joint graph and partitions it (its min-cut partitioner
chooses what the forward saves and what the backward recomputes), and Inductor generates
kernels (Triton on a GPU, C++/OpenMP on a CPU).

* :func:`graph_breaks`: ``torch._dynamo.explain`` summarized: graphs, breaks and their reasons.
* :class:`CountingBackend` / :func:`dynamo_graphs`: a backend that records each FX graph Dynamo
  hands it (and so counts compilations and recompilations) and runs it eagerly.
* :func:`recompile_limit`: the limit after which Dynamo stops recompiling a function and runs
  it eagerly; ``torch._dynamo.config.recompile_limit`` (older torch: ``cache_size_limit``).
* :func:`aot_graphs`: AOTAutograd's forward and backward graphs under the default or the
  min-cut partitioner, and what the forward saves for the backward.
* :func:`inductor_code`: the source Inductor generated for a function.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from functorch.compile import (aot_function, default_partition, make_boxed_func,
                               min_cut_rematerialization_partition)
from torch._inductor.utils import run_and_get_code

from perflab.core.validate import number, one_of

__all__ = ["aot_graphs", "AotGraphs", "CountingBackend", "dynamo_graphs", "graph_breaks",
           "GraphBreaks", "inductor_code", "recompile_limit", "recompile_limit_name"]


def recompile_limit_name() -> str:
    """The name of Dynamo's recompile limit in this torch: ``"recompile_limit"`` or ``"cache_size_limit"``."""
    config = torch._dynamo.config
    return "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"


@contextlib.contextmanager
def recompile_limit(limit: int | None = None) -> Iterator[int]:
    """Yield Dynamo's recompile limit; with ``limit``, set it for the block and restore it after.

    After ``limit`` compiled versions of one function (one per distinct guard failure: a new
    shape, a new Python constant), Dynamo stops compiling it and runs it eagerly, logging a
    warning once.

    Raises:
        ValueError: ``limit`` below 1.
    """
    config = torch._dynamo.config
    name = recompile_limit_name()
    before = getattr(config, name)
    if limit is not None:
        number("limit", limit, minimum=1)
        setattr(config, name, limit)
    try:
        yield getattr(config, name)
    finally:
        setattr(config, name, before)


@dataclass(frozen=True)
class GraphBreaks:
    """``torch._dynamo.explain`` in brief.

    Attributes:
        graphs: FX graphs captured for one call.
        breaks: graph breaks: the larger of explain's count and the number of reasons (a
            break before any traced operation leaves no graph, so it is not counted there).
        reasons: one line per break: the reason, and the user code line where it happened.
    """

    graphs: int
    breaks: int
    reasons: tuple[str, ...]


def graph_breaks(fn: Callable, *args, **kwargs) -> GraphBreaks:
    """Run ``torch._dynamo.explain(fn)(*args, **kwargs)`` and summarize it.

    Dynamo state is reset first, so earlier compilations of ``fn`` do not hide anything.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")

    torch._dynamo.reset()
    log = logging.getLogger("torch._dynamo")
    level = log.level
    log.setLevel(logging.ERROR)   # Dynamo also logs each break as a warning; explain reports it
    try:
        out = torch._dynamo.explain(fn)(*args, **kwargs)
    finally:
        log.setLevel(level)
    reasons = []
    for br in out.break_reasons:
        where = ""
        if br.user_stack:
            frame = br.user_stack[-1]
            where = f" (line {frame.lineno}: {(frame.line or '').strip()})"
        reasons.append(str(br.reason).strip().splitlines()[0] + where)
    # a break before the first traced operation leaves no graph behind it, and explain's
    # graph_break_count then misses it; its reason is still listed
    return GraphBreaks(out.graph_count, max(out.graph_break_count, len(reasons)), tuple(reasons))


@dataclass
class CountingBackend:
    """A ``torch.compile`` backend that records every FX graph it is given and runs it eagerly.

    ``len(backend.graphs)`` counts compilations (first compile plus recompiles plus one per
    graph-break piece); ``backend.graphs[i].code`` is the Python of graph ``i``. Costs no code
    generation, so it is quick even on a CPU.
    """

    graphs: list = field(default_factory=list)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs) -> Callable:
        self.graphs.append(gm)
        return gm.forward

    @property
    def count(self) -> int:
        """Number of graphs compiled so far."""
        return len(self.graphs)


def dynamo_graphs(fn: Callable, *args, **kwargs) -> list[str]:
    """The Python source of each FX graph Dynamo captures from one call of ``fn``.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    torch._dynamo.reset()
    backend = CountingBackend()
    torch.compile(fn, backend=backend)(*args, **kwargs)
    return [gm.code.strip() for gm in backend.graphs]


@dataclass(frozen=True)
class AotGraphs:
    """AOTAutograd's partition of one function's joint forward+backward graph.

    Attributes:
        forward, backward: Python source of the two graphs.
        saved: ``(shape, dtype)`` of each tensor the forward passes to the backward (inputs the
            backward needs included).
        saved_bytes: bytes of those tensors.
    """

    forward: str
    backward: str
    saved: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    saved_bytes: int


def aot_graphs(fn: Callable, *args, partition: str = "min_cut") -> AotGraphs:
    """Trace ``fn(*args)`` with AOTAutograd and return its forward and backward graphs.

    ``partition="default"`` saves what eager autograd would (every intermediate the backward
    reads); ``"min_cut"`` (what ``torch.compile`` uses) solves a min-cut over the joint graph
    so the forward saves as few bytes as possible, recomputing cheap (fusible, pointwise)
    operations in the backward instead. ``fn`` must return one tensor; tensor arguments that
    need gradients must have ``requires_grad=True``.

    Raises:
        ValueError: unknown ``partition``.
    """

    one_of("partition", partition, ("min_cut", "default"))
    seen: dict[str, torch.fx.GraphModule] = {}

    def compiler(kind):
        def compile_graph(gm, example_inputs):
            seen[kind] = gm
            return make_boxed_func(gm.forward)
        return compile_graph

    partition_fn = min_cut_rematerialization_partition if partition == "min_cut" else default_partition
    compiled = aot_function(fn, fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                            partition_fn=partition_fn)
    out = compiled(*args)
    out.sum().backward()
    fw = seen["forward"]
    outputs = next(n for n in fw.graph.nodes if n.op == "output").args[0]
    n_user = 1
    saved = []
    nbytes = 0
    for node in list(outputs)[n_user:]:
        val = node.meta.get("val") if hasattr(node, "meta") else None
        if isinstance(val, torch.Tensor):
            saved.append((tuple(val.shape), val.dtype))
            nbytes += val.numel() * val.element_size()
    return AotGraphs(fw.code.strip(), seen["backward"].code.strip(), tuple(saved), nbytes)


def inductor_code(fn: Callable, *args) -> str:
    """The source Inductor generates for ``fn(*args)`` (Triton kernels on a GPU, C++ on a CPU).

    Uses ``torch._inductor.utils.run_and_get_code``; Dynamo is reset first, so the function is
    compiled afresh (on a CPU that takes seconds).

    Raises:
        TypeError: ``fn`` is not callable.
    """

    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    torch._dynamo.reset()
    _, codes = run_and_get_code(torch.compile(fn), *args)
    return "\n".join(codes)
