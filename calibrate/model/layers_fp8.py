"""The calibrator's layers with a block-FP8 checkpoint's weights (docs/fp8.md), as vLLM runs them.

`fp8_weights` turns a layer's random bf16 weights (calibrate/model/layers.py) into the checkpoint's form:
each projection the shapes name as block-FP8 becomes float8_e4m3fn with one float32 inverse scale
per 128 x 128 block (`Fp8Linear`: per-token-group quantisation of the activation, then a
block-scaled GEMM), every other tensor stays bf16 (the router, the shared-expert gate, GDN's b and a
rows, the norms). The bf16 layers' forwards then run them unchanged (`layers.linear` calls an
Fp8Linear), except two shapes vLLM changes:

- GDN's in_proj is two projections, vLLM's `in_proj_qkvz` (block-FP8) and `in_proj_ba` (bf16), so
  `gdn_in` returns their two outputs;
- the MoE block runs the routed experts through our block-FP8 fused MoE (`fused_moe_fp8`, vLLM's
  Triton `fused_moe_kernel` with `use_fp8_w8a8`) and the shared expert as a dense block-FP8 MLP with
  its bf16 sigmoid gate, as vLLM's `Qwen3NextMLP` (`models/qwen3_next.py`) runs it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from calibrate.kernels import fp8_gemm as G
from calibrate.kernels.fused_moe_fp8 import fused_moe_fp8
from calibrate.model import layers as L
from calibrate.model.fp8_linear import Fp8Gemm, Fp8Linear
from calibrate.model.shapes import LayerShapes


@dataclass
class GDNInProj:
    """vLLM's two input projections of a block-FP8 GDN layer: q, k, v and z in FP8, b and a in bf16."""
    qkvz: Fp8Linear  # [conv channels + v channels, hidden]
    ba: torch.Tensor  # [2 * v heads, hidden]

    def __call__(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.qkvz(h), F.linear(h, self.ba)


@dataclass
class Fp8MoEWeights:
    """The MoE block of a block-FP8 checkpoint: routed experts stacked as fused_moe_fp8 takes them."""
    norm: torch.Tensor
    router: torch.Tensor  # [experts, hidden] bf16
    w13: torch.Tensor  # [experts, 2 * width, hidden] fp8: gate and up
    w13_s: torch.Tensor  # [experts, 2 * width / 128, hidden / 128] float32
    w2: torch.Tensor  # [experts, hidden, width] fp8
    w2_s: torch.Tensor
    shared13: Fp8Linear | None  # the shared expert's gate_up and down (None: no shared expert)
    shared2: Fp8Linear | None
    shared_gate: torch.Tensor | None  # [1, hidden] bf16

    def __call__(self, h: torch.Tensor, s: LayerShapes, residual: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """h: the normed input. The shared expert's gated output plus the residual is what the routed
        experts' final reduction adds to their sum (one pass fewer than adding each)."""
        if self.shared13 is not None:
            gate, up = self.shared13(h).chunk(2, -1)
            residual = torch.addcmul(residual, torch.sigmoid(F.linear(h, self.shared_gate)),
                                     self.shared2(F.silu(gate) * up))
        y = fused_moe_fp8(h, self.router, self.w13, self.w13_s, self.w2, self.w2_s, s.top_k,
                          None, None, None, None, None, residual=residual)
        return y if out is None else out.copy_(y)


def _fp8(w: torch.Tensor, s: LayerShapes, name: str, gemm: Fp8Gemm) -> torch.Tensor | Fp8Linear:
    return Fp8Linear.of(w, gemm) if name in s.fp8_projections else w


def _both(s: LayerShapes, *names: str) -> bool:
    """A fused projection is block-FP8 if all its parts are; parts that differ cannot share one GEMM."""
    fp8 = [n in s.fp8_projections for n in names]
    if any(fp8) and not all(fp8):
        raise ValueError(f"{s.model}: {', '.join(names)} run as one GEMM but only some are block-FP8")
    return all(fp8)


def fp8_weights(w: object, s: LayerShapes, gemm: Fp8Gemm) -> object:
    """The block-FP8 form of one of calibrate.model.layers' weights objects (the same random values, quantised)."""
    if isinstance(w, L.GDNWeights):
        qkvz = s.gdn_conv_channels + s.gdn_v_channels
        if not _both(s, "in_proj_qkv", "in_proj_z"):
            return replace(w, out_proj=_fp8(w.out_proj, s, "out_proj", gemm))
        return replace(w, in_proj=GDNInProj(Fp8Linear.of(w.in_proj[:qkvz], gemm), w.in_proj[qkvz:].contiguous()),
                       out_proj=_fp8(w.out_proj, s, "out_proj", gemm))
    if isinstance(w, L.AttnWeights):
        fused = _both(s, "q_proj", "k_proj", "v_proj")
        return replace(w, qkv=Fp8Linear.of(w.qkv, gemm) if fused else w.qkv, o_proj=_fp8(w.o_proj, s, "o_proj", gemm))
    if isinstance(w, L.MLPWeights):
        fused = _both(s, "gate_proj", "up_proj")
        return replace(w, w13=Fp8Linear.of(w.w13, gemm) if fused else w.w13, w2=_fp8(w.w2, s, "down_proj", gemm))
    if isinstance(w, L.MoEWeights):
        if not (_both(s, "experts.gate_proj", "experts.up_proj", "experts.down_proj")):
            raise ValueError(f"{s.model}: block-FP8 MoE without block-FP8 routed experts")
        (w13, w13_s), (w2, w2_s) = G.quantize_weight_blocks(w.w13), G.quantize_weight_blocks(w.w2)
        shared = s.shared_width and _both(s, "shared_expert.gate_proj", "shared_expert.up_proj",
                                          "shared_expert.down_proj")
        if s.shared_width and not shared:
            raise ValueError(f"{s.model}: block-FP8 routed experts with a bf16 shared expert")
        return Fp8MoEWeights(w.norm, w.router, w13, w13_s, w2, w2_s,
                             Fp8Linear.of(w.shared13, gemm) if shared else None,
                             Fp8Linear.of(w.shared2, gemm) if shared else None, w.shared_gate if shared else None)
    if isinstance(w, L.MTPWeights):
        return replace(w, fc=_fp8(w.fc, s, "fc", gemm))
    raise TypeError(f"fp8_weights: no block-FP8 form of {type(w).__name__}")


FP8_TABLES = {"gdn": ("in_proj_qkv", "out_proj"), "attn_proj": ("q_proj", "o_proj"),
              "mlp": ("gate_proj", "down_proj"), "mtp_fc": ("fc",),
              "moe": ("experts.gate_proj", "shared_expert.gate_proj")}


def fp8_kernel_names(s: LayerShapes, gemm: Fp8Gemm, jobs: tuple[str, ...]) -> dict[str, str]:
    """The provenance's packaged_kernels of the tables a block-FP8 checkpoint's projections price: the
    GEMM that ran them, and for the MoE the fused block-FP8 kernel of its routed experts."""
    out = {}
    for job, names in FP8_TABLES.items():
        if job in jobs and any(n in s.fp8_projections for n in names):
            out[job] = f"block-FP8 projections: {gemm.name}"
    if "moe" in out:
        out["moe"] = ("routed experts: calibrate/kernels/fused_moe_fp8.py, configs default_config (vLLM's block-FP8 "
                      "default)" + (f"; shared expert: {gemm.name}" if s.shared_width else ""))
    return out
