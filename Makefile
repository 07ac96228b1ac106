# make test  : create .venv with the CI pins if needed, install the package, run pytest
# make demo  : same set-up, then run the main example
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PINS   := torch==2.13.0 triton==3.6.0 "numpy<2.4" jax==0.10.2 jaxlib==0.10.2 \
          hypothesis==6.170.17 pytest==9.2.0
STAMP  := $(VENV)/.pins-installed
PYTEST_ARGS ?=

.PHONY: test demo venv clean

venv: $(STAMP)

$(STAMP): Makefile pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools
	$(PY) -m pip install -q $(PINS)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) examples/simulate_prefix_cache.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
