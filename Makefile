# Two commands do all the set-up: `make demo` and `make test`.
# Each creates .venv (if missing or stale) and installs the pinned requirements.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
OUT ?= out/demo

.PHONY: demo test check test-torch lab lint unit package integration notebooks docs browser bench clean

$(STAMP): pyproject.toml requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m interactive_shard demo --out $(OUT)

test: $(STAMP) lint unit package integration notebooks docs browser  # docs: tests/browser/test_docs.py opens site/

check: $(STAMP) lint  # the quick whole: lint, unit and the integration tests not marked slow (< 5 min)
	$(PY) -m pytest tests/unit -q -m "not slow"
	$(PY) -m pytest tests/integration -q -m "not slow"

lint: $(STAMP)
	$(PY) -m ruff check interactive_shard tests benchmarks
	$(PY) -m ruff format --check interactive_shard tests benchmarks
	$(PY) -m mypy

unit: $(STAMP)
	$(PY) -m pytest tests/unit -q

package: $(STAMP)  # build the wheel and sdist, twine check, the demo from the wheel in a fresh venv
	$(PY) -m pytest tests/package -q

integration: $(STAMP)
	$(PY) -m pytest tests/integration -q

notebooks: $(STAMP)
	$(PY) -m pytest tests/notebooks -q

docs: $(STAMP)  # the docs site in site/ (README, docs/, notebooks with outputs, API); warnings fail
	$(PY) tools/gen_event_docs.py --check
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

browser: $(STAMP)
	$(PY) -m pytest tests/browser -q -rs

# `make test-torch TORCH=2.15.0`: unit, integration and notebook tests on another torch
# release, in a venv of its own (.venv-torch-2.15.0). A release not on this disk is a
# CUDA wheel of ~3 GB, run on the CPU. TORCH_SUITES picks the suites (CI: no notebooks
# on the oldest release); TORCH_EXTRAS adds packages (torchvision==0.29.1 timm==1.0.31
# next to 2.14.1: tests/integration/test_real_models.py then tries their models too).
# PIP_CONFIG_FILE=/dev/null: pip reads no config file, so a machine-wide cap on torch's
# version (a pip.conf constraint) does not refuse the release asked for.
TORCH ?= 2.15.0
TORCH_SUITES ?= unit integration notebooks
TORCH_EXTRAS ?=
NOCAP := PIP_CONFIG_FILE=/dev/null
TVENV := .venv-torch-$(TORCH)
TPY := $(TVENV)/bin/python

$(TVENV)/.installed: pyproject.toml requirements-dev.txt
	$(PYTHON) -m venv $(TVENV)
	$(TPY) -m pip install -q --upgrade pip
	grep -v '^torch==' requirements-dev.txt > $(TVENV)/requirements.txt
	$(NOCAP) $(TPY) -m pip install -q torch==$(TORCH) -r $(TVENV)/requirements.txt $(TORCH_EXTRAS)
	$(TPY) -m pip install -q --no-deps -e .
	touch $@

test-torch: $(TVENV)/.installed
	@$(TPY) -c "import torch; print('torch', torch.__version__)"
	$(NOCAP) ISH_WHEEL_TORCH=torch==$(TORCH) $(MAKE) $(TORCH_SUITES) PY=$(TPY) STAMP=$(TVENV)/.installed

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks

# The wheels benchmarks/gpu_check.py needs on the lent GPU machine (no registry there),
# into .whl/; prints their size and the command to run there with .whl carried.
.PHONY: gpu-wheels
gpu-wheels: $(STAMP)
	$(PY) tools/gpu_wheels.py

clean:
	rm -rf $(VENV) out .pytest_cache dist build site
