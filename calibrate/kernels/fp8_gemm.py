"""Block-scaled FP8 as the FP8 checkpoints run it (docs/fp8.md): weights float8_e4m3 with one
float32 scale per 128 x 128 block, activations quantised at run time per token and group of
128 channels (vLLM's `per_token_group_quant_fp8`, `quantization/utils/fp8_utils.py`, which on
CUDA runs its C++ kernel of many groups per thread block), and the GEMM that multiplies the two,
rescaling each K-block's partial product (the contract of vLLM's Triton
`w8a8_triton_block_scaled_mm`; on Hopper vLLM runs DeepGEMM or its CUTLASS kernel instead,
docs/vllm_kernels.md, which calibrate/benches/fp8.py stands in for with torch's block-wise scaled_mm).

Each kernel has a plain-PyTorch `_ref` beside it with the same signature (float64 inside).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from calibrate.kernels.common import INTERPRET, mma

GROUP = 128  # weight_block_size [128, 128]; the activations' group along K
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value
EPS = 1e-10  # vLLM's floor under a group's absolute maximum


def quantize_weight_blocks(w: torch.Tensor, block: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., N, K] (N, K multiples of block) -> (fp8 [..., N, K], float32 scales [..., N/block, K/block]),
    w ~= q * scale per block: the checkpoint's `weight` and `weight_scale_inv`."""
    *lead, n, k = w.shape
    if n % block or k % block:
        raise ValueError(f"quantize_weight_blocks: shape {tuple(w.shape)} is not a multiple of {block}")
    blocks = w.float().reshape(*lead, n // block, block, k // block, block)
    amax = blocks.abs().amax(dim=(-3, -1), keepdim=True).clamp_min(EPS)
    scale = amax / FP8_MAX
    q = (blocks / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).reshape(w.shape)
    return q, scale.reshape(*lead, n // block, k // block).contiguous()


def dequantize_weight_blocks(q: torch.Tensor, scale: torch.Tensor, block: int = GROUP) -> torch.Tensor:
    """float64 weights of an fp8 tensor and its block scales."""
    s = scale.to(torch.float64).repeat_interleave(block, -2).repeat_interleave(block, -1)
    return q.to(torch.float64) * s[..., :q.shape[-2], :q.shape[-1]]


@triton.jit(do_not_specialize=["num_groups"])
def _group_quant_kernel(x, xq, xs, num_groups, H, stride_x, stride_st, stride_sg,
                        G: tl.constexpr, BLOCK_G: tl.constexpr, FMAX: tl.constexpr, EPS_: tl.constexpr):
    # BLOCK_G consecutive groups (row-major over tokens, then groups) per program: vLLM's CUDA
    # kernel gives a thread block up to 16 groups so that small rows still fill the SMs' lanes.
    o_g = tl.program_id(0) * BLOCK_G + tl.arange(0, BLOCK_G)
    m_g = o_g < num_groups
    gpr = H // G
    row, col = o_g // gpr, (o_g % gpr) * G
    o_c = tl.arange(0, G)
    b_x = tl.load(x + row[:, None].to(tl.int64) * stride_x + col[:, None] + o_c[None, :], mask=m_g[:, None],
                  other=0.0).to(tl.float32)
    b_s = tl.maximum(tl.max(tl.abs(b_x), 1), EPS_) / FMAX
    b_q = tl.clamp(b_x / b_s[:, None], -FMAX, FMAX)
    tl.store(xq + o_g[:, None].to(tl.int64) * G + o_c[None, :], b_q.to(xq.dtype.element_ty), mask=m_g[:, None])
    tl.store(xs + row.to(tl.int64) * stride_st + (o_g % gpr) * stride_sg, b_s, mask=m_g)


GROUPS_PER_PROGRAM = 16  # vLLM's GetGroupsPerBlock at most (csrc per_token_group_quant.cu)


def group_quant(x: torch.Tensor, group: int = GROUP, groups_per_program: int = GROUPS_PER_PROGRAM,
                column_major_scales: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] bf16 -> (fp8 [T, H], float32 scales [T, H/group]): x ~= q * scale per token and group.
    `groups_per_program` 1 is one program per token and group (the Triton fallback's structure);
    `column_major_scales` stores the scales token-fastest (strides (1, T)), as vLLM's `QuantFP8`
    writes them for its CUTLASS and DeepGEMM GEMMs and torch's BlockWise1x128 scaled_mm takes them."""
    T, H = x.shape
    if x.stride(1) != 1 or H % group:
        raise ValueError(f"group_quant: x must be contiguous along its last dimension of a multiple of {group}, "
                         f"got shape {tuple(x.shape)} strides {x.stride()}")
    xq = torch.empty(T, H, dtype=FP8, device=x.device)
    xs = torch.empty(H // group, T, dtype=torch.float32, device=x.device).t() if column_major_scales else \
        torch.empty(T, H // group, dtype=torch.float32, device=x.device)
    n = T * (H // group)
    if n:
        # [groups, 128] tiles: 16 groups over 4 warps hold 16 elements a thread, as vLLM's 16 threads a group do.
        _group_quant_kernel[(triton.cdiv(n, groups_per_program),)](
            x, xq, xs, n, H, x.stride(0), xs.stride(0), xs.stride(1), G=group, BLOCK_G=groups_per_program, FMAX=FP8_MAX, EPS_=EPS,
            num_warps=max(1, min(4, groups_per_program // 4)))
    return xq, xs


def group_quant_ref(x: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """In float32 as the kernel computes it, so that both round the same values to fp8."""
    T, H = x.shape
    g = x.float().reshape(T, H // group, group)
    scale = g.abs().amax(-1).clamp_min(EPS) / FP8_MAX
    q = (g / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8).reshape(T, H)
    return q, scale


@triton.jit(do_not_specialize=["M"])
def _block_gemm_kernel(a, a_s, b, b_s, c, M, N, K, stride_a, stride_c,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, G: tl.constexpr,
                       GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m, pid_n = first_m + (pid % width) % size_m, (pid % width) // size_m
    o_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    m_m, m_n = o_m < M, o_n < N
    kg = tl.cdiv(K, G)
    p_a = a + o_m[:, None].to(tl.int64) * stride_a + o_k[None, :]
    p_b = b + o_n[None, :].to(tl.int64) * K + o_k[:, None]  # b [N, K]: B tiles are [BLOCK_K, BLOCK_N] views
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        m_k = o_k < K - k0
        b_a = tl.load(p_a, mask=m_m[:, None] & m_k[None, :], other=0.0)
        b_b = tl.load(p_b, mask=m_k[:, None] & m_n[None, :], other=0.0)
        s_a = tl.load(a_s + o_m * kg + k0 // G, mask=m_m, other=0.0)
        s_b = tl.load(b_s + (o_n // G) * kg + k0 // G, mask=m_n, other=0.0)
        acc += mma(b_a, b_b, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), INTERPRET) * s_a[:, None] * s_b[None, :]
        p_a += BLOCK_K
        p_b += BLOCK_K
    tl.store(c + o_m[:, None].to(tl.int64) * stride_c + o_n[None, :], acc.to(c.dtype.element_ty),
             mask=m_m[:, None] & m_n[None, :])


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8  # M-blocks sharing an N-column in launch order


def block_gemm_config(m: int) -> GemmConfig:
    """Ours, by token count: narrow M tiles while few tokens make the weight read the cost."""
    if m <= 16:
        return GemmConfig(16, 64, 128, 4, 4)
    if m <= 128:
        return GemmConfig(64, 64, 128, 4, 4)
    return GemmConfig(128, 128, 128, 8, 3)


# vLLM's `w8a8_triton_block_scaled_mm` without a tuned file for (N, K, device), which it has for
# none of Qwen3.5's shapes on the H200 (quantization/utils/configs/, vLLM 0.17.1): the tile the
# scale blocks fix, at every token count.
VLLM_DEFAULT_GEMM = GemmConfig(64, GROUP, GROUP, 4, 2, group_m=32)


def fp8_block_gemm(a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor,
                   out_dtype: torch.dtype = torch.bfloat16, config: GemmConfig | None = None) -> torch.Tensor:
    """a [M, K] fp8 with a_s [M, K/128]; b [N, K] fp8 (a checkpoint weight) with b_s [N/128, K/128];
    returns a @ b.T [M, N] in out_dtype, each 128-wide K-block's product times its two scales."""
    M, K = a.shape
    N = b.shape[0]
    if b.shape[1] != K or a_s.shape != (M, triton.cdiv(K, GROUP)) or b_s.shape != (triton.cdiv(N, GROUP), triton.cdiv(K, GROUP)):
        raise ValueError(f"fp8_block_gemm: shapes a {tuple(a.shape)}, a_s {tuple(a_s.shape)}, b {tuple(b.shape)}, "
                         f"b_s {tuple(b_s.shape)} do not agree")
    c = torch.empty(M, N, dtype=out_dtype, device=a.device)
    if M == 0:
        return c
    cfg = config or block_gemm_config(M)
    if GROUP % cfg.block_k:
        raise ValueError(f"fp8_block_gemm: block_k {cfg.block_k} must divide the scale group {GROUP}")
    _block_gemm_kernel[(triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n),)](
        a, a_s.contiguous(), b, b_s.contiguous(), c, M, N, K, a.stride(0), c.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, G=GROUP, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return c


def fp8_block_gemm_ref(a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor,
                       out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    a64 = a.to(torch.float64) * a_s.to(torch.float64).repeat_interleave(GROUP, 1)[:, :a.shape[1]]
    return (a64 @ dequantize_weight_blocks(b, b_s).T).to(out_dtype)
