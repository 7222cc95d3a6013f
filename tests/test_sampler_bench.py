"""The sampler bench (calibrate/benches/sampler.py): vLLM's sampling path as it times it, on the CPU
through the torch sort rule, and on the GPU with vLLM's Triton top-k/top-p kernel; and the
sustained-load summary of calibrate/benches/clock_hold.py."""
from __future__ import annotations

import pytest
import torch

from calibrate.benches import sampler as S
import json

from calibrate.benches.clock_hold import summary
from calibrate.benches.outputs import bench_parser, write_outputs
from calibrate.benches.profile_peak import apply_top_k_top_p


def _params(rows: int, device="cpu"):
    return (torch.full((rows,), S.TEMPERATURE, device=device),
            torch.full((rows,), S.TOP_K, dtype=torch.int32, device=device),
            torch.full((rows,), S.TOP_P, device=device))


def test_peaked_logits_have_few_likely_tokens_and_gaussian_many():
    gen = torch.Generator().manual_seed(0)
    for dist, lo, hi in (("peaked", 1, 40), ("gaussian", 1000, 10**6)):
        x = S.make_logits(16, 5003, dist, gen, torch.device("cpu")).float()
        assert x.shape == (16, 5003) and S.make_logits(1, 7, dist, gen, torch.device("cpu")).dtype == torch.bfloat16
        # tokens carrying 95% of the probability
        p = x.softmax(-1).sort(-1, descending=True).values.cumsum(-1)
        n = (p < 0.95).sum(-1) + 1
        assert lo <= int(n.min()) and int(n.max()) <= hi, (dist, n)
    with pytest.raises(ValueError, match="dist must be one of gaussian, peaked"):
        S.make_logits(1, 10, "uniform", gen, torch.device("cpu"))


@pytest.mark.parametrize("rows", [3, 12])
def test_sampled_tokens_come_from_the_top_k_top_p_set(rows):
    gen = torch.Generator().manual_seed(rows)
    logits = S.make_logits(rows, 4001, "gaussian", gen, torch.device("cpu"))
    temp, k, p = _params(rows)
    kept = torch.isfinite(apply_top_k_top_p(logits.float() / temp[:, None], k, p))
    # bf16 logits tie: the k-th value's ties stay in, as in vLLM's sort rule
    kth = logits.float().topk(S.TOP_K, dim=-1).values[:, -1:]
    assert bool((kept.sum(-1) <= (logits.float() >= kth).sum(-1)).all()) and bool(kept.any(-1).all())
    calls = []

    def spy(x, kk, pp):  # stands in for vLLM's kernel on the CPU: the rule it implements
        calls.append(x.shape[0])
        return apply_top_k_top_p(x, kk, pp)
    for seed in range(5):
        torch.manual_seed(seed)
        ids = S.sampled(logits, temp, k, p, spy)
        assert ids.dtype == torch.int32 and ids.shape == (rows,)
        assert bool(kept[torch.arange(rows), ids.long()].all())
    # vLLM's kernel from 8 rows, the sort below (`apply_top_k_top_p`)
    assert calls == ([rows] * 5 if rows >= S.TRITON_FROM_ROWS else [])
    # no top-k or top-p asked: no mask at all, any token can come out
    masked = len(calls)
    draws = set(S.sampled(logits[:1].expand(2048, -1), temp[:1].expand(2048), None, None, spy).tolist())
    assert len(calls) == masked and len(draws) > 100
    assert torch.equal(S.greedy(logits), logits.float().argmax(-1))


def test_clock_summary_compares_the_last_seconds_with_the_first():
    rows = [{"t_s": t / 2, "steps": 10, "step_ms": 10.0 if t / 2 <= 10 else 12.0, "sm_mhz": "1980",
             "mem_mhz": "3201", "power_w": "600", "temp_c": "60", "throttle": "0x0"} for t in range(121)]
    s = summary(rows)
    assert s["first_step_ms"] == 10.0 and s["last_step_ms"] == 12.0
    assert s["last_over_first_step_ms"] == 1.2 and s["first_sm_mhz"] == 1980.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_vllm_kernel_matches_the_sort_rule_on_the_gpu():
    top_k_top_p, _ = S.load_vllm_top_k_top_p()
    dev = torch.device("cuda")
    for vocab in (248320, 151936):
        checks = S.check_mask(top_k_top_p, dev, vocab)
        assert all(c["rows_differing"] <= 1 for c in checks.values())
    logits = torch.full((16, 1000), float("nan"), device=dev)  # poisoned, then filled
    logits.copy_(torch.randn(16, 1000, device=dev))
    temp, k, p = _params(16, dev)
    ids = S.sampled(logits.bfloat16(), temp, k, p, top_k_top_p)
    kept = torch.isfinite(apply_top_k_top_p(logits.bfloat16().float(), k, p))
    assert bool(kept[torch.arange(16, device=dev), ids.long()].all())


def test_a_bench_writes_its_table_and_provenance_whole_or_not_at_all(tmp_path):
    args = bench_parser("calibrate.benches.x", "X.", budget_s=5.0).parse_args(["--out", str(tmp_path), "--git-commit", "abc"])
    assert args.time_budget_s == 5.0
    write_outputs(tmp_path, "x", [{"a": 1, "b": 2}], ("a", "b"), "calibrate.benches.x", args, ["--out", "D"], {"k": 3})
    assert (tmp_path / "x.csv").read_text().splitlines() == ["a,b", "1,2"]
    prov = json.loads((tmp_path / "x_provenance.json").read_text())
    assert (prov["command"], prov["git_commit"], prov["k"]) == ("python3 -m calibrate.benches.x --out D", "abc", 3)
    with pytest.raises(KeyError):  # a row without a column: the table of before stays, no temporary left
        write_outputs(tmp_path, "x", [{"a": 5}], ("a", "b"), "calibrate.benches.x", args, [], {})
    assert (tmp_path / "x.csv").read_text().splitlines() == ["a,b", "1,2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.csv", "x_provenance.json"]
