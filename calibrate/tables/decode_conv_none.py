"""The `none` rows of `gdn_decode_conv`: a GDN layer's decode core without speculation, outside its kernel.

Without speculation vLLM's decode step runs, per GDN layer and around the recurrent kernel that the
kernel bench's `none` rows time (gates and q/k norms inside it: docs/vllm_gdn_decode.md), only the
short convolution's update over the one new token of each request (`causal_conv1d_update`): read
the token's conv inputs and the request's window, write the activated outputs and the shifted
window. This times our conv kernels doing exactly that: the tree conv over a one-position tree (no
norms, no split) and the window update of the accepted (only) position, in place. Rows:
core.tables.DECODE_CONV_COLUMNS with policy `none`, P = 1, mode "graph" (GPU time queued behind a
busy GPU, as the other policies' rows).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from calibrate.model.shapes import LayerShapes
from core.config import ModelConfig

BATCHES = (1, 4, 16, 64, 128, 256)  # calibrate.tables.host.decode_batches' sizes


def none_decode_conv_rows(model: ModelConfig, device: torch.device, bw_gbs: float, reps: int = 20,
                          batches: Sequence[int] = BATCHES, log: Callable[[str], None] = print) -> list[dict]:
    from calibrate.device.timing import spread, wall_times
    from calibrate.tables.host import cycles_per_us, gpu_times
    from policies.kernels import conv

    s = LayerShapes.from_model(model)
    c, k = s.gdn_conv_channels, s.conv_kernel
    dtype = torch.bfloat16 if model.conv_dtype_bytes == 2 else torch.float32
    cuda = device.type == "cuda"
    cpu = cycles_per_us() if cuda else 0.0
    gen = torch.Generator(device="cpu").manual_seed(0)
    weight = (torch.randn(c, k, generator=gen) * 0.3).to(device=device, dtype=dtype)
    bias = (torch.randn(c, generator=gen) * 0.1).to(device=device, dtype=dtype)
    rows = []
    for b in batches:
        x = torch.randn(b, 1, c, generator=gen).to(device=device, dtype=dtype)
        state = torch.randn(b, c, k - 1, generator=gen).to(device=device, dtype=dtype)
        parent = torch.full((b, 1), -1, dtype=torch.int32, device=device)
        accepted = torch.zeros(b, dtype=torch.int32, device=device)

        def call() -> None:
            _, ctx = conv.reconstruct_verify(x, weight, parent, state, bias=bias)
            conv.reconstruct_commit(ctx, accepted, check=False)
        call()  # compile outside the timing
        ts = gpu_times(call, reps, cpu) if cuda else wall_times(call, reps)
        if ts is None:
            log(f"  gdn_decode_conv none B={b}: the GPU went idle (a host sync?); skipped")
            continue
        us, p10, p90 = spread(ts)
        el = dtype.itemsize
        # Minimum traffic: the token's inputs read and outputs written, each window read and written.
        nbytes = b * (2 * c * el + 2 * (k - 1) * c * el)
        rows.append({"policy": "none", "mode": "graph", "B": b, "P": 1, "ctx": 0, "tokens": b,
                     "us": round(us, 3), "us_p10": round(p10, 3), "us_p90": round(p90, 3), "reps": len(ts),
                     "copies": 1, "flops": int(2 * b * c * k), "bytes": int(nbytes),
                     "pct_bw": round(100 * nbytes / (us * 1e-6) / (bw_gbs * 1e9), 2), "pct_flops": 0.0})
        log(f"  gdn_decode_conv none B={b}: {us:.1f} us")
    return rows
