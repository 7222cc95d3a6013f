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
# GPU targets need an interpreter with CUDA torch + triton. On the device machine
# that is the image's python3: `make bench-kernels GPU_PY=python3`.
GPU_PY    ?= $(PY)
GPU       ?= h200

.PHONY: help venv dev test test-slow test-gpu sweep figures calibrate calibrate-validate \
        bench bench-sim bench-kernels clean

help:
	@echo "make sweep WORKLOAD=sharegpt   main job: grid sweep + figures on the committed calibration"
	@echo "make test                      fast CPU tests (kernels through TRITON_INTERPRET=1)"
	@echo "make test-slow / test-gpu      long tests / tests that need a CUDA GPU"
	@echo "make bench-sim                 simulator speed; make bench-kernels GPU_PY=python3 on a GPU"
	@echo "make calibrate GPU_PY=python3  measure layers on a GPU into results/calibration/$(GPU)"

venv: $(VENV)/.base-stamp
dev: $(VENV)/.dev-stamp

# The simulator's dependencies only: no torch, no triton.
$(VENV)/.base-stamp: pyproject.toml
	@test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	@touch $@

# Tests and kernels: pytest, hypothesis, dask, torch (CPU build) and triton.
$(VENV)/.dev-stamp: $(VENV)/.base-stamp
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

test: dev
	TRITON_INTERPRET=1 $(PY) -m pytest

test-slow: dev
	TRITON_INTERPRET=1 $(PY) -m pytest -m slow

test-gpu:
	$(GPU_PY) -m pytest -m gpu -p no:cacheprovider

sweep: venv
	$(PY) -m sim sweep --workload $(WORKLOAD) --grid $(GRID) --hardware $(HARDWARE) \
	  $(if $(MODEL),--model $(MODEL)) $(if $(JOBS),--jobs $(JOBS)) --out $(SWEEP_OUT)
	$(PY) -m sim figures --sweep $(SWEEP_OUT)

figures: venv
	$(PY) -m sim figures --sweep $(SWEEP_OUT)

bench: bench-sim

bench-sim: venv
	$(PY) -m sim bench

bench-kernels:
	$(GPU_PY) -m policies.kernels.bench --out results/calibration/$(GPU)

calibrate:
	$(GPU_PY) -m sim calibrate measure --gpu $(GPU) $(CALIBRATE_ARGS)

calibrate-validate: venv
	$(PY) -m sim calibrate validate --gpu $(GPU)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
