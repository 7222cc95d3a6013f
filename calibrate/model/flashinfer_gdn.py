"""FlashInfer's GDN prefill, called as vLLM calls it, behind fla's `chunk_gated_delta_rule` signature.

vLLM runs FlashInfer's chunked gated delta rule for the GDN prefill on compute capability
9.0 and up (fla's Triton chunk kernel is the fallback); on SM90 it is FlashInfer's CuTe DSL
kernel, compiled at run time through nvidia-cutlass-dsl. vLLM's wrapper (docs/vllm_kernels.md
names it and its source) takes contiguous q, k, v, L2-normalises q and k with fla's `l2norm_fwd`,
makes g and beta contiguous, casts the state, g and beta to float32 and passes exp(g) (FlashInfer
takes the decay itself, not its log). `chunk` below does the same launches, so its host
issue time and GPU time are what vLLM's step pays. The state layout is FlashInfer's
[N, H, V, K], which is fla's `state_v_first` layout.
"""
from __future__ import annotations

from typing import Callable

import torch


def load_flashinfer_chunk() -> Callable[..., object] | None:
    """The wrapped kernel, or None without flashinfer (and fla's l2norm) or below compute capability 9.0."""
    try:
        from fla.modules.norm.l2norm import l2norm_fwd
        from flashinfer.gdn_prefill import chunk_gated_delta_rule
    except Exception:  # ImportError, or the DSL's own errors when its libraries do not load
        return None
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        return None
    whole: dict[tuple[int, torch.device], torch.Tensor] = {}

    def chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              initial_state: torch.Tensor | None = None, output_final_state: bool = False,
              cu_seqlens: torch.Tensor | None = None, use_qk_l2norm_in_kernel: bool = False,
              state_v_first: bool = True, cu_seqlens_cpu: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """fla's arguments ([1, T, H, D] tensors, varlen through cu_seqlens); returns ([1, T, H, V], final state)."""
        if not state_v_first:
            raise ValueError("flashinfer_gdn: FlashInfer's state is [N, H, V, K]: call with state_v_first=True")
        # vLLM's layer hands the core contiguous q, k, v (copies of the conv output's column ranges).
        q, k, v = (t.squeeze(0).contiguous() for t in (q, k, v))
        if use_qk_l2norm_in_kernel:
            # fla's l2norm_fwd returns (y, rstd); vLLM's copy of it returns y.
            q, k = l2norm_fwd(q)[0], l2norm_fwd(k)[0]
        g, beta = g.squeeze(0).contiguous().float(), beta.squeeze(0).contiguous().float()
        if cu_seqlens is None:
            # One sequence: vLLM always has its metadata's tensor; keep one per length, not one per call.
            key = (q.shape[0], q.device)
            if key not in whole:
                whole[key] = torch.tensor([0, q.shape[0]], dtype=torch.int64, device=q.device)
            cu_seqlens = whole[key]
        state0 = initial_state.float() if initial_state is not None else None
        out = chunk_gated_delta_rule(q=q, k=k, v=v, g=torch.exp(g), beta=beta, initial_state=state0,
                                     output_final_state=output_final_state, cu_seqlens=cu_seqlens)
        o, final = out if output_final_state else (out, None)
        return o.unsqueeze(0), final
    return chunk
