"""Fused MoE (placeholder: the plain-PyTorch reference until the Triton kernel lands)."""
from calibrate.kernels.naive import fused_moe_ref as fused_moe

__all__ = ["fused_moe"]
