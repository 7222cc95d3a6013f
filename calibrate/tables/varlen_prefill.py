"""The `gdn_prefill_varlen` table: GPU time of one GDN layer's prefill of one step, over tokens x seqs.

vLLM makes ONE varlen call per layer for all prefill sequences of a step (docs/vllm.md#gdn-kernel-calls
section 2); its cost depends on the token total and on how many sequences share it
(per-sequence chunk padding, state gather and scatter). Each point runs the executor's
own prefill core (state gather, fla's varlen causal conv and chunked gated delta rule,
state scatter) for `seqs` sequences of tokens / seqs tokens after a cached prefix,
queued behind a busy GPU so launch gaps are hidden (the GPU time a graph would see).
Rows: core.tables.SEQS_COLUMNS, mode "graph".
"""
from __future__ import annotations

import time
from typing import Callable

from core.config import HardwareConfig

TOKENS = (16, 64, 256, 1024, 2048, 4096, 8192)
SEQS = (1, 2, 4, 8, 16, 32, 64)
CONTEXT = 512  # tokens cached before each chunk: the states are gathered, not zeroed
FLA_CHUNK = 64  # fla's chunk: each sequence is padded up to a multiple inside the kernel


def gdn_prefill_varlen_table(ex: object, hw: HardwareConfig, log: Callable[[str], None] = print,
                             reps: int = 10, end: float | None = None) -> list[dict]:
    """The table's rows, stopping (with the points measured so far) once time.perf_counter() passes `end`."""
    from calibrate.device.timing import spread
    from calibrate.tables.host import cycles_per_us, gpu_times
    from sim.engine.step_trace import TracedRequest as R

    s = ex.s
    i = ex.kinds.index("gdn")
    cpu = cycles_per_us()
    rows = []
    for tokens in (t for t in TOKENS if t <= ex.max_tokens - 256):
        for seqs in (q for q in SEQS if q * 8 <= tokens and q <= ex.max_step_requests):
            if end is not None and time.perf_counter() > end:
                log(f"  gdn_prefill_varlen: time budget spent, {len(rows)} points")
                return rows
            per = tokens // seqs
            st = ex.prepare([R(1000 + k, per, CONTEXT, (), 0) for k in range(seqs)], mode="eager")

            def call() -> None:
                qkv, g, beta, nd = ex.gdn_inputs(i, st)
                ex.prefill(i, st, qkv[nd:st.n], g[nd:st.n], beta[nd:st.n])
            call()  # compile / autotune outside the timing
            ts = gpu_times(call, reps, cpu)
            if ts is None:
                log(f"  gdn_prefill_varlen tokens={tokens} seqs={seqs}: the GPU went idle (a host sync?); skipped")
                continue
            n = st.n
            state = s.gdn_v_heads * s.head_v_dim * s.head_k_dim * ex.ssm[i].element_size()
            nbytes = 2 * n * s.gdn_conv_channels * 2 + 2 * n * s.gdn_v_channels + 2 * seqs * state
            chunked = seqs * -(-per // FLA_CHUNK) * FLA_CHUNK
            flops = 2.0 * chunked * s.gdn_v_heads * (FLA_CHUNK * (s.head_k_dim + s.head_v_dim)
                                                     + 4 * s.head_k_dim * s.head_v_dim)
            us, p10, p90 = spread(ts)
            rows.append({"mode": "graph", "B": seqs, "P": per, "ctx": CONTEXT, "tokens": n, "us": round(us, 3),
                         "us_p10": round(p10, 3), "us_p90": round(p90, 3), "reps": len(ts), "copies": 1,
                         "flops": int(flops), "bytes": int(nbytes),
                         "pct_bw": round(100 * nbytes / (us * 1e-6) / (hw.hbm_bandwidth_gbs * 1e9), 2),
                         "pct_flops": round(100 * flops / (us * 1e-6) / (hw.bf16_tflops * 1e12), 2), "seqs": seqs})
            log(f"  gdn_prefill_varlen tokens={n} seqs={seqs}: {us:.1f} us")
    return rows
