# Two commands for a newcomer: `make run` (set up, run the default comparison job) and
# `make test` (set up, run the test suite). Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-fast bench setup clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch==2.13.0 is pinned in the extra; a looser pin would pull several GB of CUDA packages.
	$(PY) -m pip install --quiet -e '.[paddle,torch,dev]'
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(PY) -m unitrain -m backend=paddle,torch

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) build dist *.egg-info runs multirun outputs
