# Two commands do everything on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo demo-full test test-oldest lint format clean gpu-check gpu-check-compile gpu-wheels

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -c constraints.txt -e '.[dev,deepspeed,logging,export]'  # tested versions (docs/training.md)
	touch $@

setup: $(VENV)/.installed

# `make demo` again continues an interrupted demo from its checkpoint (a finished one: its table again);
# a demo stopped by a signal exits non-zero (128 + the signal), and so does make. `make clean` starts afresh.
demo: setup
	$(VENV)/bin/vlp demo --out demo_out --resume auto

demo-full: setup
	$(VENV)/bin/vlp demo --full --out demo_full --resume auto

test: setup
	$(PY) -m pytest --durations=15

# Dependency floors (docs/training.md, "Installing and upgrading dependencies"): the lower bounds of
# pyproject.toml, pinned in constraints-oldest.txt, in a virtualenv of their own (rebuilt from scratch
# when either file changes), and the fast half of the suite under them. Not part of .ci/run.
OLDEST_VENV ?= .venv-oldest

$(OLDEST_VENV)/.installed: pyproject.toml constraints-oldest.txt
	rm -rf $(OLDEST_VENV)
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install --upgrade pip
	$(OLDEST_VENV)/bin/python -m pip install -c constraints-oldest.txt -e '.[dev,logging]'
	touch $@

test-oldest: $(OLDEST_VENV)/.installed
	$(OLDEST_VENV)/bin/python -m pytest -m "not multiprocess" --durations=15

# Habits (docs/architecture.md, "Habits"): style and format (ruff), the layering (import contracts,
# import-linter), types (mypy: strict modules clean, the rest at a baseline that only tightens).
lint: setup
	$(VENV)/bin/ruff check vlp scripts tests
	$(VENV)/bin/ruff format --check vlp scripts tests
	$(VENV)/bin/lint-imports
	$(PY) scripts/lint/mypy_baseline.py
	$(PY) scripts/lint/habits.py

format: setup
	$(VENV)/bin/ruff check --fix vlp scripts tests
	$(VENV)/bin/ruff format vlp scripts tests

clean:
	rm -rf demo_out demo_full .pytest_cache

# A borrowed GPU (docs/performance.md, "A borrowed GPU: make gpu-check"). gpu-wheels, here: the wheels
# that machine lacks, into .whl/ (carry it). There, two commands of < 5 min each: gpu-check (environment,
# correctness, eager bench at batch 64 and 128, loader; gpu_check.json) and gpu-check-compile
# (train.compile=full and CUDA graphs; gpu_check_compile.json), results in $(OUT)/gpu-check when OUT
# is set (the device tool's folder), else runs/gpu-check; `make gpu-check GPU_CHECK_ARGS=--cpu` is the
# tiny CPU version. The venv's python where there is one, else python3.
GPU_CHECK_ARGS ?= $(if $(OUT),--out $(OUT)/gpu-check)

gpu-wheels:
	sh scripts/gpu/wheels.sh

gpu-check:
	GPU_PYTHON=$(if $(wildcard $(PY)),$(PY),python3) sh scripts/gpu/check.sh --part eager $(GPU_CHECK_ARGS)

gpu-check-compile:
	GPU_PYTHON=$(if $(wildcard $(PY)),$(PY),python3) sh scripts/gpu/check.sh --part compile $(GPU_CHECK_ARGS)
