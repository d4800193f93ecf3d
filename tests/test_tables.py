"""perflab.record.tables: a table in one call, its numbers as a person writes them, each cell glued."""

import numpy as np
import pytest

from perflab.record import tables
from perflab.record.tables import Column

ROWS = [
    {"rung": "fp32 eager", "tokens_per_s": 44_512.0, "peak": 2.2e9, "speedup": 1.0, "same": True},
    {"rung": "bf16 + compile", "tokens_per_s": np.float64(510_525.3), "peak": None, "speedup": 11.47,
     "same": False},
]
COLUMNS = [Column("rung", "rung"), Column("tokens_per_s", "tokens/s", unit="tokens/s"),
           Column("peak", "peak memory", unit="iB"), Column("speedup", "vs baseline", unit="x"),
           Column("same", "same loss")]


def test_markdown_writes_every_number_with_fmt():
    text = tables.markdown(ROWS, COLUMNS)
    lines = text.splitlines()
    assert lines[0] == "| rung | tokens/s | peak memory | vs baseline | same loss |"
    assert lines[1] == "|---|---:|---:|---:|---|"
    assert lines[2] == "| fp32 eager | 44.5k tokens/s | 2.05 GiB | 1x | yes |"
    assert lines[3] == "| bf16 + compile | 511k tokens/s | – | 11.5x | no |"


@pytest.fixture
def shown(monkeypatch):
    import IPython.display

    glued, displayed = {}, []
    monkeypatch.setattr(tables, "glue", lambda name, value: glued.__setitem__(name, value))
    monkeypatch.setattr(IPython.display, "display", lambda obj: displayed.append(obj))
    return glued, displayed


def test_show_displays_once_glues_each_cell_and_returns_nothing(shown):
    glued, displayed = shown
    assert tables.show(ROWS, COLUMNS, glue_prefix="speed") is None
    assert len(displayed) == 1 and "511k tokens/s" in displayed[0].data
    assert glued["speed_fp32_eager_tokens_per_s"] == 44_512.0
    assert glued["speed_fp32_eager_tokens_per_s_text"] == "44.5k tokens/s"
    assert glued["speed_bf16_compile_speedup_text"] == "11.5x"
    assert "speed_bf16_compile_peak" not in glued                   # nothing measured, nothing glued
    assert glued["speed_fp32_eager_same_text"] == "yes" and "speed_fp32_eager_same" not in glued


def test_show_without_prefix_glues_nothing(shown):
    glued, displayed = shown
    tables.show([("a", 1.5)], [Column(0, "name"), Column(1, "time", unit="s")])
    assert not glued and "1.5 s" in displayed[0].data


@pytest.mark.parametrize("rows, columns, prefix, match", [
    (ROWS, [], None, "at least one column"),
    (ROWS, [Column("missing", "x")], None, "no column"),
    ([{"n": "a b"}, {"n": "a-b"}], [Column("n", "n")], "p", "share a name"),
    (ROWS, COLUMNS, "not an identifier", "identifier"),
])
def test_show_refuses_what_would_glue_wrongly(shown, rows, columns, prefix, match):
    with pytest.raises(ValueError, match=match):
        tables.show(rows, columns, glue_prefix=prefix)
