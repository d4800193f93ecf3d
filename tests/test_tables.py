"""perflab.record.tables: a table in one call, its numbers as a person writes them, each cell glued."""

from dataclasses import dataclass

import numpy as np
import pytest
import torch

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


def test_text_table_checks_its_shape():
    assert tables.text_table(["a", "b"], [[1, 2]]) == "| a | b |\n|:---|---:|\n| 1 | 2 |"
    with pytest.raises(ValueError, match="row 0"):
        tables.text_table(["a", "b"], [[1]])
    with pytest.raises(ValueError, match="align"):
        tables.text_table(["a"], [[1]], align="c")


@dataclass
class _Result:
    rung: str
    step_s: float
    mfu: float | None
    losses: list


def test_glue_many_glues_each_field_and_the_text_of_those_with_a_unit(shown):
    glued, displayed = shown
    out = tables.glue_many("gpt2_plain", {"step_s": np.float64(0.0123), "mfu": torch.tensor(0.532),
                                          "rung": "fused AdamW", "same": True, "peak": None},
                           units={"step_s": "s", "mfu": "%"})
    assert out is None and displayed == []
    assert glued == {"gpt2_plain_step_s": 0.0123, "gpt2_plain_step_s_text": "12.3 ms",
                     "gpt2_plain_mfu": pytest.approx(0.532), "gpt2_plain_mfu_text": "53.2 %",
                     "gpt2_plain_rung": "fused AdamW", "gpt2_plain_same": True}
    assert type(glued["gpt2_plain_step_s"]) is float and type(glued["gpt2_plain_mfu"]) is float


def test_glue_many_reads_a_dataclass_and_refuses_what_it_cannot_glue(shown):
    glued, _ = shown
    with pytest.raises(ValueError, match="losses"):
        tables.glue_many("run", _Result("eager", 0.5, None, [1.0, 0.9]))
    assert glued == {}                                  # checked first: nothing half glued
    glued.clear()
    tables.glue_many("run", {"rung": "eager", "step s": 0.5}, units={"step s": "s"})
    assert glued == {"run_rung": "eager", "run_step_s": 0.5, "run_step_s_text": "500 ms"}


@pytest.mark.parametrize("prefix, values, units, match", [
    ("not a name", {"a": 1}, None, "prefix"),
    ("p", [1, 2], None, "mapping"),
    ("p", {"a": 1}, {"b": "s"}, "lacks"),
    ("p", {"a b": 1, "a_b": 2}, None, "share a name"),
    ("p", {"a": "text"}, {"a": "s"}, "not a number"),
    ("p", {"a": np.ones(3)}, None, "ndarray"),
    ("p", {"a": 1.0, "b": float("nan")}, None, "failed"),
])
def test_glue_many_refuses_what_would_glue_wrongly(shown, prefix, values, units, match):
    with pytest.raises(ValueError, match=match):
        tables.glue_many(prefix, values, units)
    assert shown[0] == {}


def test_glue_table_glues_the_text_table_once(shown):
    glued, displayed = shown
    table = tables.glue_table("ladder_table", ["rung", "tokens/s"], [["eager", "44.5k"]])
    assert list(glued) == ["ladder_table"] and glued["ladder_table"] is table
    assert table.data == "| rung | tokens/s |\n|:---|---:|\n| eager | 44.5k |"


def test_a_number_without_a_unit_is_never_written_as_a_person_would_not():
    col = Column("v", "value")
    assert col.text(3) == "3" and col.text(12.5) == "12.5" and col.text("1.32e-05") == "1.32e-05"
    assert col.text(1.32e-05) == "1.32 × 10⁻⁵"           # str(): 1.32e-05
    assert col.text(0.123456789) == "0.123"              # str(): more digits than measured
    assert col.text(1e16) == "1 × 10¹⁶"                  # str(): 1e+16
