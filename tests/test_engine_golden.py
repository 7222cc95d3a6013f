"""Golden runs: a small memory-bound scenario's summary and event log against checked-in files.

Regenerate after an intended behaviour change with
`SPECSIM_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/test_engine_golden.py` and
review the diff like code.
"""
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from core.config import EngineConfig, load_hardware, load_model, load_policy
from policies import make_policy
from sim.engine.acceptance import AcceptanceModel
from sim.engine.budget import block_layout, memory_budget
from sim.engine.core import run_engine
from sim.engine.metrics import summarize
from sim.engine.pool import PagedPool
from sim.pricing.analytic import AnalyticLatencyModel
from sim.pricing.constant import ConstantLatencyModel
from workloads.base import RequestSpec

GOLDEN = Path(__file__).parent / "golden"
SIG_DIGITS = 10  # floats compared after rounding: robust to last-bit differences across platforms


def _round(x):
    if isinstance(x, float):
        return float(f"{x:.{SIG_DIGITS}g}")
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_round(v) for v in x]
    return x


def golden_run(policy: str, latency: str) -> dict:
    model, hw = load_model("qwen3.5-35b-a3b"), load_hardware("h200")
    engine = EngineConfig(gmu=0.6)
    pol = make_policy(model, load_policy(policy))
    layout = replace(block_layout(model, pol, memory_budget(model, hw, engine).pool_bytes), num_blocks=60)
    lat = ConstantLatencyModel(0.02) if latency == "constant" else AnalyticLatencyModel(model, hw, pol, engine)
    specs = [RequestSpec(i, 100 + 97 * i % 1500, 200 + 131 * i % 900) for i in range(24)]
    res = run_engine(specs, pool=PagedPool(layout), policy=pol, latency=lat,
                     acceptance=AcceptanceModel(pol.tree.widths, seed=11), max_num_batched_tokens=2048,
                     max_num_seqs=64, arrivals=[0.05 * i for i in range(24)], max_concurrency=12, trace=True)
    return _round({"summary": summarize(res.requests, res.steps, res.duration_s),
                   "events": [list(e) for e in res.steps.events]})


@pytest.mark.parametrize("policy,latency", [("store_all", "constant"), ("replay", "analytic")])
def test_golden(policy, latency):
    path = GOLDEN / f"engine_{policy}_{latency}.json"
    got = golden_run(policy, latency)
    if os.environ.get("SPECSIM_REGEN_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, indent=1) + "\n")
    expected = json.loads(path.read_text())
    assert got["summary"] == expected["summary"]
    assert got["events"] == expected["events"]
