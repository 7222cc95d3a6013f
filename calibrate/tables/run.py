"""`specsim calibrate measure`: time every job of a model on this machine's GPU.

Writes `<out>/<model>/<table>.csv`, `memory.json`, `step_check.csv`, the model's policy kernels
(`kernels.csv`, the kernel bench at its shard shapes) and appends this
run to `<out>/<model>/provenance.json`. A job that fails is logged and skipped, so
one bad table does not cost the whole GPU run; the exit status says so.
"""
from __future__ import annotations

import gc
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

from calibrate.device import provenance
from calibrate.model.gdn_prefill_kernel import load_gdn_prefill
from calibrate.tables.grid import FULL, QUICK, Grid, model_jobs
from core.config import HardwareConfig, ModelConfig, load_policy, policy_names
from core.tables import DECODE_CONV, DECODE_CONV_COLUMNS, STEP_COLUMNS, read_rows, write_rows


GDN_PREFILL_DEADLINE_S = 45.0  # fla autotunes, FlashInfer compiles, each new shape; bound the job's device time
# The kernels job: the policies' verify and commit kernels at the model's shard shapes, the chain the
# simulator runs by default and the widest study tree first, batches spread before they fill in.
KERNEL_TREES = "1,1,1;3,3,3;2,2,2;chain"
KERNEL_BATCHES = (8, 128, 1, 32, 256, 64)


def kernel_rows(model: ModelConfig, mdir: Path, modes: tuple[str, ...], commit: str | None,
                budget_s: float | None) -> int:
    """Run the kernel bench (policies/kernels/bench.py) for this model alone into <model>/kernels.csv,
    which the latency model reads before the GPU's shared kernels.csv; returns the rows written."""
    from policies.kernels import bench
    from policies.kernels.bench_cases import BATCHES

    batches = ",".join(str(b) for b in KERNEL_BATCHES if b in BATCHES)
    argv = ["--out", str(mdir), "--stem", "kernels", "--models", model.name, "--state-dtype", model.mamba_ssm_dtype,
            "--modes", ",".join(modes), "--trees", KERNEL_TREES, "--batches", batches, "--no-fla",
            "--kernel-ts", "", "--git-commit", commit or "unknown"]
    if budget_s is not None:
        argv += ["--budget-s", str(max(1.0, budget_s))]
    try:
        rc = bench.main(argv)
    except SystemExit as e:  # argparse's refusal (e.g. a state dtype the kernels do not take)
        rc = e.code
    if rc:
        raise RuntimeError(f"kernel bench {' '.join(argv)} exited {rc}")
    return len(read_rows(mdir / "kernels.csv", ("model",)))


