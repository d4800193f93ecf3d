"""Stand-ins for a GPU on a CPU, for lab checks: run a student's function as if on a GPU.

On a CPU the notebook's device is the host, and some mistakes a GPU would show (a value copied
off the device, a timer that does not wait for a queue) cannot show. A check then runs the
student's function on a stand-in (the ``meta`` device, a queue that runs its work only when
synchronized: :mod:`perflab.labs.lab04`, :mod:`perflab.labs.lab06`), and the notebook's names
for "the device" must name the stand-in too.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

__all__ = ["stand_in_device"]


@contextlib.contextmanager
def stand_in_device(fn: Callable[..., Any], stand_in: torch.device | str,
                    replaced: torch.device | str = "cpu") -> Iterator[torch.device]:
    """For the duration of the block, the names of ``fn``'s module (its ``__globals__``: a
    notebook's, for a function defined in a cell) bound to a device of ``replaced``'s type (the
    CPU by default; the notebook's own device, a GPU's too, where the check stands in for it
    with ``meta``) are bound to ``stand_in`` instead, and put back after it.

    A check that runs a student's function on a stand-in for a GPU (the ``meta`` device, or a
    queue that a CPU does not have) uses it so that code written for "the device", as the
    notebook's ``dev`` names it, follows the stand-in as it would follow a GPU: on a CPU the
    notebook's device is the host, and the check could not tell the two apart.
    """
    new = torch.device(stand_in)
    names = getattr(fn, "__globals__", {})
    host = {k: v for k, v in list(names.items())
            if isinstance(v, torch.device) and v.type == torch.device(replaced).type}
    for k in host:
        names[k] = new
    try:
        yield new
    finally:
        names.update(host)
