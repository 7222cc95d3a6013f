"""The GPU harness's shape logic and table schema, on tiny shapes on the CPU (eager mode)."""
import csv
import json

import pytest

torch = pytest.importorskip("torch")

from calibrate.model.shapes import LayerShapes  # noqa: E402
from calibrate.tables.grid import ALL_JOBS, COARSE, FULL, GRIDS, Grid, jobs_for_part  # noqa: E402
from core.config import ModelConfig, load_hardware, load_model, validate  # noqa: E402
from core.tables import COLUMNS, DECODE_CONV_COLUMNS, STEP_COLUMNS, TABLES  # noqa: E402
from tiny_model import TINY, TINY_DENSE  # noqa: E402

# Small: every kernel here runs in the Triton interpreter, where an 8-token MoE call takes seconds.
GRID = Grid(tokens=(1, 2, 4), decode_b=(1, 2, 4), decode_p=(1, 2, 4), decode_ctx=(16, 32, 64),
            prefill_chunk=(8, 16, 32), prefill_ctx=(0, 16, 32), step_shapes=((2, 2, 16), (1, 4, 32)),
            activation_tokens=(8,), name="tiny")


class ShapeCheckingKernel:
    """Stands in for policies/kernels (timed by its own bench): checks the kernel interface's shapes."""

    calls = 0

    @classmethod
    def verify(cls, q, k, v, g, beta, parent, state, lengths=None):
        B, T, Hk, Dk = q.shape
        Hv, Dv = v.shape[2:]
        assert k.shape == q.shape and g.shape == beta.shape == (B, T, Hv) and parent.shape == (B, T)
        assert state.shape == (B, Hv, Dv, Dk) and Hv % Hk == 0 and (parent[:, 0] == -1).all()
        cls.calls += 1
        return v * 2, state

    @staticmethod
    def commit(ctx, accepted):
        assert accepted.dtype == torch.int32 and accepted.shape == ctx.shape[:1]
        return ctx


def fake_chunk(q, k, v, g, beta, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
               state_v_first=False):
    """Stands in for the GDN prefill kernel with fla's signature (grouped value heads, called as vLLM
    calls it: q/k norms in the kernel, state [N, Hv, V, K])."""
    B, T, H, Dk = q.shape
    Hv, Dv = v.shape[2:]
    assert k.shape == q.shape and v.shape[:2] == (B, T) and g.shape == beta.shape == (B, T, Hv) and Hv % H == 0
    assert initial_state.shape == (B, Hv, Dv, Dk) and output_final_state
    assert use_qk_l2norm_in_kernel and state_v_first
    return v, initial_state


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    from calibrate.tables import run, stepcheck
    from calibrate.tables.run import measure

    out = tmp_path_factory.mktemp("calib")
    model = validate(ModelConfig, TINY, "tiny")
    log = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stepcheck, "load_kernel", lambda name: ShapeCheckingKernel)
        mp.setattr(run, "load_gdn_prefill", lambda: ("fake 0.1", fake_chunk))
        rc = measure(model, load_hardware("h200"), ALL_JOBS, out, device="cpu", modes=("eager",), commit="abc123",
                     grid=GRID, log=log.append)
    return out / model.name, rc, log


def test_shapes_shard_like_vllm():
    s = LayerShapes.from_model(load_model("qwen3.5-397b-a17b"))
    assert (s.gdn_k_heads, s.gdn_v_heads, s.q_heads, s.kv_heads) == (2, 8, 4, 1)
    assert (s.num_experts, s.expert_width, s.vocab) == (512, 128, 31040)
    s35 = LayerShapes.from_model(load_model("qwen3.5-35b-a3b"))
    assert s35.gdn_in_features == 2 * 16 * 128 + 2 * 32 * 128 + 2 * 32
    assert s35.gdn_state_bytes * s35.gdn_layers == 30 << 20  # docs/design.md#the-commit-policies: 30 MiB per sequence


def test_shapes_refuse_indivisible_heads():
    m = validate(ModelConfig, {**TINY, "tensor_parallel": 3}, "tiny")
    with pytest.raises(ValueError, match="not divisible by tensor_parallel"):
        LayerShapes.from_model(m)


def test_coarse_grid_spans_the_full_grid_in_2x_steps():
    assert set(GRIDS) == {"full", "coarse", "quick"} and GRIDS["coarse"] is COARSE
    for axis in ("tokens", "decode_b", "prefill_chunk"):
        coarse, full = getattr(COARSE, axis), getattr(FULL, axis)
        assert (coarse[0], coarse[-1]) == (full[0], full[-1]) and set(coarse) <= set(full)
        assert all(b == 2 * a for a, b in zip(coarse, coarse[1:]))
    assert set(COARSE.decode_p) <= set(FULL.decode_p) and {1, 4, 64} <= set(COARSE.decode_p)
    assert COARSE.decode_ctx == FULL.decode_ctx
    assert COARSE.prefill_ctx == FULL.prefill_ctx and set(COARSE.step_shapes) < set(FULL.step_shapes)


