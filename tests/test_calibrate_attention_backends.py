"""The attention tables' kernel choice: our Triton kernel, or flash-attn-4 over the same paged pool."""
from __future__ import annotations

import pytest
import torch

from calibrate.model import attention_backends as AB
from calibrate.model.layers import PagedBatch
from calibrate.tables import measure as M
from calibrate.tables.run import load_attention


def _batch() -> PagedBatch:
    return PagedBatch(k_cache=torch.zeros(4, 16, 2, 8), v_cache=torch.ones(4, 16, 2, 8),
                      slot_mapping=torch.empty(0, dtype=torch.int64), block_tables=torch.tensor([[2, 0], [1, 3]]),
                      seq_lens=torch.tensor([20, 5], dtype=torch.int32),
                      cu_seqlens_q=torch.tensor([0, 3, 4], dtype=torch.int32), max_seqlen_q=3)


def test_core_call_passes_the_paged_pool_to_fa4():
    seen = {}

    def fa(q, k, v, **kw):
        seen.update(q=q, k=k, v=v, **kw)
        return q
    kv, q = _batch(), torch.randn(4, 8, 8)
    M.core_call(q, kv, fa4=fa)()
    assert seen["k"] is kv.k_cache and seen["v"] is kv.v_cache and seen["page_table"] is kv.block_tables
    assert seen["seqused_k"] is kv.seq_lens and seen["cu_seqlens_q"] is kv.cu_seqlens_q
    assert seen["max_seqlen_q"] == 3 and seen["causal"] and seen["softmax_scale"] == 8 ** -0.5
    assert seen["num_splits"] == 0  # no CUDA device: FlashAttention's own split heuristic, as asked


def test_fa4_split_heuristic_is_off_on_sm90_only():
    """flash-attn-4 4.0.0b36's SM90 forward refuses split-KV: the heuristic's request becomes one split there."""
    assert AB.fa4_num_splits(0, (9, 0)) == 1
    assert AB.fa4_num_splits(0, (10, 0)) == 0 and AB.fa4_num_splits(0, None) == 0
    assert AB.fa4_num_splits(2, (10, 0)) == 2 and AB.fa4_num_splits(1, (9, 0)) == 1


def test_backend_choice():
    assert load_attention("triton", cuda=True) is None
    assert load_attention("auto", cuda=False) is None  # no GPU: ours
    with pytest.raises(SystemExit, match="flash-attn-4"):
        load_attention("fa4", cuda=False)
    with pytest.raises(ValueError, match="triton, fa4, auto"):
        load_attention("cudnn", cuda=True)