def measure(model: ModelConfig, hw: HardwareConfig, jobs: tuple[str, ...], out: Path, *, quick: bool = False,
            device: str = "cuda", modes: tuple[str, ...] = ("graph", "eager"), commit: str | None = None,
            time_budget_s: float | None = None, step_policy: str = "store_all", grid: Grid | None = None,
            attn_backend: str = "triton", fp8_gemm: str = "auto",
            log: Callable[[str], None] = print, on_job_done: Callable[[], None] = lambda: None) -> int:
    import torch

    from calibrate.device.timing import copy_bandwidth_gbs, matmul_tflops
    from calibrate.model.fp8_linear import pick_gemm
    from calibrate.model.layers_fp8 import fp8_kernel_names
    from calibrate.model.shapes import LayerShapes
    from calibrate.tables import measure as M
    from calibrate.tables import stepcheck
    from calibrate.tables.host import HostProbe

    t0 = time.perf_counter()
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("calibrate measure: no CUDA device here (use --device cpu only for tiny test grids)")
    grid = grid or (QUICK if quick else FULL)
    jobs = model_jobs(jobs, model.dense)
    env = provenance.environment(device)
    cuda = dev.type == "cuda"
    bw = copy_bandwidth_gbs(dev) if cuda else hw.hbm_bandwidth_gbs
    tflops = matmul_tflops(dev) if cuda else hw.bf16_tflops
    log(f"{model.name} on {env['gpu']}: copy {bw:.0f} GB/s, bf16 matmul {tflops:.0f} TFLOP/s; jobs {', '.join(jobs)}")
    # The host's launch speed before and after the tables (it drifts within a call): each row's host_us is
    # read against it.
    probe = HostProbe(dev) if cuda else None
    probes = {"start": probe()} if probe else {}
    fa4 = load_attention(attn_backend, cuda)
    shapes = LayerShapes.from_model(model)
    h = M.Harness(shapes, grid, dev, modes, bw, tflops, log=log, rotate_bytes=M.ROTATE_BYTES if cuda else 0,
                  min_copies=3 if cuda else 1, fa4=fa4, fp8_gemm=pick_gemm(fp8_gemm, dev, log) if shapes.fp8 else None)
    mdir = out / model.name
    done, errors, skipped = {}, [], []
    earlier = provenance.read(mdir / "provenance.json").get("parts", [])

    def write_part(finished: bool) -> None:
        """This run's provenance part after the earlier runs' (rewritten after every job; `finished`
        false until the last job is done, and then the host probe's end reading is taken)."""
        part = {**env, "git_commit": commit, "command": " ".join(sys.argv), "grid": grid.name,
                "modes": list(modes), "copy_bandwidth_gbs": round(bw, 1), "matmul_tflops": round(tflops, 1),
                "jobs": done, "packaged_kernels": packaged, "skipped": skipped, "errors": errors,
                "wall_s": round(time.perf_counter() - t0, 1), "finished": finished}
        if probe:
            part["host_probe_us"] = {**probes, "end": probe()} if finished else dict(probes)
        part["device_time_s"] = part["wall_s"]  # this command's GPU time; merge replaces it with a lease's figure
        provenance.write(mdir / "provenance.json", {"model": model.name, "parts": [*earlier, part]})
    interrupted = False
    packaged: dict[str, str] = {}  # table -> the packaged kernel that priced it, where there is a choice
    if h.fp8_gemm is not None:
        packaged.update(fp8_kernel_names(h.shapes, h.fp8_gemm, jobs))
    elif "moe" in jobs and cuda and h.shapes.num_experts:
        packaged["moe"] = moe_kernel_name(h.shapes)
    if fa4 is not None:
        packaged.update({t: f"flash-attn-4 {_version('flash-attn-4')}" for t in ("attn_decode", "attn_prefill")
                         if t in jobs})
    with torch.inference_mode():
        for job in jobs:
            if time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
                skipped.append(f"{job}: time budget {time_budget_s:.0f} s spent")
                log(f"skip {job}: time budget spent")
                continue
            tj = time.perf_counter()
            log(f"[{job}]")
            try:
                if job == "memory":
                    provenance.write(mdir / "memory.json", stepcheck.memory_report(h, model, hw.max_num_seqs))
                    done[job] = 1
                elif job == "step_check":
                    rows = stepcheck.step_check(h, step_policy)
                    write_rows(mdir / "step_check.csv", rows, STEP_COLUMNS)
                    done[job] = len(rows)
                elif job == "gdn_prefill":
                    kernel, chunk_fn = load_gdn_prefill()
                    if chunk_fn is None:
                        skipped.append("gdn_prefill: neither FlashInfer nor flash-linear-attention (fla) importable")
                        log("skip gdn_prefill: neither FlashInfer nor flash-linear-attention (fla) importable")
                        continue
                    log(f"  gdn_prefill kernel: {kernel}")
                    packaged["gdn_prefill"] = kernel
                    rows = M.gdn_prefill_table(h, chunk_fn, deadline_s=GDN_PREFILL_DEADLINE_S)
                    write_rows(mdir / "gdn_prefill.csv", rows)
                    done[job] = len(rows)
                elif job == "kernels":
                    if not cuda:
                        skipped.append("kernels: the kernel bench needs a CUDA GPU")
                        log("skip kernels: the kernel bench needs a CUDA GPU")
                        continue
                    left = time_budget_s - (time.perf_counter() - t0) if time_budget_s is not None else None
                    rows = kernel_rows(model, mdir, modes, commit, left)
                    done[job] = rows
                elif job == DECODE_CONV:
                    from calibrate.tables.decode_conv import decode_conv_executor, gdn_decode_conv_table

                    # The executor runs the speculating policies' cores; `none` has its own rows below.
                    pols = [p for p in map(load_policy, policy_names()) if p.mamba_state_commit != "none"]
                    ex = decode_conv_executor(model, hw, pols[0], dev, log)
                    # On the CPU (tests) the interpreter runs the kernels: the shortest table will do.
                    rows = gdn_decode_conv_table(ex, pols, bw, log, reps=20 if cuda else 1,
                                                 batches=None if cuda else 2)
                    del ex
                    from calibrate.tables.decode_conv_none import BATCHES, none_decode_conv_rows
                    rows += none_decode_conv_rows(model, dev, bw, reps=20 if cuda else 1,
                                                  batches=BATCHES if cuda else BATCHES[:2], log=log)
                    write_rows(mdir / f"{DECODE_CONV}.csv", rows, DECODE_CONV_COLUMNS)
                    done[job] = len(rows)
                else:
                    rows = M.TABLE_JOBS[job](h)
                    write_rows(mdir / f"{job}.csv", rows, M.TABLE_COLUMNS)
                    done[job] = len(rows)
                log(f"[{job}] done in {time.perf_counter() - tj:.1f} s")
            except Exception as e:  # keep measuring the other jobs; report this one
                errors.append(f"{job}: {type(e).__name__}: {e}")
                log(f"[{job}] FAILED: {traceback.format_exc()}")
            except KeyboardInterrupt:  # a time limit's SIGINT: the finished jobs' tables keep their provenance
                errors.append(f"{job}: interrupted after {time.perf_counter() - tj:.0f} s")
                log(f"[{job}] interrupted")
                interrupted = True
                break
            finally:
                gc.collect()
                if cuda:
                    torch.cuda.empty_cache()
            write_part(finished=False)  # a call cut off after this job keeps the provenance of its tables
            on_job_done()
    write_part(finished=True)
    on_job_done()
    log(f"{model.name}: {len(done)} jobs done, {len(errors)} failed, {len(skipped)} skipped in {time.perf_counter() - t0:.1f} s")
    if interrupted:  # no further model or job: the caller's limit is up
        raise KeyboardInterrupt
    return 1 if errors else 0


