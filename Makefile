# Two commands do everything on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo demo-full test clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[dev,deepspeed,logging]'
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/vlp demo --out demo_out

demo-full: setup
	$(VENV)/bin/vlp demo --full --out demo_full

test: setup
	$(PY) -m pytest

clean:
	rm -rf demo_out demo_full .pytest_cache
