"""The fused MoE's config tables (vLLM's file names and nearest-token rule) and the tuner's plumbing."""
import json

import pytest
import torch

from calibrate.benches import moe_tune
from calibrate.kernels import moe_configs as MC


def test_file_name_is_vllms():
    assert MC.file_name(256, 512, "NVIDIA H200") == "E=256,N=512,device_name=NVIDIA_H200.json"


def test_nearest_entry_wins_and_ties_take_the_smaller():
    a, b = MC.MoEConfig(False, 16, 32, 64), MC.MoEConfig(True, 64, 64, 64)
    table = {1: a, 64: b}
    assert MC.nearest(table, 1) is a and MC.nearest(table, 30) is a and MC.nearest(table, 33) is b
    assert MC.nearest(table, 10_000) is b
    assert MC.nearest({2: a, 4: b}, 3) is a


def test_table_round_trip_and_lookup_from_a_directory(tmp_path):
    table = {1: MC.MoEConfig(False, 16, 32, 64, 4, 4, 1), 512: MC.MoEConfig(True, 32, 64, 128, 8, 3, 1, 128)}
    name = MC.file_name(7, 24, "Test GPU")
    MC.write_table(tmp_path / "new" / name, table)
    assert (tmp_path / "new" / name).is_file()
    MC.write_table(tmp_path / name, table)
    assert not list(tmp_path.glob("*.tmp"))
    assert MC.parse_table((tmp_path / name).read_text(), name) == table
    assert MC.config_for(600, 7, 24, "Test GPU", tmp_path) == table[512]
    # no table for these shapes or no GPU: the heuristic
    assert MC.config_for(600, 8, 24, "Test GPU", tmp_path) == MC.default_config(600)
    assert MC.config_for(600, 7, 24, None, tmp_path) == MC.default_config(600)


@pytest.mark.parametrize("body, word", [({"x": {"block_m": 16}}, "'x'"), ({"4": {"block_m": 16, "tile": 2}}, "'4'"),
                                        ({}, "no entries")])
def test_a_bad_table_names_its_entry(body, word):
    with pytest.raises(ValueError, match=word):
        MC.parse_table(json.dumps(body), "t.json")


def test_committed_tables_parse():
    for path in MC.TABLE_DIR.glob("*.json"):
        table = MC.parse_table(path.read_text(), path.name)
        assert all(c.block_m in (16, 32, 64, 128) for c in table.values()), path.name


def test_candidates_start_with_the_default_and_are_distinct():
    for t in moe_tune.TOKENS:
        c = moe_tune.candidates(t)
        assert c[0] == MC.default_config(t) and len(set(c)) == len(c) >= 4


@pytest.mark.parametrize("argv, field", [(["--time-budget-s", "0"], "--time-budget-s"),
                                         (["--models", "qwen3.5-27b"], "--models"),
                                         (["--models", "no-such-model"], "--models")])
def test_tuner_bad_arguments_exit_2_naming_the_field(tmp_path, capsys, argv, field):
    assert moe_tune.main(["--out", str(tmp_path)] + argv) == 2
    err = capsys.readouterr().err
    assert field in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal")
def test_tuner_refuses_without_a_gpu(tmp_path):
    assert moe_tune.main(["--out", str(tmp_path)]) == 2


H200_SMEM = 232_448  # shared_memory_per_block_optin of the H200 (sm_90)


def test_shared_memory_counts_the_pipelined_tiles():
    # Triton's OutOfResources on the H200 for this candidate asked for 245,760 B
    assert MC.shared_memory_bytes(MC.MoEConfig(True, 128, 256, 64, 8, 3)) == 245_760
    assert MC.shared_memory_bytes(MC.MoEConfig(True, 128, 128, 64, 8, 3)) == 3 * (128 * 64 + 2 * 64 * 128) * 2
    # the down GEMM's own N tile counts when it is the larger
    assert MC.shared_memory_bytes(MC.MoEConfig(False, 16, 16, 128, 4, 2, 8, 512)) == 2 * (16 * 128 + 128 * 512) * 2


def test_candidates_that_cannot_fit_are_left_out_before_they_are_tried():
    from calibrate.benches import kernels as bench
    too_big = MC.MoEConfig(True, 128, 256, 64, 8, 3)
    assert too_big in bench.moe_candidates(2048)  # listed when no limit is known
    assert too_big not in bench.moe_candidates(2048, H200_SMEM)
    for t in moe_tune.TOKENS + bench.MOE_TOKENS:
        for c in moe_tune.candidates(t, H200_SMEM) + bench.moe_candidates(t, H200_SMEM):
            assert MC.shared_memory_bytes(c) <= H200_SMEM, (t, c)
        assert MC.shared_memory_bytes(MC.default_config(t)) <= H200_SMEM  # the default always runs
