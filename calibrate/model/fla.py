"""flash-linear-attention's kernels as vLLM calls them for the GDN prefill (optional: the GPU image
carries fla as a wheel; without it the calibrator times stand-ins and says so)."""
from __future__ import annotations

from typing import Callable


def load_fla_chunk() -> Callable[..., object] | None:
    """flash-linear-attention's chunked gated delta rule (vLLM's GDN prefill kernel where FlashInfer's is not), if installed."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError:
        return None
    return chunk_gated_delta_rule


def load_fla_conv() -> Callable | None:
    """fla's varlen causal conv1d (vLLM's GDN prefill conv), if installed."""
    try:
        from fla.modules.causal_conv1d import causal_conv1d
    except ImportError:
        return None
    return causal_conv1d
