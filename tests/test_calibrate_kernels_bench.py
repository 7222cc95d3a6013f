"""The GPU bench's plumbing on the CPU: argument errors, a check through the interpreter, outputs."""
import csv

import pytest
import torch

from calibrate.benches import kernels as bench
from calibrate.kernels import paged_attention as PA


@pytest.mark.parametrize("argv, field", [(["--time-budget-s", "0"], "--time-budget-s"), (["--skip", "gdn"], "--skip")])
def test_bad_arguments_exit_2_naming_the_field(tmp_path, capsys, argv, field):
    assert bench.main(["--out", str(tmp_path)] + argv) == 2
    err = capsys.readouterr().err
    assert field in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal")
def test_refuses_without_a_gpu(tmp_path):
    assert bench.main(["--out", str(tmp_path)]) == 2


def test_a_check_is_recorded_and_a_failure_is_not_fatal(tmp_path):
    b = bench.Bench(tmp_path, 10.0, torch.device("cpu"))
    case = ("tiny-verify", [2, 1], [5, 9], 6, 1, 4)
    assert bench.check_attn_config(b, case, PA.AttnConfig(16, 16, num_splits=2))
    assert not bench.check_attn_config(b, case, PA.AttnConfig(2, 16))  # block_m < group: raises, logged
    assert [c["ok"] for c in b.checks] == [True] and len(b.errors) == 1 and "block_m" in b.errors[0]
    bench._write_csv(tmp_path / "checks.csv", b.checks)
    rows = list(csv.DictReader((tmp_path / "checks.csv").open()))
    assert rows[0]["case"] == "tiny-verify" and "num_splits=2" in rows[0]["config"]
    assert "FAILED" in (tmp_path / "log.txt").read_text()


def test_candidates_are_distinct_and_start_with_the_default():
    for t in bench.MOE_TOKENS:
        c = bench.moe_candidates(t)
        assert c[0] == bench.FM.default_config(t) and len(set(c)) == len(c)
    for q in (1, 4, 64, 2048):
        c = bench.attn_candidates(q, 8)
        assert c[0] == PA.default_config(q, 8) and len(set(c)) == len(c) and all(x.block_m >= 8 for x in c)


def test_best_picks_the_fastest_per_key():
    rows = [{"tokens": 1, "us": 5.0, "pct_bw": 1, "pct_flops": 1, "config": "a"},
            {"tokens": 1, "us": 3.0, "pct_bw": 2, "pct_flops": 2, "config": "b"},
            {"tokens": 2, "us": 9.0, "pct_bw": 3, "pct_flops": 3, "config": "c"}]
    best = bench._best(rows, lambda r: r["tokens"])
    assert best["1"]["config"] == "b" and best["2"]["config"] == "c"
