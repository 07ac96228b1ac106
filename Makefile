# make test  : create .venv with the CI pins if needed, install the package, run pytest
# make demo  : same set-up, then run the main example
# make gpu   : on the GPU machine (device tool): the image's torch/triton, the whole test
#              suite compiled on the GPU (gpu-test), then the benchmarks (gpu-bench); logs
#              and results to $(OUT)
SHELL  := /bin/bash
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PINS   := torch==2.13.0 triton==3.6.0 "numpy<2.4" jax==0.10.2 jaxlib==0.10.2 \
          hypothesis==6.170.17 pytest==9.2.0
STAMP  := $(VENV)/.pins-installed
PYTEST_ARGS ?=

.PHONY: test demo venv clean gpu gpu-setup gpu-test gpu-bench

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

OUT ?= benchmarks/results
SITE := /tmp/site
# carried wheels (.whl/, e.g. jax-triton==0.3.1) go to $(SITE), first on PYTHONPATH
gpu gpu-setup gpu-test gpu-bench: export PYTHONPATH := $(SITE):$(PYTHONPATH)
gpu: gpu-test gpu-bench

gpu-setup:
	python3 -m pip install -q --no-deps --no-build-isolation --no-index -e .
	if ls .whl/*.whl >/dev/null 2>&1; then python3 -m pip install -q --no-index --no-deps \
	  --no-compile --no-cache-dir --upgrade --target $(SITE) .whl/*.whl; fi
	python3 -c "import jax, jax_triton; print('jax', jax.__version__, jax.default_backend(), 'jax-triton', jax_triton.__version__)"
	mkdir -p $(OUT)
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $(OUT)/gpu_info.txt

gpu-test: gpu-setup
	set -o pipefail; python3 -m pytest -q -p no:cacheprovider tests $(PYTEST_ARGS) 2>&1 | tee $(OUT)/gpu_tests.log

gpu-bench: gpu-setup
	set -o pipefail; python3 benchmarks/bench_copy.py --out $(OUT) 2>&1 | tee $(OUT)/bench_copy.log
	set -o pipefail; python3 benchmarks/bench_dispatch.py --out $(OUT) 2>&1 | tee $(OUT)/bench_dispatch.log
