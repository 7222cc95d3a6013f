"""A calibration table parsed once per content (core.tables.read_rows): each read returns its
own rows, and a file rewritten in place, even at the same size, is read anew."""
import pytest

from core.tables import TableError, read_rows

COLS = ("mode", "B", "us")


def test_a_rewritten_table_is_read_anew_and_rows_are_the_callers_own(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("mode,B,us\ngraph,1,2.5\ngraph,2,3.5\n")
    first = read_rows(path, COLS)
    assert first == [{"mode": "graph", "B": 1, "us": 2.5}, {"mode": "graph", "B": 2, "us": 3.5}]
    first[0]["us"] = 99.0
    assert read_rows(path, COLS)[0]["us"] == 2.5  # a caller's edit does not reach the next read
    path.write_text("mode,B,us\ngraph,1,7.5\ngraph,2,3.5\n")  # same size, within the same clock tick
    assert read_rows(path, COLS)[0]["us"] == 7.5


def test_a_missing_column_is_named_on_every_read(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("mode,B,us\ngraph,1,2.5\n")
    read_rows(path, ("mode", "B"))
    for _ in range(2):
        with pytest.raises(TableError, match=r"missing columns \['ctx'\]"):
            read_rows(path, ("mode", "B", "ctx"))
