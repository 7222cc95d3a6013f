"""A block-FP8 linear projection as vLLM runs one on Hopper (docs/vllm_kernels.md#block-fp8-checkpoints):
the bf16 activation quantised per token and group of 128 channels, then a block-scaled GEMM with the
weight's float32 128 x 128 scales, bf16 out.

Two GEMMs can price it: torch's block-wise `scaled_mm` (cuBLASLt's SM90 block-scaled kernel, the
packaged stand-in for vLLM's CUTLASS `cutlass_scaled_mm`, with M padded to a multiple of 4 as
vLLM's `_padded_cutlass` pads it) and our Triton `fp8_block_gemm`. `pick_gemm` takes torch's where
its output matches the float64 reference on this machine (`auto`), or the one asked for.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from calibrate.kernels import fp8_gemm as G

PAD_M = 4  # vLLM's `_padded_cutlass` pad_multiple
FP8_GEMMS = ("torch", "triton", "auto")


def _outer_major(a_s: torch.Tensor) -> torch.Tensor:
    """[M, K/128] scales stored outer-dim-major (strides (1, M)), as torch's BlockWise1x128 asks."""
    m, kg = a_s.shape
    buf = torch.zeros(kg, m, dtype=a_s.dtype, device=a_s.device)
    buf[:, :m] = a_s.t()
    return buf.t()[:m]


# How torch wants the weight's [N/128, K/128] scales for b = weight.T: tried in order, the first
# whose product matches the reference is used (check_torch_block_mm).
B_SCALE_LAYOUTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "n_by_k": lambda ws: ws, "k_by_n_view": lambda ws: ws.t(), "k_by_n": lambda ws: ws.t().contiguous()}
B_LAYOUT: list[str] = []


