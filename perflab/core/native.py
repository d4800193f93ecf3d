"""What C++ code inside torch writes to the process's standard error (file descriptor 2).

Some of torch's diagnostics are C++ warnings (``TORCH_WARN``) printed on descriptor 2, not
Python warnings: ``torch.backends.cuda.can_use_flash_attention(params, debug=True)`` in torch
2.11 says why the flash kernel is refused that way ("[W... sdp_utils_cpp.h:91] Warning: Expected
query, key and value to all be of dtype ..."). ``warnings.catch_warnings`` does not see them, and
in a notebook they land in the output as stderr. :class:`NativeStderr` captures them instead.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

__all__ = ["NativeStderr"]

_WARNING = re.compile(r"\[W[^\]]*\]\s*Warning:\s*(?P<text>.*?)(?:\s*\(function \w+\))?\s*$")


class NativeStderr:
    """Capture descriptor 2 while the ``with`` block runs; restored on exit, also on an error.

    Attributes after the block: ``text`` (everything written, str) and ``warnings`` (the
    message of each C++ warning line, without its ``[W...]`` prefix and ``(function ...)``
    suffix, in order). Python's ``sys.stderr`` is flushed first; what it writes during the
    block is captured too where it goes to descriptor 2.

    Example::

        with NativeStderr() as err:
            ok = can_use_flash_attention(params, True)
        err.warnings   # ['Expected query, key and value to all be of dtype: ...']
    """

    def __init__(self) -> None:
        self.text = ""
        self.warnings: list[str] = []

    def __enter__(self) -> "NativeStderr":
        sys.stderr.flush()
        self._file = tempfile.TemporaryFile(mode="w+b")
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc) -> bool:
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.seek(0)
        self.text = self._file.read().decode(errors="replace")
        self._file.close()
        self.warnings = [m.group("text") for line in self.text.splitlines()
                         if (m := _WARNING.search(line))]
        return False
