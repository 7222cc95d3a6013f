"""`specsim calibrate merge`'s row rules: a table's rows of modes (layer tables) or ops (host
tables) that the merged run did not measure stay; everything it measured is replaced."""
import csv

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
