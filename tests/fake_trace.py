"""Fake Chrome-trace events, as torch.profiler exports them, for the tests of
perflab.core.profiler and perflab.profiling.trace."""


def kernel_event(name, ts, dur, ext, bps=2.0):
    """A GPU kernel launched by the operator whose External id is ``ext`` (times in us)."""
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7,
            "args": {"External id": ext, "correlation": ext + 1000, "stream": 7, "blocks per SM": bps}}


def op_event(name, ts, dur, ext, dims, types):
    """An ATen operator on the host with its input shapes and dtypes (times in us)."""
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1,
            "args": {"External id": ext, "Input Dims": dims, "Input type": types}}