def moe_kernel_name(s: LayerShapes) -> str:
    """Our fused MoE and the launch configs it runs here: its tuned table's file, or the heuristic."""
    import torch

    from calibrate.kernels import moe_configs as MC
    name = MC.file_name(s.num_experts, s.expert_width, torch.cuda.get_device_name())
    found = (MC.TABLE_DIR / name).is_file()
    return f"calibrate/kernels/fused_moe.py, configs {'calibrate/kernels/moe_configs/' + name if found else 'default_config (no tuned table)'}"


ATTN_BACKENDS = ("triton", "fa4", "auto")


def load_attention(backend: str, cuda: bool) -> Callable[..., object] | None:
    """flash-attn-4's forward for the attention tables, or None for our Triton kernel. `fa4` insists on it,
    `auto` takes it where it imports (a GPU of compute capability 9.0+), `triton` is ours."""
    from calibrate.model.attention_backends import load_fa4

    if backend not in ATTN_BACKENDS:
        raise ValueError(f"attn_backend must be one of {', '.join(ATTN_BACKENDS)}, got {backend!r}")
    fa = load_fa4() if backend != "triton" and cuda else None
    if backend == "fa4" and fa is None:
        raise SystemExit("calibrate measure: --attn-backend fa4 but flash-attn-4 does not import here (or no GPU)")
    return fa


def _version(package: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"
