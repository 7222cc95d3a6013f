"""Paged KV cache attention (placeholder: the plain-PyTorch reference until the Triton kernel lands)."""
from calibrate.kernels.naive import paged_attention_ref as paged_attention
from calibrate.kernels.naive import reshape_and_cache_ref as reshape_and_cache

__all__ = ["paged_attention", "reshape_and_cache"]