def test_parts_cover_every_job_once():
    jobs = [j for p in (1, 2, 3) for j in jobs_for_part(p)]
    assert sorted(jobs) == sorted(ALL_JOBS) and len(set(jobs)) == len(jobs)
    with pytest.raises(ValueError, match="--part must be one of"):
        jobs_for_part(7)


def test_every_table_written_with_schema(measured):
    mdir, rc, log = measured
    assert rc == 0, "\n".join(log)
    for name, spec in TABLES.items():
        path = mdir / f"{name}.csv"
        if not spec.required and not path.exists():
            continue  # optional tables (gdn_prefill*, gdn_prefill_varlen) need fla or have no measure job here
        rows = list(csv.DictReader(path.open()))
        assert tuple(rows[0])[:len(COLUMNS)] == COLUMNS  # TABLE_JOBS add host_us
        assert all(float(r["us"]) > 0 and r["mode"] == "eager" for r in rows)
        for a in spec.axes:  # a full rectangular grid over the table's axes
            assert len({r[a] for r in rows}) > 1 or a == "ctx"
    decode = list(csv.DictReader((mdir / "attn_decode.csv").open()))
    assert len(decode) == len(GRID.decode_b) * len(GRID.decode_p) * len(GRID.decode_ctx)
    assert {int(r["tokens"]) for r in decode} == {b * p for b in GRID.decode_b for p in GRID.decode_p}


def test_decode_conv_table_per_policy(measured):
    from sim.pricing.calibration_tables import load_decode_conv

    mdir, _, _ = measured
    rows = list(csv.DictReader((mdir / "gdn_decode_conv.csv").open()))
    assert tuple(rows[0]) == DECODE_CONV_COLUMNS
    assert {r["policy"] for r in rows} == {"store_all", "reconstruct", "replay", "reconstruct_deferred", "none"}
    assert {int(r["P"]) for r in rows if r["policy"] == "none"} == {1}  # one token per request, no speculation
    assert all(int(r["tokens"]) == int(r["B"]) * int(r["P"]) and float(r["us"]) > 0 for r in rows)
    assert len({r["B"] for r in rows}) == 2  # the CPU's short table
    replay = {int(r["tokens"]): float(r["us"]) for r in rows if r["policy"] == "replay"}
    curve = load_decode_conv(mdir, "replay")  # one curve over decode tokens per policy
    assert all(curve(n) == pytest.approx(us) for n, us in replay.items())


def test_gdn_table_times_the_dense_halves_not_the_core(tmp_path):
    """The conv, gating and q/k norms are the core's (gdn_decode_conv, gdn_prefill_varlen): a gdn
    table that timed the torch stand-in of the whole layer priced them twice for prefill tokens."""
    from calibrate.model import layers
    from calibrate.tables.run import measure

    def whole_layer(*a, **k):
        raise AssertionError("the gdn table timed the whole layer")
    model = validate(ModelConfig, TINY, "tiny")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(layers, "gdn_forward", whole_layer)
        assert measure(model, load_hardware("h200"), ("gdn",), tmp_path, device="cpu", modes=("eager",),
                       commit="abc123", grid=GRID, log=lambda s: None) == 0
    rows = list(csv.DictReader((tmp_path / model.name / "gdn.csv").open()))
    assert len(rows) == len(GRID.tokens)


@pytest.mark.slow  # every job once more, for the dense model: minutes in the interpreter
def test_dense_model_measures_every_job_with_an_mlp_table(tmp_path):
    """A dense hybrid: the same jobs with an MLP table in place of the MoE's, the whole-step check and
    the decode core through the executor with the MLP after every layer."""
    from calibrate.tables import run, stepcheck
    from calibrate.tables.run import measure

    model = validate(ModelConfig, TINY_DENSE, "tiny dense")
    log = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stepcheck, "load_kernel", lambda name: ShapeCheckingKernel)
        mp.setattr(run, "load_fla_chunk", lambda: fake_chunk)
        rc = measure(model, load_hardware("h200"), ALL_JOBS, tmp_path, device="cpu", modes=("eager",),
                     commit="abc123", grid=GRID, log=log.append)
    mdir = tmp_path / model.name
    assert rc == 0, "\n".join(log)
    assert not (mdir / "moe.csv").exists()
    rows = list(csv.DictReader((mdir / "mlp.csv").open()))
    assert [int(r["tokens"]) for r in rows] == list(GRID.tokens)
    # the minimum work: gate_up and down GEMMs, their weights read once
    n, h, w = int(rows[-1]["tokens"]), 64, 48
    assert int(rows[-1]["flops"]) == 2 * n * h * 2 * w + 2 * n * w * h
    assert (mdir / "step_check.csv").exists() and (mdir / "gdn_decode_conv.csv").exists()
    part = json.loads((mdir / "provenance.json").read_text())["parts"][-1]
    assert "mlp" in part["jobs"] and "moe" not in part["jobs"] and part["errors"] == []


