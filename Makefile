# gdn-specsim. Every target creates .venv on first use; only Python 3.11 is needed.
PYTHON3   ?= python3
VENV      ?= .venv
PY        := $(VENV)/bin/python
WORKLOAD  ?= sharegpt
GRID      ?= configs/grids/paper.yaml
MODEL     ?=
HARDWARE  ?= h200
JOBS      ?=
SWEEP_OUT ?= results/sweeps/$(WORKLOAD)
# Extra `specsim sweep` arguments, e.g. ARGS='--set workload_overrides.path=FILE'; PROGRESS=0: no progress output.
ARGS      ?=
PROGRESS  ?= 1
# Where pip looks for torch first when `make dev`/`make test` install it. Empty: pip's own
# configuration (here it finds a local CPU wheel). On a machine without one, pass
# TORCH_INDEX=https://download.pytorch.org/whl/cpu, or pip takes the default Linux torch
# wheel from PyPI with its CUDA libraries (several GB).
TORCH_INDEX ?=
# GPU targets need an interpreter with CUDA torch + triton. On the device machine
# that is the image's python3: `make bench-kernels GPU_PY=python3`.
GPU_PY    ?= $(PY)
GPU       ?= h200

.PHONY: help venv dev test test-slow test-gpu sweep figures plan-example calibrate calibrate-validate \
        bench bench-sim bench-kernels docs replay-steps validate carry clean

help:
	@echo "make sweep WORKLOAD=sharegpt   main job: grid sweep + figures on the committed calibration"
	@echo "make figures WORKLOAD=sharegpt redraw a sweep's figures and report.md from its points"
	@echo "make test                      the CPU test suite, what CI runs (kernels through TRITON_INTERPRET=1)"
	@echo "make test-slow / test-gpu      long tests / tests that need a CUDA GPU"
	@echo "make bench-sim [BENCH_VS=DIR]  simulator speed (paired with another checkout); make bench-kernels GPU_PY=python3 on a GPU"
	@echo "make calibrate GPU_PY=python3  measure layers on a GPU into results/calibration/$(GPU) (MODEL=<name>: one model)"
	@echo "make validate                  simulate the published vLLM runs of validation/real -> results/validation"
	@echo "make plan-example              specsim plan's worked example (20 configurations on ShareGPT) into docs/plan/"
	@echo "make docs                      rerun the README's sweeps and runs into docs/ and rewrite its numbers"
	@echo "make replay-steps              the 18 traced runs that calibrate replay executes (runs/replay/)"
	@echo "make carry                     the GPU machine's packages as .carry-a/ and .carry-b/ (pip download; CARRY_WHEELS=DIR: no download)"

venv: $(VENV)/.base-stamp
dev: $(VENV)/.dev-stamp

# The simulator's dependencies only: no torch, no triton.
$(VENV)/.base-stamp: pyproject.toml
	@test -x $(PY) || { echo "creating $(VENV) with $(PYTHON3)"; $(PYTHON3) -m venv $(VENV); }
	@echo "installing the simulator's dependencies into $(VENV) (numpy, pandas, matplotlib, simpy, ...; no torch): about a minute the first time"
	$(PY) -m pip install --progress-bar off --upgrade pip
	$(PY) -m pip install --progress-bar off -e .
	@touch $@
	@echo "$(VENV) ready: run the simulator as $(VENV)/bin/specsim (or activate: . $(VENV)/bin/activate)"

# Tests and kernels: pytest, hypothesis, dask, torch (CPU build) and triton.
$(VENV)/.dev-stamp: $(VENV)/.base-stamp
	@echo "installing the test and kernel extras into $(VENV): pytest, hypothesis, dask, triton and torch 2.13$(if $(TORCH_INDEX), from $(TORCH_INDEX))"
	$(PY) -m pip install --progress-bar off -e '.[dev]' $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	@touch $@

test: dev
	TRITON_INTERPRET=1 $(PY) -m pytest

test-slow: dev
	TRITON_INTERPRET=1 $(PY) -m pytest -m slow

test-gpu:
	$(GPU_PY) -m pytest -m gpu -p no:cacheprovider

# A sweep with failed points exits 1: the figures of the others are still drawn, then make fails.
sweep: venv
	$(PY) -m sim sweep --workload $(WORKLOAD) --grid $(GRID) --hardware $(HARDWARE) \
	  $(if $(MODEL),--model $(MODEL)) $(if $(JOBS),--jobs $(JOBS)) $(if $(filter 0,$(PROGRESS)),--no-progress) \
	  --out $(SWEEP_OUT) $(ARGS); rc=$$?; [ $$rc -le 1 ] || exit $$rc; \
	$(PY) -m sim figures --sweep $(SWEEP_OUT) && exit $$rc

figures: venv
	$(PY) -m sim figures --sweep $(SWEEP_OUT)

# specsim plan's worked example (docs/plan.md): Qwen3.5-35B-A3B on the H200, ShareGPT, p99 TTFT <= 2 s
# and mean TPOT <= 50 ms, the five policies x gmu 0.75 / 0.9 x max_num_seqs 256 / 1024, GPUs for
# 100 req/s, and a dense rate sweep of the best configuration. Probes are cached in PLAN_OUT.
PLAN_OUT ?= results/plans/qwen3.5-35b-a3b-h200-sharegpt
plan-example: venv
	$(PY) -m sim plan --workload sharegpt --model qwen3.5-35b-a3b --hardware h200 \
	  --slo ttft_p99=2s --slo tpot_mean=50ms --gmu 0.75 0.9 --max-num-seqs 256 1024 --rate 100 --dense-check \
	  $(if $(JOBS),--jobs $(JOBS)) $(if $(filter 0,$(PROGRESS)),--no-progress) --out $(PLAN_OUT)
	rm -rf docs/plan && mkdir -p docs/plan
	cp $(PLAN_OUT)/plan.csv $(PLAN_OUT)/plan.json $(PLAN_OUT)/plan.png $(PLAN_OUT)/plan.pdf $(PLAN_OUT)/report.md docs/plan/

