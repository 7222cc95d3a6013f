"""The step trace (`specsim run --trace-steps` -> steps.csv) and vLLM's dispatch rule."""
import csv
from collections import Counter

import pytest

from core.config import EngineConfig, RunConfig, load_hardware, load_model, load_policy
from policies import make_policy
from sim.pricing.dispatch import capture_sizes, dispatch
from sim.pricing.factory import make_latency_model
from sim.runs.run import simulate
from sim.engine.step_trace import (StepTraceError, TracedRequest, TracedStep, batch_of, read_steps, write_steps)


# ------------------------------------------------------------------ dispatch
def test_capture_sizes_rounded_to_the_verify_length_and_capped():
    # k = 3: multiples of 4 up to min(1024 x 4 x 2, 512, 8192) = 512
    sizes = capture_sizes(1024, 8192, 4)
    assert sizes[:4] == (4, 8, 16, 24) and sizes[-1] == 512 and all(s % 4 == 0 for s in sizes)
    assert 260 not in sizes and 272 in sizes  # above 256 the base list steps by 16
    # no speculation: vLLM's base list; max_num_seqs x 2 and the token budget cap it
    assert capture_sizes(1024, 8192, 1)[:5] == (1, 2, 4, 8, 16)
    assert capture_sizes(8, 8192, 1)[-1] == 16
    assert capture_sizes(1024, 100, 1)[-1] == 96


SIZES = capture_sizes(1024, 8192, 4)


@pytest.mark.parametrize("lens, decoding, kind, mode, padded", [
    ([4] * 5, [True] * 5, "uniform_decode", "full", 24),
    ([4] * 4, [True] * 4, "uniform_decode", "full", 16),
    ([4] * 129, [True] * 129, "uniform_decode", "eager", 516),  # above the largest capture size
    ([4, 4, 1], [True] * 3, "mixed_graph", "piecewise", 16),  # a 1-token decode breaks uniformity
    ([4, 4, 100], [True, True, False], "mixed_graph", "piecewise", 112),
    ([4, 600], [True, False], "mixed_eager", "eager", 604),
    ([300], [False], "prefill_only", "piecewise", 304),
    ([3000, 10], [False, False], "prefill_only", "eager", 3010),
], ids=["decode5", "decode4", "decode129", "onetoken", "mixed", "mixed-big", "prefill", "prefill-big"])
def test_dispatch_rule(lens, decoding, kind, mode, padded):
    d = dispatch(lens, decoding, 4, SIZES)
    assert (d.kind, d.mode, d.padded_tokens) == (kind, mode, padded)


def test_tree_that_breaks_full_graphs_runs_uniform_decode_piecewise():
    assert dispatch([4] * 5, [True] * 5, 4, SIZES, full_graph_ok=False).mode == "piecewise"


# ------------------------------------------------------------------ the file
def _step(i: int, kind: str = "mixed_graph") -> TracedStep:
    reqs = (TracedRequest(7, 0, 120, (1, 1, 1), 3), TracedRequest(9, 64, 512, (), 0),
            TracedRequest(11, 0, 40, (), 1), TracedRequest(12, 0, 41, (1, 1, 1), 4, replayed=6, flush=False))
    return TracedStep(i, 0.25 * i, kind, reqs, 1234.5 + i, {"gdn": 1000.0, "overhead": 234.5 + i})


def test_round_trip(tmp_path):
    meta = {"model": "qwen3.5-35b-a3b", "engine": {"max_num_seqs": 1024}}
    steps = [_step(0), _step(1, "prefill_only")]
    write_steps(tmp_path / "steps.csv", meta, steps)
    back_meta, back = read_steps(tmp_path / "steps.csv")
    assert back_meta == meta and back == steps
    assert back[0].requests[0].query_tokens == 4 and back[0].requests[1].query_tokens == 64


def _bad(tmp_path, edit):
    path = tmp_path / "steps.csv"
    write_steps(path, {}, [_step(0)])
    lines = path.read_text().splitlines()
    edit(lines)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(StepTraceError) as e:
        read_steps(path)
    return str(e.value)


