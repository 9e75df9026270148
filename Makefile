# `make demo` runs the main job, `make test` runs the tests; both create .venv when missing.
PYTHON ?= $(shell PYENV_VERSION=3.12.1 python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null || command -v python3.12 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test gpu-test bench-interpret clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,triton]'
	touch $@

demo: $(VENV)/.installed
	$(PY) -m demo

test: $(VENV)/.installed
	$(PY) -m pytest -q -n 2 tests

# On the GPU machine (nothing installs there): python3 already has jax, triton, torch. The whole
# suite: kernels run on the Triton backend (tests marked `interpreter` in the interpreter), plus
# the `gpu` tests comparing Triton with the interpreter kernel by kernel.
gpu-test:
	XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$(CURDIR) python3 -m pytest -q -m "gpu or not gpu" \
	  -n 24 tests -p no:cacheprovider

bench-interpret: $(VENV)/.installed
	$(PY) benchmarks/interpret_vs_pallas.py

clean:
	rm -rf $(VENV)