# The published vLLM runs (validation/real/) on the committed calibration: validation.csv,
# validation.json, figures/validation.png and one run folder per case.
VALIDATION_OUT ?= results/validation
validate: venv
	$(PY) -m sim validate --real validation/real --out $(VALIDATION_OUT)

bench: bench-sim

# BENCH_VS=DIR: another checkout of the project, each case run there too, in turn, and the ratios printed;
# BENCH_ARGS: more `specsim bench` options (--cases, --runs N, --out FILE).
BENCH_VS   ?=
BENCH_ARGS ?=
bench-sim: venv
	$(PY) -m sim bench $(if $(BENCH_VS),--vs $(BENCH_VS)) $(BENCH_ARGS)

bench-kernels:
	$(GPU_PY) -m policies.kernels.bench --out results/calibration/$(GPU)

# MODEL=<name>: one model config (e.g. one `specsim model import` wrote), at its tensor-parallel shard shapes.
calibrate:
	$(GPU_PY) -m sim calibrate measure --gpu $(GPU) $(if $(MODEL),--model $(MODEL)) $(CALIBRATE_ARGS)

calibrate-validate: venv
	$(PY) -m sim calibrate validate --gpu $(GPU)

# The README's numbers and figures: the paper and trees sweeps on sharegpt and one run per policy
# (sim/readme.py names them), copied into docs/ (committed), then the README's generated blocks
# rewritten from them. From a committed tree only: the sweeps record the commit they ran from.
docs: venv
	@test -z "$$(git status --porcelain --untracked-files=no)" || { \
	  echo "make docs: the tree has uncommitted changes; commit them first (docs/ records the commit it was made from)"; exit 1; }
	# the plan first: it records the commit, and the sweeps below leave docs/ changed until committed
	$(MAKE) plan-example
	$(MAKE) sweep WORKLOAD=sharegpt SWEEP_OUT=results/sweeps/sharegpt
	$(MAKE) sweep WORKLOAD=sharegpt GRID=configs/grids/trees.yaml SWEEP_OUT=results/sweeps/sharegpt-trees
	rm -rf docs/sweeps docs/runs && mkdir -p docs/runs
	for s in sharegpt sharegpt-trees; do \
	  mkdir -p docs/sweeps/$$s && cp -r results/sweeps/$$s/points.csv results/sweeps/$$s/sweep.json \
	    results/sweeps/$$s/report.md results/sweeps/$$s/figures docs/sweeps/$$s/ || exit 1; done
	w=$$($(PY) -c 'from sim.readme import RUN_WORKLOAD; print(RUN_WORKLOAD)'); \
	for p in $$($(PY) -c 'from sim.readme import RUN_POLICIES; print(*RUN_POLICIES)'); do \
	  $(PY) -m sim run $$($(PY) -c 'from sim.readme import RUN_ARGS; print(RUN_ARGS)') --policy $$p --workload $$w \
	    --out runs/docs/$$w-$$p > /dev/null && cp runs/docs/$$w-$$p/summary.json docs/runs/$$w-$$p.json || exit 1; done
	$(MAKE) validate VALIDATION_OUT=results/validation
	rm -rf docs/validation && mkdir -p docs/validation && cp -r results/validation/validation.csv \
	  results/validation/validation.json results/validation/figures docs/validation/
	# the simulator's speed, one run per case (exit 1 is a missed target: reported, not a failure)
	mkdir -p docs/bench && $(PY) -m sim bench --cases $$($(PY) -c 'from sim.readme import SPEED_CASES; print(*SPEED_CASES)') \
	  --out docs/bench/sim_speed.json; [ $$? -le 1 ]
	$(PY) -m sim report --readme --write README.md
	$(PY) -m sim report --readme --write docs/validation.md

# The traced runs the step replay executes (calibrate/replay/README.md): sharegpt, three policies x gmu 0.6 / 0.9
# x concurrency 1 / 32 / 128 (20, 150, 300 requests).
REPLAY_POLICIES := store_all reconstruct replay
replay-steps: venv
	for p in $(REPLAY_POLICIES); do for g in 0.6 0.9; do for c in 1:20 32:150 128:300; do \
	  $(PY) -m sim run --model qwen3.5-35b-a3b --hardware h200 --policy $$p --workload sharegpt --gmu $$g \
	    --concurrency $${c%%:*} --num-requests $${c##*:} --trace-steps --out runs/replay/$$p-g$$g-c$${c%%:*} \
	    > runs/replay/$$p-g$$g-c$${c%%:*}.log || exit 1; done; done; done

# The packages the GPU machine's image lacks, for two device commands (docs/vllm_kernels.md, "Carrying
# the CuTe DSL packages to the device"): the pinned wheels (calibrate/carry/pins.toml) downloaded into
# .carry-wheels/, or read from CARRY_WHEELS, then .carry-a/ and .carry-b/ built (xz -9e: minutes).
CARRY_WHEELS ?=
carry: venv
	$(PY) -m calibrate.carry.pack --out . $(if $(CARRY_WHEELS),--wheels $(CARRY_WHEELS))

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