def test_a_time_limit_keeps_the_finished_tables_and_their_provenance(tmp_path):
    """SIGINT (a time limit) during a job: the jobs done before it keep their tables and the provenance
    says what was cut, then the interrupt goes on up (no further model is started)."""
    from calibrate.tables import measure as M
    from calibrate.tables.run import measure

    def cut(h):
        raise KeyboardInterrupt
    model = validate(ModelConfig, TINY, "tiny")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(M.TABLE_JOBS, "lm_head", cut)
        with pytest.raises(KeyboardInterrupt):
            measure(model, load_hardware("h200"), ("gdn", "lm_head", "mtp_fc"), tmp_path, device="cpu",
                    modes=("eager",), commit="abc123", grid=GRID, log=lambda s: None)
    mdir = tmp_path / model.name
    assert (mdir / "gdn.csv").exists() and not (mdir / "mtp_fc.csv").exists()
    part = json.loads((mdir / "provenance.json").read_text())["parts"][-1]
    assert list(part["jobs"]) == ["gdn"] and part["errors"][0].startswith("lm_head: interrupted")


def test_provenance_is_on_disk_after_every_job(tmp_path):
    """A call killed outright (no interrupt to catch) after a job still has that job's provenance: the
    part is rewritten after each job, `finished` only once every job is done; an earlier run's part stays."""
    from calibrate.tables.run import measure

    model = validate(ModelConfig, TINY, "tiny")
    mdir = tmp_path / model.name
    seen = []

    def snapshot():
        part = json.loads((mdir / "provenance.json").read_text())["parts"][-1]
        seen.append((list(part["jobs"]), part["finished"], part["git_commit"], part["grid"]))
    for commit in ("first", "second"):
        assert measure(model, load_hardware("h200"), ("gdn", "mtp_fc"), tmp_path, device="cpu", modes=("eager",),
                       commit=commit, grid=GRID, log=lambda s: None, on_job_done=snapshot) == 0
    assert seen[:3] == [(["gdn"], False, "first", "tiny"), (["gdn", "mtp_fc"], False, "first", "tiny"),
                        (["gdn", "mtp_fc"], True, "first", "tiny")]
    parts = json.loads((mdir / "provenance.json").read_text())["parts"]
    assert [(p["git_commit"], p["finished"]) for p in parts] == [("first", True), ("second", True)]


@pytest.mark.slow
def test_kernels_job_benches_the_models_shard_heads_into_its_folder(tmp_path):
    """The kernels job on the bench's CPU rehearsal (toy sizes, GDN_BENCH_REHEARSAL, set before the bench is
    imported, hence a child process): the model's own rows in <model>/kernels.csv, its state dtype."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; from pathlib import Path; from calibrate.tables.run import kernel_rows; "
            "from core.config import load_model; "
            "print(kernel_rows(load_model('qwen3-next-80b-a3b'), Path(sys.argv[1]), ('graph',), 'abc', 1.0))")
    env = {**os.environ, "GDN_BENCH_REHEARSAL": "1", "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "kernels.csv").open()))
    assert int(out.stdout.split()[-1]) == len(rows) > 0
    assert {r["model"] for r in rows} == {"qwen3-next-80b-a3b"} and {r["state_dtype"] for r in rows} == {"bfloat16"}
    assert {r["mode"] for r in rows} == {"graph"} and {r["tree"] for r in rows} == {"1,1,1"}


def test_step_check_and_memory(measured):
    mdir, _, _ = measured
    rows = list(csv.DictReader((mdir / "step_check.csv").open()))
    assert tuple(rows[0]) == STEP_COLUMNS and len(rows) == len(GRID.step_shapes)
    assert ShapeCheckingKernel.calls > 0 and {r["kernel"] for r in rows} == {"store_all"}
    assert all(float(r["step_us"]) > 0 for r in rows)
    mem = json.loads((mdir / "memory.json").read_text())
    for check in mem["checks"].values():
        assert check["measured_tensors"] > 0
    # Per-request state/KV bytes from the harness's tensors agree with the simulator's accounting.
    assert mem["checks"]["gdn_page_bytes_per_seq_per_layer"]["measured_tensors"] == \
        mem["checks"]["gdn_page_bytes_per_seq_per_layer"]["config"]
    assert mem["checks"]["kv_bytes_per_token_per_gpu"]["measured_tensors"] == \
        mem["checks"]["kv_bytes_per_token_per_gpu"]["config"]


def test_provenance_records_the_run(measured):
    from calibrate.device.provenance import missing_fields

    mdir, _, _ = measured
    part = json.loads((mdir / "provenance.json").read_text())["parts"][-1]
    assert part["git_commit"] == "abc123" and part["errors"] == [] and part["grid"] == "tiny"
    assert missing_fields(part) == ["driver"]  # no GPU driver on a CPU run
    assert part["packaged_kernels"] == {"gdn_prefill": "fake 0.1"}  # the packaged kernel that priced the table
