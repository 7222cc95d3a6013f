"""`specsim calibrate merge`'s row rules: a table's rows of modes (layer tables) or ops (host
tables) that the merged run did not measure stay; everything it measured is replaced."""
import csv

import pytest

from calibrate.cli import _merge_csv


def _write(path, rows):
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _read(path):
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_layer_rows_of_modes_not_measured_stay(tmp_path):
    old, new = tmp_path / "old.csv", tmp_path / "new.csv"
    _write(old, [{"tokens": 1, "mode": "graph", "us": 5}, {"tokens": 1, "mode": "eager", "us": 9}])
    _write(new, [{"tokens": 1, "mode": "graph", "us": 4}])
    assert _merge_csv(new, old, {"graph"}) == ("mode", ["eager"])
    assert [(r["mode"], r["us"]) for r in _read(old)] == [("graph", "4"), ("eager", "9")]


def test_host_rows_of_ops_not_measured_stay(tmp_path):
    old, new = tmp_path / "host.csv", tmp_path / "new.csv"
    _write(old, [{"op": "gdn_prefill", "n": 1, "us": 1350}, {"op": "full_graph", "n": 4, "us": 30},
                 {"op": "gdn_prefill", "n": 2, "us": 1300}])
    _write(new, [{"op": "gdn_prefill", "n": 1, "us": 1028}])
    assert _merge_csv(new, old, set()) == ("op", ["full_graph"])
    # every old row of a measured op goes, even at sizes the new run did not reach
    assert [(r["op"], r["n"], r["us"]) for r in _read(old)] == [("gdn_prefill", "1", "1028"), ("full_graph", "4", "30")]


def test_a_table_with_neither_is_replaced_whole(tmp_path):
    old, new = tmp_path / "old.csv", tmp_path / "new.csv"
    _write(old, [{"tokens": 1, "us": 5}, {"tokens": 2, "us": 6}])
    _write(new, [{"tokens": 1, "us": 4}])
    assert _merge_csv(new, old, {"graph"}) == ("", [])
    assert [r["us"] for r in _read(old)] == ["4"]


def test_faster_of_keeps_each_shape_from_the_faster_stand_in():
    from calibrate.tables.merge_faster import faster_rows
    cur = [{"mode": "graph", "B": "1", "P": "4", "ctx": "4096", "us": "95.6"},
           {"mode": "graph", "B": "64", "P": "4", "ctx": "4096", "us": "135.7"},
           {"mode": "eager", "B": "1", "P": "4", "ctx": "4096", "us": "300"}]
    new = [{"mode": "graph", "B": "1", "P": "4", "ctx": "4096.0", "us": "21.5"},
           {"mode": "graph", "B": "64", "P": "4", "ctx": "4096", "us": "168.3"}]
    rows, taken = faster_rows("attn_decode", cur, new, {"graph"}, "fa4", "triton")
    assert taken == 1
    assert [(r["us"], r.get("kernel")) for r in rows] == [("21.5", "triton"), ("135.7", "fa4"), ("300", None)]
    # a second merge keeps each row's own label
    again, _ = faster_rows("attn_decode", rows, cur[:2], {"graph"}, "x", "fa4")
    assert [r.get("kernel") for r in again] == ["triton", "fa4", None]


def test_faster_of_refuses_runs_on_different_grids():
    from calibrate.tables.merge_faster import faster_rows
    from core.errors import ConfigError
    cur = [{"mode": "graph", "tokens": "128", "ctx": "0", "us": "5"}]
    new = [{"mode": "graph", "tokens": "256", "ctx": "0", "us": "4"}]
    with pytest.raises(ConfigError, match="grids differ"):
        faster_rows("attn_prefill", cur, new, {"graph"}, "a", "b")
