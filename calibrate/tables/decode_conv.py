"""The `gdn_decode_conv` table: GPU time of one GDN layer's decode core outside the policy's SSM kernels.

Around its verify and commit kernels (kernels.csv), a GDN layer's decode core runs the
gating of the decode tokens, the policy's conv verify (one launch: the short conv over each
request's tree from its window, reading the projection rows in place, the q/k L2 norms, q, k
and v written contiguous), the copy of the verify output into the layer's rows and the conv
commit (vLLM's fused_gdn_gating and causal_conv1d_update sit in the same place, its q/k norms
inside the recurrence). `gdn` (the dense halves) does not hold this work, and for prefill tokens
`gdn_prefill_varlen` does. Each point runs the executor's own code (`Executor.gdn_inputs`,
`verify_inputs`, `verify_output`, `conv_commit`) for B decoding requests with the policy's
tree, queued behind a busy GPU (the GPU time a graph would see), under each policy, on a
two-layer executor of the model's real shapes (the TP shard's for a TP model).
Rows: core.tables.DECODE_CONV_COLUMNS (`policy` = mamba_state_commit), mode "graph".
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from core.config import HardwareConfig, ModelConfig, PolicyConfig

MAX_REQUESTS = 256  # calibrate.tables.host.decode_batches' largest batch


def gdn_decode_conv_table(ex: object, policies: Sequence[PolicyConfig], bw_gbs: float,
                          log: Callable[[str], None] = print, reps: int = 20, batches: int | None = None
                          ) -> list[dict]:
    """The table's rows for each policy of the executor's step shape (others are logged and
    skipped), at the first `batches` of calibrate.tables.host's decode batches (default all); leaves the
    executor on the last policy measured."""
    from calibrate.device.timing import spread, wall_times
    from calibrate.tables.host import cycles_per_us, decode_batches, decode_requests, gpu_times, under_each_policy

    cuda = ex.device.type == "cuda"
    cpu = cycles_per_us() if cuda else 0.0
    s, i = ex.s, ex.kinds.index("gdn")
    rows: list[dict] = []
    for pol in under_each_policy(ex, policies, log, "gdn_decode_conv"):
        for b in decode_batches(ex, quick=False)[:batches]:
            st = ex.prepare(decode_requests(ex, b), mode="eager")
            accepted = ex.i32.d("accepted", st.B)
            o = torch.zeros(st.B, st.T, s.gdn_v_heads, s.head_v_dim, dtype=ex.gdn_o.dtype, device=ex.device)

            def call() -> None:
                qkv, g, beta, nd = ex.gdn_inputs(i, st)
                _, conv_ctx = ex.verify_inputs(i, st, qkv[:nd], g[:nd], beta[:nd])
                ex.verify_output(st, o)
                ex.conv_commit(conv_ctx, accepted, check=False)
            call()  # compile / autotune outside the timing
            ts = gpu_times(call, reps, cpu) if cuda else wall_times(call, reps)  # CPU: tests
            if ts is None:
                log(f"  gdn_decode_conv {pol.name} B={b}: the GPU went idle (a host sync?); skipped")
                continue
            n, c = st.B * st.T, s.gdn_conv_channels
            window = (s.conv_kernel - 1) * c * 2
            # Minimum traffic: the gating's two columns per head, the conv input read and output
            # written, the verify output copied, each window read and written, the log-decays and
            # betas written (float32).
            nbytes = n * (2 * s.gdn_v_heads * 2 + 2 * c * 2 + 2 * s.gdn_v_channels * 2
                          + 2 * s.gdn_v_heads * 4) + 2 * st.B * window
            flops = 2.0 * n * c * s.conv_kernel
            us, p10, p90 = spread(ts)
            rows.append({"policy": pol.mamba_state_commit, "mode": "graph", "B": st.B, "P": st.T, "ctx": 0,
                         "tokens": n, "us": round(us, 3), "us_p10": round(p10, 3), "us_p90": round(p90, 3),
                         "reps": len(ts), "copies": 1, "flops": int(flops), "bytes": int(nbytes),
                         "pct_bw": round(100 * nbytes / (us * 1e-6) / (bw_gbs * 1e9), 2), "pct_flops": 0.0})
            log(f"  gdn_decode_conv {pol.mamba_state_commit} B={st.B} T={st.T}: {us:.1f} us")
    return rows


def decode_conv_executor(model: ModelConfig, hw: HardwareConfig, policy: PolicyConfig, device: torch.device,
                         log: Callable[[str], None] = print) -> object:
    """A two-layer (one GDN, one attention) executor of the model's real shapes: enough for the
    decode core, whatever the model's size."""
    from calibrate.executor.runner import Executor
    from policies import make_policy
    from sim.engine.budget import block_layout

    block = block_layout(model, make_policy(model, policy), 1 << 40).attn_block_tokens
    return Executor(model, policy, device=device, max_requests=MAX_REQUESTS, max_context=4096,
                    max_num_seqs=hw.max_num_seqs, max_num_batched_tokens=hw.max_num_batched_tokens,
                    block_size=block, kv_pool_bytes=256 << 20, mode="eager", kinds=["gdn", "attn"], log=log)
