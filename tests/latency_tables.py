"""Synthetic calibration tables with known answers, and the CalibratedLatencyModel loaded over them:
the fixtures of the latency model's tests (test_calibrate_latency_model.py: loading and the eager-sum
pricing; test_calibrate_latency_pipeline.py: the pipeline pricing)."""
import csv

from core.config import EngineConfig, load_hardware, load_model, load_policy
from core.tables import COLUMNS, SAMPLER_COLUMNS, SEQS_COLUMNS, STEP_COLUMNS, TABLES
from policies import make_policy
from sim.pricing.analytic import AnalyticLatencyModel
from sim.pricing.calibrated import CalibratedLatencyModel
from sim.pricing.latency import StepBatch

MODEL = "qwen3.5-35b-a3b"
AXES = {"tokens": (1, 4, 16, 64, 256, 1024, 4096, 16384), "B": (1, 4, 16, 64, 256, 512), "P": (1, 4, 16, 64),
        "ctx": (256, 1024, 4096, 32768)}
PREFILL_CTX = (0, 4096, 32768)
EAGER = 3.0  # synthetic eager tables cost 3x graph ones


def known(table, r):
    """Synthetic microseconds per call: increasing in every axis."""
    if table == "attn_decode":
        return 4.0 + 0.01 * r["B"] * r["P"] + 1e-4 * r["B"] * r["ctx"]
    if table == "attn_prefill":
        return 8.0 + 1e-3 * r["tokens"] + 1e-6 * r["tokens"] * r["ctx"]
    if table == "gdn_prefill_varlen":
        return 35.0 + 0.01 * r["tokens"] + 2.0 * r["seqs"]
    if table == "sampler":  # top-k/top-p; random sampling costs half
        return 40.0 + 3.0 * r["rows"]
    return {"gdn": 20.0, "attn_proj": 15.0, "moe": 300.0, "mlp": 280.0, "lm_head": 250.0, "mtp_fc": 6.0,
            "gdn_prefill": 30.0}[table] + 0.01 * r["tokens"]


def write_csv(path, rows, columns):
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)


def make_tables(root, kernels=True, steps=True, skip=(), model=MODEL, sampler=True):
    """Every table of `model`'s calibration folder (its calibration_name) under root, and the GPU's
    sampler table for its vocabulary (with a decoy row set of another vocabulary and distribution)."""
    mdir = root / model
    mdir.mkdir(parents=True)
    if sampler:
        vocab = load_model(model).vocab_size
        write_csv(root / "sampler.csv", [
            {c: 0 for c in SAMPLER_COLUMNS} | {"sampling": s, "vocab": v, "dist": d, "rows": n, "mode": mode,
                                               "extra_us": k * known("sampler", {"rows": n}) * (1 if v == vocab else 9)}
            for s, d, k in (("top_k_top_p", "peaked", 1.0), ("top_k_top_p", "gaussian", 7.0), ("random", "gaussian", 0.5))
            for v in (vocab, 1000) for n in AXES["tokens"] for mode in ("graph", "eager")], SAMPLER_COLUMNS)
    for name, spec in TABLES.items():
        if name in skip:
            continue
        if spec.axes == ("tokens", "ctx"):
            points = [{"tokens": n, "ctx": c} for n in AXES["tokens"] for c in PREFILL_CTX]
        elif spec.axes == ("B", "P", "ctx"):
            points = [{"B": b, "P": p, "ctx": c} for b in AXES["B"] for p in AXES["P"] for c in AXES["ctx"]]
        elif spec.axes == ("tokens", "seqs"):
            points = [{"tokens": n, "seqs": q} for n in AXES["tokens"] for q in (1, 4, 16)]
        else:
            points = [{"tokens": n} for n in AXES["tokens"]]
        rows = []
        for mode, k in (("graph", 1.0), ("eager", EAGER)):
            for pt in points:
                r = {c: 0 for c in COLUMNS} | {"B": 1, "P": 1, "ctx": 0} | pt
                r["tokens"] = pt.get("tokens", r["B"] * r["P"])
                rows.append(r | {"mode": mode, "us": k * known(name, r)})
        write_csv(mdir / f"{name}.csv", rows, SEQS_COLUMNS if "seqs" in spec.axes else COLUMNS)
    if kernels:
        cols = ("model", "policy", "B", "T", "tree", "verify_us", "commit_us", "total_us", "mode")
        write_csv(root / "kernels.csv", [
            {"model": model, "policy": "store_all", "B": b, "T": 4, "tree": "(1, 1, 1)", "verify_us": 10 + b,
             "commit_us": 2 + 0.1 * b, "total_us": 12 + 1.1 * b, "mode": mode}
            for b in (1, 8, 64, 512) for mode in ("graph", "eager")], cols)
    if steps:
        write_csv(mdir / "step_check.csv", [
            {"mode": m, "B": 8, "P": 4, "ctx": 4096, "kernel": "store_all", "step_us": 1000.0,
             "host_step_us": 1000.0 + extra, "kernel_us": 5.0, "reps": 10}
            for m, extra in (("graph", 40.0), ("graph", 60.0), ("eager", 80.0))], STEP_COLUMNS)
    return root


def load(root, hw="h200", policy="store_all", fallback=True, pricing="eager_sum", policy_update=None, **engine):
    m = load_model(MODEL)
    h = load_hardware(hw).model_copy(update={"calibration_dir": str(root)})
    pol = make_policy(m, load_policy(policy).model_copy(update=policy_update or {}))
    eng = EngineConfig(latency_pricing=pricing, **engine)
    fb = AnalyticLatencyModel(m, h, pol, eng) if fallback else None
    return CalibratedLatencyModel.load(m, h, pol, eng, fallback=fb)


def decode(b, ctx=4096, eager=False, p=4):
    return StepBatch(num_seqs=b, prefill_tokens=0, prefill_seqs=0, decode_seqs=b, spec_seqs=b, verify_positions=p,
                     context_tokens=b * ctx, max_context=ctx, eager=eager, draft_depth=3)
