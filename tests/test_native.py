"""perflab.core.native: C++ warnings on descriptor 2, captured rather than left in an output."""

import os

import pytest

from perflab.core.native import NativeStderr


def test_a_cpp_warning_line_is_captured_and_parsed_and_the_descriptor_restored():
    line = ("[W1205 04:18:35.775383316 sdp_utils_cpp.h:91] Warning: Expected query, key and "
            "value to all be of dtype: {Half, BFloat16}. (function check_tensor_dtype)\n")
    before = os.fstat(2)
    with NativeStderr() as err:
        os.write(2, line.encode())
        os.write(2, b"plain text\n")
    assert err.warnings == ["Expected query, key and value to all be of dtype: {Half, BFloat16}."]
    assert "plain text" in err.text
    after = os.fstat(2)
    assert (before.st_ino, before.st_dev) == (after.st_ino, after.st_dev)


def test_the_descriptor_comes_back_when_the_block_raises():
    before = os.fstat(2)
    with pytest.raises(ValueError):
        with NativeStderr():
            raise ValueError("inside")
    assert os.fstat(2).st_ino == before.st_ino