def _scaled_mm(aq: torch.Tensor, a_s: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """torch's block-wise scaled_mm of outer-major activation scales and weight scales laid out as it wants."""
    st = F.ScalingType
    return F.scaled_mm(aq, wq.t(), a_s, st.BlockWise1x128, ws, st.BlockWise128x128, output_dtype=torch.bfloat16)


def torch_block_mm(aq: torch.Tensor, a_s: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """torch's block-wise scaled_mm of quantised activations: scale_a [M, K/128] (BlockWise1x128), the
    weight's scales (BlockWise128x128), b the weight's transpose (column-major). M padded to a multiple
    of 4 with zero rows of scale one and the product cut back, as vLLM's `_padded_cutlass` does on Hopper
    before its CUTLASS block-FP8 GEMM: cuBLASLt refuses M = 1 unpadded."""
    m = aq.shape[0]
    if m % PAD_M:
        padded = torch.zeros(m + (-m % PAD_M), aq.shape[1], dtype=aq.dtype, device=aq.device)
        padded[:m].copy_(aq)
        scales = torch.ones(padded.shape[0], a_s.shape[1], dtype=a_s.dtype, device=a_s.device)
        scales[:m].copy_(a_s)
        aq, a_s = padded, scales
    return _scaled_mm(aq, _outer_major(a_s), wq, B_SCALE_LAYOUTS[B_LAYOUT[0]](ws))[:m]


def check_torch_block_mm(device: torch.device, n: int = 1024, k: int = 2048) -> str | None:
    """Finds the weight-scale layout torch's block-wise scaled_mm takes here (sets B_LAYOUT); None when
    one matches the float64 reference at 1, 5, 16 and 300 tokens, on quantised activations
    (torch_block_mm) and as a projection (the layer tables' path), else why none does."""
    wq, ws = G.quantize_weight_blocks(torch.randn(n, k, device=device) * 0.02)
    errors = []
    for layout in B_SCALE_LAYOUTS:
        B_LAYOUT[:] = [layout]
        for m in (16, 1, 5, 300):
            x = torch.randn(m, k, device=device).bfloat16()
            aq, a_s = G.group_quant(x)
            try:
                outs = (torch_block_mm(aq, a_s, wq, ws), _torch_linear(x, wq, B_SCALE_LAYOUTS[layout](ws)))
            except Exception as e:  # noqa: BLE001 - the reason is the record
                errors.append(f"{layout} M={m}: {type(e).__name__}: {str(e)[:160]}")
                break
            ref = G.fp8_block_gemm_ref(aq, a_s, wq, ws, torch.float64)
            err = max(((out.double() - ref).abs().max() / ref.abs().max()).item() for out in outs)
            if err > 1e-2:
                errors.append(f"{layout} M={m}: max error {err:.3g}")
                break
        else:
            return None
    B_LAYOUT.clear()
    return "; ".join(errors)


@dataclass(frozen=True)
class Fp8Gemm:
    """How one block-FP8 projection runs: `scales` lays a weight's scales out once, at build time, and
    `linear(x [T, K] bf16, weight fp8 [N, K], scales)` returns x @ weight.T [T, N] in bf16."""
    name: str  # what the provenance's packaged_kernels records
    scales: Callable[[torch.Tensor], torch.Tensor]
    linear: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _torch_linear(x: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    # vLLM pads the bf16 rows and quantises them with column-major scales in one pass (QuantFP8):
    # padding before the quantisation keeps it to that one pass, zero rows quantising to zero.
    m = x.shape[0]
    xp = F.pad(x, (0, 0, 0, -m % PAD_M)) if m % PAD_M else x
    aq, a_s = G.group_quant(xp, column_major_scales=True)
    return _scaled_mm(aq, a_s, wq, ws)[:m]


def _triton_linear(x: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    aq, a_s = G.group_quant(x)
    return G.fp8_block_gemm(aq, a_s, wq, ws)


TRITON = Fp8Gemm("calibrate/kernels/fp8_gemm.py: group_quant + fp8_block_gemm (Triton)", lambda ws: ws,
                 _triton_linear)


def torch_gemm() -> Fp8Gemm:
    """After check_torch_block_mm has found the layout."""
    layout = B_LAYOUT[0]
    return Fp8Gemm(f"torch {torch.__version__} scaled_mm BlockWise1x128 x BlockWise128x128 (cuBLASLt), M padded to "
                   f"{PAD_M}; group_quant calibrate/kernels/fp8_gemm.py", B_SCALE_LAYOUTS[layout], _torch_linear)


def pick_gemm(choice: str, device: torch.device, log: Callable[[str], None] = print) -> Fp8Gemm:
    """`torch` (it must pass its check here), `triton`, or `auto`: torch's where it passes, else ours."""
    if choice not in FP8_GEMMS:
        raise ValueError(f"fp8_gemm must be one of {', '.join(FP8_GEMMS)}, got {choice!r}")
    if choice == "triton":
        return TRITON
    why = check_torch_block_mm(device) if device.type == "cuda" else "needs a CUDA GPU"
    if why is None:
        return torch_gemm()
    if choice == "torch":
        raise SystemExit(f"calibrate measure: --fp8-gemm torch, but torch's block-wise scaled_mm fails its check "
                         f"here: {why}")
    log(f"  torch block-wise scaled_mm unusable ({why}): block-FP8 projections on our Triton GEMM")
    return TRITON


@dataclass
class Fp8Linear:
    """One block-FP8 projection: the checkpoint's `weight` and `weight_scale_inv`, called like F.linear."""
    weight: torch.Tensor  # float8_e4m3fn [N, K]
    scale: torch.Tensor  # float32 [N/128, K/128]
    gemm: Fp8Gemm
    gemm_scale: torch.Tensor  # `scale` laid out as the GEMM takes it

    @classmethod
    def of(cls, w: torch.Tensor, gemm: Fp8Gemm) -> "Fp8Linear":
        """The block-FP8 quantisation of a bf16 weight [N, K]."""
        q, s = G.quantize_weight_blocks(w)
        return cls(q, s, gemm, gemm.scales(s))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.gemm.linear(x, self.weight, self.gemm_scale)

    def dequantised(self) -> torch.Tensor:
        """float64 [N, K], for the references."""
        return G.dequantize_weight_blocks(self.weight, self.scale)