@pytest.mark.parametrize("edit, needle", [
    (lambda ls: ls.__setitem__(0, "step,time_s"), "line 1 must start with"),
    (lambda ls: ls.__setitem__(0, "# specsim-steps v1 {oops"), "meta is not valid JSON"),
    (lambda ls: ls.__setitem__(1, ls[1].replace("predicted_us", "pred")), "missing columns ['predicted_us']"),
    (lambda ls: ls.__setitem__(2, ls[2].replace("mixed_graph", "chunked")), "kind 'chunked' is not one of"),
    (lambda ls: ls.__setitem__(2, ls[2].replace("[7,0,120,[1,1,1],3,0,1]", "[7,0,120,[1,1,1],3]")),
     "each request must be a list of 7 values"),
    (lambda ls: ls.__setitem__(2, ls[2].replace("[7,0,120,[1,1,1],3,0,1]", "[7,0,-5,[1,1,1],3,0,1]")),
     "'context' must be a non-negative integer"),
    (lambda ls: ls.__setitem__(2, ls[2].replace("[9,64,512,[],0,0,1]", "[9,64,512,[1],0,0,1]")),
     "a prefill chunk (64 tokens) verifies no tree"),
    (lambda ls: ls.__setitem__(2, "0,0.0,mixed_graph,4,73,64,x,1000.0,234.5," + ls[2].split(",", 9)[9]),
     "bad predicted_us ('x')"),
    (lambda ls: ls.__setitem__(2, ls[2].replace(",73,64,", ",70,64,")), "num_tokens is '70' but the requests add up to 73"),
], ids=["magic", "meta", "column", "kind", "fields", "negative", "prefill-tree", "number", "sums"])
def test_bad_files_name_line_and_field(tmp_path, edit, needle):
    msg = _bad(tmp_path, edit)
    assert needle in msg and str(tmp_path / "steps.csv") in msg


def test_missing_file(tmp_path):
    with pytest.raises(StepTraceError, match="no such steps file"):
        read_steps(tmp_path / "nope.csv")


# ------------------------------------------------------------------ a traced run
@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cfg = RunConfig.model_validate({"workload": "sharegpt", "num_requests": 60, "policy": "replay",
                                    # synchronous: every traced verify completes (async discards some)
                                    "engine": {"gmu": 0.6, "async_scheduling": False},
                                    "client": {"max_concurrency": 32}, "trace_steps": True})
    summary = simulate(cfg, out)
    with (out / "requests.csv").open(newline="") as f:
        summary["spec_steps"] = sum(int(r["spec_steps"]) for r in csv.DictReader(f))
    return summary, *read_steps(out / "steps.csv")


def test_trace_has_every_step_and_accepted_counts(traced):
    summary, meta, steps = traced
    assert len(steps) == summary["num_steps"] and [s.step for s in steps] == list(range(len(steps)))
    assert meta["policy"] == "replay" and meta["engine"]["max_num_seqs"] == 1024  # resolved from the hardware
    verifies = [r for s in steps for r in s.requests if r.tree]
    assert verifies and all(1 <= r.accepted <= 4 for r in verifies)
    # The same draws the summary averaged; under async scheduling each finishing request adds one
    # discarded verify (traced with the bonus token only), which the summary does not count.
    reported = sum(r.accepted for r in verifies) - (len(verifies) - summary["spec_steps"])
    assert reported / summary["spec_steps"] == pytest.approx(summary["mean_accepted_len"])
    assert any(r.replayed for r in verifies) and any(not r.flush for r in verifies)
    assert all(r.accepted == 0 for s in steps for r in s.requests if r.prefill)
    kinds = Counter(s.kind for s in steps)
    assert kinds["uniform_decode"] and kinds["mixed_graph"] and kinds["prefill_only"]
    assert sum(s.predicted_us for s in steps) * 1e-6 == pytest.approx(summary["mean_step_time_s"] * len(steps))


def test_batch_of_reprices_every_step_exactly(traced):
    _, meta, steps = traced
    model = load_model(meta["model"])
    policy = make_policy(model, load_policy(meta["policy"], meta["policy_overrides"]))
    engine = EngineConfig.model_validate(meta["engine"])
    latency = make_latency_model(model, load_hardware(meta["hardware"]), policy, engine)
    for s in steps:
        b = batch_of(s, model, policy, engine)
        assert b.kind == s.kind and b.num_seqs == len(s.requests)
        st = latency.step_time(b)
        assert st.total_s * 1e6 == pytest.approx(s.predicted_us, rel=1e-9)
        assert {t: v * 1e6 for t, v in st.terms.items()} == pytest.approx(s.terms_us, rel=1e-9, abs=1e-9)


def test_batch_of_needs_resolved_engine(traced):
    _, meta, steps = traced
    model = load_model(meta["model"])
    policy = make_policy(model, load_policy(meta["policy"]))
    with pytest.raises(StepTraceError, match="max_num_seqs"):
        batch_of(steps[0], model, policy, EngineConfig())

