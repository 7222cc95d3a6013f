"""Whether the GPU holds its speed through a minute of loaded decode steps
(`python3 -m calibrate.benches.clock_hold`).

Every table and the replay time short bursts (tens of milliseconds of replays per shape), while a
server under load runs steps back to back for minutes. This replays one whole target decode step
(the model's layers stacked as `calibrate/tables/stepcheck.py` builds them: B sequences, one token each,
`ctx` cached tokens, the GDN update and the LM head) as a CUDA graph without pause for
`--seconds`, and records each half-second window's mean step time beside the SM and memory clocks,
power, temperature and throttle reasons `nvidia-smi` reports over the same seconds. The summary
compares the last windows with the first.
"""
from __future__ import annotations

import statistics
import subprocess
import threading
import time

import torch

from calibrate.benches.outputs import bench_parser, write_outputs
from calibrate.device.timing import capture, copy_bandwidth_gbs, matmul_tflops
from calibrate.model.shapes import LayerShapes
from calibrate.tables.grid import QUICK
from calibrate.tables.measure import Harness
from calibrate.tables.stepcheck import Step, Weights
from core.config import load_model

MODULE = "calibrate.benches.clock_hold"

SMI_FIELDS = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "clocks_throttle_reasons.active")
COLUMNS = ("t_s", "steps", "step_ms", "sm_mhz", "mem_mhz", "power_w", "temp_c", "throttle")
WINDOW_S = 0.5
EDGE_S = 10.0  # the first and last seconds the summary compares


def _smi() -> dict:
    r = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True, timeout=10)
    vals = [v.strip() for v in r.stdout.strip().splitlines()[0].split(",")] if r.returncode == 0 else [""] * 5
    return dict(zip(("sm_mhz", "mem_mhz", "power_w", "temp_c", "throttle"), vals))


class Poller(threading.Thread):
    """nvidia-smi once a second, until stopped: (seconds since start, reading)."""

    def __init__(self, t0: float) -> None:
        super().__init__(daemon=True)
        self.t0, self.readings, self.stop = t0, [], threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.readings.append((time.monotonic() - self.t0, _smi()))
            self.stop.wait(1.0)


def summary(rows: list[dict]) -> dict:
    first = [r for r in rows if r["t_s"] <= EDGE_S]
    last = [r for r in rows if r["t_s"] >= rows[-1]["t_s"] - EDGE_S]

    def med(rs: list[dict], key: str) -> float | None:
        vals = [float(r[key]) for r in rs if r[key] not in ("", None)]
        return round(statistics.median(vals), 3) if vals else None
    out = {f"{edge}_{k}": med(rs, k) for edge, rs in (("first", first), ("last", last))
           for k in ("step_ms", "sm_mhz", "power_w", "temp_c")}
    out["last_over_first_step_ms"] = round(out["last_step_ms"] / out["first_step_ms"], 4)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(MODULE, __doc__, budget_s=None)
    ap.add_argument("--model", default="qwen3.5-35b-a3b")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    model = load_model(args.model)
    with torch.inference_mode():
        bw, tflops = copy_bandwidth_gbs(dev), matmul_tflops(dev)
        h = Harness(LayerShapes.from_model(model), QUICK, dev, ("graph",), bw, tflops)
        step = Step(h, Weights.build(h), args.batch, 1, args.ctx, None)
        g = capture([step.target])
        before = _smi()
        t0 = time.monotonic()
        poller = Poller(t0)
        poller.start()
        windows = []
        while (now := time.monotonic() - t0) < args.seconds:
            n, ws = 0, time.monotonic()
            while time.monotonic() - ws < WINDOW_S:
                for _ in range(4):
                    g.replay()
                torch.cuda.synchronize()
                n += 4
            windows.append((now, n, (time.monotonic() - ws) * 1e3 / n))
        poller.stop.set()
        poller.join()
    rows = []
    for t, n, ms in windows:
        near = min(poller.readings, key=lambda r: abs(r[0] - t))[1] if poller.readings else {}
        rows.append({"t_s": round(t, 2), "steps": n, "step_ms": round(ms, 4), **{k: near.get(k, "") for k in COLUMNS[3:]}})
    s = summary(rows)
    print(f"{args.model} B={args.batch} ctx={args.ctx}: {s}", flush=True)
    write_outputs(args.out, "clock_hold", rows, COLUMNS, MODULE, args, argv, {
        "copy_bandwidth_gbs": round(bw, 1), "matmul_tflops": round(tflops, 1), "idle_reading": before,
        "summary": s, "windows": len(rows)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
