"""`specsim memory` prints vLLM's own startup lines; the one real log (docs/memory.md) comes out exact."""
import json

import pytest

from sim.cli import main as cli

QWEN3_NEXT_LOG = [  # Qwen3-Next-80B-A3B-Instruct bf16, 2 x H200, TP 2, vLLM 0.10.2
    "Setting attention block size to 544 tokens to ensure that attention page size is >= mamba page size.",
    "Padding mamba page size by 1.49% to ensure that mamba page size and attention page size are exactly equal.",
    "Available KV cache memory: 44.59 GiB",
    "GPU KV cache size: 973,760 tokens",
    "Maximum concurrency for 262,144 tokens per request: 14.77x",
]
ARGS = ["memory", "--model", "qwen3-next-80b-a3b", "--tensor-parallel", "2", "--max-model-len", "262144",
        "--num-speculative-tokens", "0", "--mamba-cache-mode", "none", "--vllm-version", "0.10.2"]
# Qwen3.6-35B-A3B (Qwen3.5-35B-A3B's shapes), fp8 KV cache, prefix caching on, no speculation, one GPU,
# vLLM 0.24.0: the newer "GPU KV cache size" = int(max concurrency x max_model_len).
QWEN36_LOG = ["Available KV cache memory: 6.01 GiB", "GPU KV cache size: 569,878 tokens",
              "Maximum concurrency for 131,072 tokens per request: 4.35x"]
QWEN36_ARGS = ["memory", "--model", "qwen3.5-35b-a3b", "--kv-cache-memory-gib", "6.01", "--kv-cache-dtype", "fp8",
               "--mamba-cache-mode", "align", "--max-model-len", "131072", "--num-speculative-tokens", "0"]


def run(capsys, *args):
    rc = cli([*args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_real_log_exact(capsys):
    rc, out, _ = run(capsys, *ARGS, "--kv-cache-memory-gib", "44.59")
    assert rc == 0
    assert out.split("\n\n")[0].splitlines() == QWEN3_NEXT_LOG


def test_real_log_json_keys(capsys):
    rc, out, _ = run(capsys, *ARGS, "--kv-cache-memory-gib", "44.59", "--json")
    d = json.loads(out)
    assert rc == 0 and d["vllm_log"] == QWEN3_NEXT_LOG
    assert (d["attention_block_size"], d["num_blocks"], d["gpu_kv_cache_tokens"]) == (544, 7162, 973_760)
    assert round(d["mamba_page_padding_pct"], 2) == 1.49
    assert round(d["max_concurrency"], 2) == 14.77 and d["available_kv_cache_gib"] == 44.59


def test_current_vllm_prints_the_concurrency_derived_kv_size(capsys):
    rc, out, _ = run(capsys, *QWEN36_ARGS)  # default: the current formula
    assert rc == 0 and out.split("\n\n")[0].splitlines()[-3:] == QWEN36_LOG
    _, out, _ = run(capsys, *QWEN36_ARGS, "--json")
    assert json.loads(out)["gpu_kv_cache_tokens"] == 569_878


def test_old_and_new_formula_differ_for_a_hybrid(capsys):
    _, new, _ = run(capsys, *QWEN36_ARGS, "--json")
    _, old, _ = run(capsys, *QWEN36_ARGS, "--vllm-version", "0.19.0", "--json")
    new, old = json.loads(new), json.loads(old)
    assert old["gpu_kv_cache_tokens"] == old["num_blocks"] // old["kv_cache_groups"] * old["attention_block_size"]
    assert new["gpu_kv_cache_tokens"] != old["gpu_kv_cache_tokens"]
    assert old["vllm_log"][-1] == new["vllm_log"][-1]  # the concurrency line is the same in both
    assert cli(["memory", "--model", "qwen3.5-35b-a3b", "--vllm-version", "latest"]) == 2


def test_budget_from_gmu_is_near_the_log(capsys):
    # Same server at gmu 0.9 without the given KV memory: within 0.5 GiB of the log's 44.59
    # (weights from the model card, profile peak and non-torch/graph memory as estimated).
    rc, out, _ = run(capsys, *ARGS, "--hardware", "h200", "--gmu", "0.9", "--json")
    assert rc == 0
    assert json.loads(out)["available_kv_cache_gib"] == pytest.approx(44.59, abs=0.5)


def test_mtp_and_align_lines_for_qwen35(capsys):
    rc, out, _ = run(capsys, "memory", "--model", "qwen3.5-35b-a3b", "--kv-cache-memory-gib", "10")
    lines = out.split("\n\n")[0].splitlines()
    assert rc == 0
    assert lines[0].startswith("Setting attention block size to 1072 tokens")
    assert "Add 3 padding layers, may waste at most 10.00% KV cache memory" in lines
    # 10 GiB / (11 x 2,195,456 B) = 444 blocks; per request ceil(262,144 / 1,072) + 3 x (2 + 3).
    assert lines[-1] == f"Maximum concurrency for 262,144 tokens per request: {444 / (245 + 15):.2f}x"


@pytest.mark.parametrize("args,msg", [
    (["--kv-cache-memory-gib", "-1"], "--kv-cache-memory-gib must be a positive number"),
    (["--tensor-parallel", "0"], "tensor_parallel: Input should be greater than 0"),
    (["--num-speculative-tokens", "2", "--tree", "1,1,1"], "drafts only mtp_depth = 2 tokens"),
])
def test_bad_values_exit_2_naming_the_field(capsys, args, msg):
    rc, _, err = run(capsys, "memory", "--model", "qwen3.5-35b-a3b", "--kv-cache-memory-gib", "10", *args)
    assert rc == 2 and msg in err


def test_bad_choice_lists_the_allowed_ones(capsys):
    with pytest.raises(SystemExit) as e:
        cli(["memory", "--model", "qwen3.5-35b-a3b", "--mamba-ssm-dtype", "int8"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--mamba-ssm-dtype" in err and all(d in err for d in ("float32", "bfloat16", "float16"))
