"""bench --merge: a later run's rows replace the same cases of the committed table, the rest stay, each row
names its run and the provenance keeps one part per run."""
import csv
import json

import pytest

from policies.kernels import bench
from policies.kernels.bench_cases import Case, cases, policy_bytes
from policies.kernels.inputs import chain, full

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


VCOLS = ["variant", "tuning", "check", "policy", "model", "B", "T", "tree", "verify_us", "commit_us", "total_us",
         "bytes", "pct_of_copy_bw", "state_dtype"]


def vrow(variant, policy, B, T, tree, us):
    c = Case("qwen3.5-35b-a3b", 16, 32, B, tree, tuple(chain(T)) if tree == "chain"
                   else tuple(full(tuple(int(w) for w in tree.split(",")))))
    vb, cb = policy_bytes(c, policy, 0, True)
    return {"variant": variant, "tuning": f"t-{variant}", "check": 1e-4, "policy": policy, "model": c.model, "B": B,
            "T": T, "tree": tree, "verify_us": us, "commit_us": 2.0, "total_us": us + 2.0, "bytes": vb + cb,
            "pct_of_copy_bw": 40.0, "state_dtype": "float32"}


def test_merge_variants_converts_one_tuning_and_keeps_protected_runs(tmp_path):
    m = "qwen3.5-35b-a3b"
    old = [dict(row("reconstruct", 128, 861.0), model=m, run="run1", state_dtype="float32"),
           dict(row("reconstruct", 1, 7.1), model=m, run="run3", state_dtype="float32"),
           dict(row("reconstruct", 128, 900.0), model=m, mode="eager", run="run1", state_dtype="float32")]
    write(tmp_path / "kernels.csv", old, COLS + ["state_dtype", "run"],
          {"parts": [{"run": "run1", "rows": 2}, {"run": "run3", "rows": 1}], "merge": {"history": []}})
    (tmp_path / "v").mkdir()
    vfile = tmp_path / "v" / "kernels_variants.csv"
    write(vfile, [vrow("pp", "reconstruct", 128, 4, "1,1,1", 231.9), vrow("default", "reconstruct", 128, 4, "1,1,1", 714.5),
                  vrow("pp", "reconstruct_deferred", 64, 16, "chain", 310.7)], VCOLS,
          {"parts": [{"run": "variants1", "device_time_s": 374}],
           "source_provenance": {"gpu": "G", "nvidia_smi": "G, 580.1, 1 MiB", "git_commit": "a0853f5", "command": "cv",
                                 "dot_precision": "tf32x3"}})
    args = ["--out", str(tmp_path), "--merge-variants", str(vfile), "--variant", "pp", "--merge-run", "variants1-pp"]
    assert bench.main(args + ["--merge-keep-run", "run1"]) == 2  # would replace a run1 row: refused, nothing written
    assert len(list(csv.DictReader((tmp_path / "kernels.csv").open()))) == 3
    assert bench.main(args + ["--merge-keep-run", "run3"]) == 0
    rows = list(csv.DictReader((tmp_path / "kernels.csv").open()))
    got = {(r["policy"], r["B"], r["T"], r["mode"]): r for r in rows}
    assert {k: r["run"] for k, r in got.items()} == {
        ("reconstruct", "128", "4", "graph"): "variants1-pp", ("reconstruct", "1", "4", "graph"): "run3",
        ("reconstruct", "128", "4", "eager"): "run1", ("reconstruct_deferred", "64", "16", "graph"): "variants1-pp"}
    pp = got[("reconstruct", "128", "4", "graph")]
    assert (pp["verify_us"], pp["depth"], pp["flush"], pp["replayed_tokens"], pp["pct_of_copy_bw"]) == \
        ("231.9", "3", "1", "0", "40.0")
    assert int(pp["verify_bytes"]) + int(pp["commit_bytes"]) == int(pp["bytes"])
    assert pp["extra_mem_bytes"] == "" and pp["copies"] == ""  # not in the variants file: not invented
    assert got[("reconstruct_deferred", "64", "16", "graph")]["depth"] == "15"
    prov = json.loads((tmp_path / "kernels_provenance.json").read_text())
    part = prov["parts"][-1]
    assert (part["run"], part["rows"], part["git_commit"], part["tuning"], part["variant"], part["source_file"]) == \
        ("variants1-pp", 2, "a0853f5", "t-pp", "pp", str(vfile))
    assert "--merge-variants" in part["conversion_command"]
    assert prov["merge"]["history"][-1]["replaced"] == 1 and prov["merge"]["history"][-1]["added"] == 1


def test_models_filter_the_main_table(capsys):
    only = cases(False, ("float32", "bfloat16"), (128, 64), ("qwen3.5-35b-a3b",))
    assert {c.model for c in only} == {"qwen3.5-35b-a3b"} and {c.B for c in only} == {128, 64}
    assert len(cases(False, ("float32",), (128,))) == 2 * len(cases(False, ("float32",), (128,),
                                                              ("qwen3.5-397b-a17b",)))
    with pytest.raises(SystemExit) as exc:
        bench.main(["--out", "unused", "--models", "qwen3.5-35b-a3b,nope"])
    assert exc.value.code == 2 and "--models takes" in capsys.readouterr().err


def test_merge_drop_leaves_out_the_named_rows(tmp_path):
    cols = COLS + ["state_dtype"]
    write(tmp_path / "kernels.csv", [row("reconstruct", 128, 9.0, state_dtype="float32")], cols, {"gpu": "old"})
    new = [row("reconstruct", 128, 5.0, state_dtype="float32"), row("replay", 128, 6.0, state_dtype="float32"),
           row("replay", 128, 7.0, state_dtype="float32", replayed_tokens=12, flush=0),
           row("reconstruct_deferred", 128, 8.0, state_dtype="float32")]
    write(tmp_path / "run.csv", new, cols, {"gpu": "H200"})
    assert bench.main(["--out", str(tmp_path), "--merge", str(tmp_path / "run.csv"), "--merge-run", "run12",
                       "--merge-drop", "reconstruct@1,1,1", "--merge-drop", "replay@1,1,1@0"]) == 0
    with (tmp_path / "kernels.csv").open() as fh:
        got = {(r["policy"], r["replayed_tokens"]): (r["verify_us"], r["run"]) for r in csv.DictReader(fh)}
    assert got == {("reconstruct", "0"): ("9.0", "run1"), ("replay", "12"): ("7.0", "run12"),
                   ("reconstruct_deferred", "0"): ("8.0", "run12")}
    prov = json.loads((tmp_path / "kernels_provenance.json").read_text())
    assert prov["parts"][-1]["dropped"] == ["reconstruct@1,1,1", "replay@1,1,1@0"]
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path), "--merge", str(tmp_path / "run.csv"), "--merge-run", "run13",
                    "--merge-drop", "store_all@1,1,1"])  # matches no row: refused
