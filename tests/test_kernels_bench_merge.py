"""bench --merge: a later run's rows replace the same cases of the committed table, the rest stay, each row
names its run and the provenance keeps one part per run."""
import csv
import json

from policies.kernels import bench

COLS = ["model", "policy", "B", "T", "tree", "depth", "replayed_tokens", "flush", "mode", "verify_us", "commit_us"]


def write(path, rows, cols, prov):
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    path.with_name(f"{path.stem}_provenance.json").write_text(json.dumps(prov))


def row(policy, B, us, **extra):
    return {"model": "m", "policy": policy, "B": B, "T": 4, "tree": "1,1,1", "depth": 3, "replayed_tokens": 0,
            "flush": 1, "mode": "graph", "verify_us": us, "commit_us": 1.0, **extra}


def test_merge_replaces_same_key_keeps_the_rest(tmp_path):
    (tmp_path / "new").mkdir()
    write(tmp_path / "kernels.csv", [row("reconstruct", 1, 30.5), row("reconstruct", 128, 861.0)], COLS,
          {"gpu": "G", "nvidia_smi": "G, 580.1, 1 MiB", "date": "d1", "git_commit": "a", "command": "c1",
           "wall_s": 10.0})
    write(tmp_path / "new" / "kernels.csv",
          [row("reconstruct", 1, 7.1, state_dtype="float32"), row("reconstruct", 1, 6.8, state_dtype="bfloat16")],
          COLS + ["state_dtype"], {"gpu": "G", "nvidia_smi": "G, 580.1, 1 MiB", "date": "d3", "git_commit": "b",
                                   "command": "c3", "wall_s": 5.0})
    assert bench.main(["--out", str(tmp_path), "--merge", str(tmp_path / "new" / "kernels.csv"),
                       "--merge-run", "run3"]) == 0
    rows = list(csv.DictReader((tmp_path / "kernels.csv").open()))
    got = {(r["B"], r["state_dtype"]): (r["verify_us"], r["run"]) for r in rows}
    assert got == {("1", "float32"): ("7.1", "run3"), ("128", "float32"): ("861.0", "run1"),
                   ("1", "bfloat16"): ("6.8", "run3")}
    prov = json.loads((tmp_path / "kernels_provenance.json").read_text())
    assert [(p["run"], p["rows"], p["git_commit"], p["driver"]) for p in prov["parts"]] == \
        [("run1", 1, "a", "580.1"), ("run3", 2, "b", "580.1")]
    assert prov["merge"]["history"][0]["replaced"] == 1 and prov["merge"]["history"][0]["added"] == 1
