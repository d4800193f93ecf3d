"""perflab.core.formats: the one number-format table, and the modules that read it."""

import pytest
import torch

from perflab.machine import explorer
from perflab.core import formats
from perflab.machine import datasheets


def test_the_explorer_draws_the_one_table():
    assert explorer.PRECISIONS is formats.FORMATS


def test_every_datasheet_peak_has_a_format():
    for sheet in datasheets.DATASHEETS.values():
        for key in sheet:
            if key.endswith("_flops"):
                assert key[: -len("_flops")] in formats.FORMATS


def test_dtype_and_datasheet_key():
    assert formats.dtype("bf16") is torch.bfloat16 and formats.dtype("fp8") is None
    assert formats.FORMATS["tf32"].tf32 and formats.dtype("tf32") is torch.float32
    assert formats.datasheet_key("fp16") == "fp16_flops"
    with pytest.raises(ValueError, match="int4"):
        formats.datasheet_key("int4")
