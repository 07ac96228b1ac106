# make test  : create .venv with the CI pins if needed, install the package, run pytest on
#              TEST_WORKERS processes (pytest-xdist; the cores, at most 4)
# make demo  : same set-up, then serve the small GDN model with prefix caching from torch
#              and JAX (examples/serve_demo.py; writes demo_tokens_saved.png)
# make gpu   : on the GPU machine (device tool): the image's torch/triton, the whole test
#              suite compiled on the GPU (gpu-test), the fuzz suite at 5000 examples per
#              backend (gpu-fuzz), compute-sanitizer over the kernel tests (sanitize), then
#              the benchmarks (gpu-bench); logs and results to $(OUT)
SHELL  := /bin/bash
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PINS   := torch==2.13.0 triton==3.6.0 "numpy<2.4" jax==0.10.2 jaxlib==0.10.2 \
          hypothesis==6.170.17 pytest==9.2.0 pytest-xdist==3.8.0 matplotlib==3.11.2
STAMP  := $(VENV)/.pins-installed
PYTEST_ARGS ?=
# make test's pytest processes (pytest-xdist): the machine's cores, at most 4 (each holds
# torch, JAX and Triton's interpreter; nproc without the OpenMP limits, which it would
# follow); 1 runs the suite in one process, as pytest's --pdb and -s need
TEST_WORKERS ?= $(shell n=$$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null \
	|| echo 1); echo $$(( n < 4 ? n : 4 )))

.PHONY: test demo venv clean gpu gpu-setup gpu-test gpu-test-all gpu-test-1 gpu-test-2 gpu-test-3 \
	gpu-fuzz sanitize sanitize-memcheck sanitize-racecheck gpu-bench

venv: $(STAMP)

$(STAMP): Makefile pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools
	$(PY) -m pip install -q $(PINS)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS)) $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) examples/serve_demo.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

OUT ?= benchmarks/results
SITE := /tmp/site
# carried wheels (.whl/, e.g. jax-triton==0.3.1) go to $(SITE), first on PYTHONPATH
gpu gpu-setup gpu-test gpu-test-all gpu-test-1 gpu-test-2 gpu-test-3 gpu-fuzz sanitize \
	sanitize-memcheck \
	sanitize-racecheck gpu-bench: export PYTHONPATH := $(SITE):$(PYTHONPATH)
gpu: gpu-test gpu-fuzz sanitize gpu-bench

gpu-setup:
	python3 -m pip install -q --no-deps --no-build-isolation --no-index -e .
	if ls .whl/*.whl >/dev/null 2>&1; then python3 -m pip install -q --no-index --no-deps \
	  --no-compile --no-cache-dir --upgrade --target $(SITE) .whl/*.whl; fi
	python3 -c "import jax, jax_triton; print('jax', jax.__version__, jax.default_backend(), 'jax-triton', jax_triton.__version__)"
	python3 -c "import einops, fla; print('fla', fla.__version__)"
	mkdir -p $(OUT)
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $(OUT)/gpu_info.txt
	python3 -c "import numpy, torch, triton, jax; print('numpy', numpy.__version__, 'torch', \
	  torch.__version__, 'triton', triton.__version__, 'jax', jax.__version__)" >> $(OUT)/gpu_info.txt

# the suite in three parts, each of which fits one 600 s device call (gpu-test: all three);
# the junit XML names every test that ran. With pytest-xdist among the carried wheels
# (pytest-xdist, execnet) each part runs on GPU_WORKERS processes, and gpu-test-all runs
# the whole suite in one (2.9 min on the H200, 3.3-4.5 on an H100, with 8)
GPU_WORKERS ?= 8
GPU_PART1 := tests/test_e2e.py tests/test_hybrid_model.py tests/test_dense.py tests/test_gdn.py \
	tests/test_gdn_chunked.py \
	tests/test_conv1d.py tests/test_conv1d_words.py tests/test_recurrent_gpu.py tests/test_codegen.py
GPU_PART2 := tests/test_equivalence.py tests/test_fuzz.py tests/test_docs.py tests/test_tp.py \
	tests/test_bench_serving.py tests/test_bench_recurrent.py tests/test_scenarios.py
GPU_TEST := EQUIVALENCE_EXAMPLES=50 python3 -m pytest -q -p no:cacheprovider \
	$$(python3 -c 'import xdist, execnet' 2>/dev/null && printf -- '-n %s' $(GPU_WORKERS)) $(PYTEST_ARGS)
gpu-test: gpu-test-1 gpu-test-2 gpu-test-3
gpu-test-all: gpu-setup
	set -o pipefail; $(GPU_TEST) --junitxml=$(OUT)/gpu_tests_all.xml tests 2>&1 \
	  | tee $(OUT)/gpu_tests_all.log
gpu-test-1: gpu-setup
	set -o pipefail; $(GPU_TEST) --junitxml=$(OUT)/gpu_tests_1.xml $(GPU_PART1) 2>&1 \
	  | tee $(OUT)/gpu_tests_1.log
gpu-test-2: gpu-setup
	set -o pipefail; $(GPU_TEST) --junitxml=$(OUT)/gpu_tests_2.xml $(GPU_PART2) 2>&1 \
	  | tee $(OUT)/gpu_tests_2.log
gpu-test-3: gpu-setup
	set -o pipefail; $(GPU_TEST) --junitxml=$(OUT)/gpu_tests_3.xml tests \
	  $(addprefix --ignore=,$(GPU_PART1) $(GPU_PART2)) 2>&1 | tee $(OUT)/gpu_tests_3.log

FUZZ_GPU ?= 5000
gpu-fuzz: gpu-setup
	set -o pipefail; FUZZ_EXAMPLES=$(FUZZ_GPU) python3 -m pytest -q -s -p no:cacheprovider \
	  tests/test_fuzz.py 2>&1 | tee $(OUT)/gpu_fuzz.log

# memcheck over the kernel tests (copies, bookkeeping, faults, a shorter fuzz run, the
# recurrences); racecheck (it sees shared memory only) over the copies, the conv update (the
# in-place conv shift and window among them), the gated delta rule, whose one-warp
# kernel stages each token's o through shared memory, and the selective state update (the
# same program): all must be clean
# (benchmarks/README.md, "compute-sanitizer").
SANITIZE_ENV := PYTORCH_NO_CUDA_MEMORY_CACHING=1 XLA_PYTHON_CLIENT_ALLOCATOR=platform
SANITIZER ?= $(shell command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
SANITIZE_TESTS := tests/test_copy.py tests/test_bookkeeping.py tests/test_resolve.py \
	tests/test_faults.py tests/test_fault_runners.py tests/test_fuzz.py tests/test_conv1d.py \
	tests/test_conv1d_words.py tests/test_gdn.py tests/test_selective_state.py \
	tests/test_copy_free_sequence.py
# in two parts, each sized for one 600 s device call (sanitize: both; the timings:
# benchmarks/README.md, "compute-sanitizer")
sanitize: sanitize-memcheck sanitize-racecheck
sanitize-memcheck: gpu-setup
	! $(SANITIZE_ENV) $(SANITIZER) --tool memcheck --error-exitcode 1 \
	  python3 tests/sanitizer_control.py > $(OUT)/sanitize_control.log 2>&1
	grep -E "Invalid __global__ write|ERROR SUMMARY" $(OUT)/sanitize_control.log
	set -o pipefail; $(SANITIZE_ENV) FUZZ_EXAMPLES=100 $(SANITIZER) --tool memcheck \
	  --error-exitcode 1 python3 -m pytest -q -p no:cacheprovider $(SANITIZE_TESTS) 2>&1 \
	  | tee $(OUT)/sanitize_memcheck.log
sanitize-racecheck: gpu-setup
	set -o pipefail; $(SANITIZE_ENV) $(SANITIZER) --tool racecheck --error-exitcode 1 \
	  python3 -m pytest -q -p no:cacheprovider tests/test_copy.py tests/test_conv1d.py \
	  2>&1 | tee $(OUT)/sanitize_racecheck.log
	set -o pipefail; $(SANITIZE_ENV) $(SANITIZER) --tool racecheck --error-exitcode 1 \
	  python3 -m pytest -q -p no:cacheprovider tests/test_gdn.py tests/test_selective_state.py \
	  -k "reference or bits" 2>&1 | tee $(OUT)/sanitize_racecheck_gdn.log

# a same-run baseline for the step benchmark: an earlier version of the package, carried
# in the git-ignored .baseline/mamba_align (git archive <rev> --prefix=mamba_align/)
gpu-bench: gpu-setup
	set -o pipefail; python3 benchmarks/bench_copy.py --out $(OUT) 2>&1 | tee $(OUT)/bench_copy.log
	set -o pipefail; python3 benchmarks/bench_dispatch.py --out $(OUT) 2>&1 | tee $(OUT)/bench_dispatch.log
	set -o pipefail; python3 benchmarks/bench_dispatch.py --out $(OUT) --rows 512 --label rows512 \
	  2>&1 | tee $(OUT)/bench_dispatch_rows512.log
	set -o pipefail; python3 benchmarks/bench_recurrent.py --out $(OUT) 2>&1 \
	  | tee $(OUT)/bench_recurrent.log
	set -o pipefail; python3 benchmarks/bench_selective_state.py --out $(OUT) 2>&1 \
	  | tee $(OUT)/bench_selective_state.log
	set -o pipefail; python3 benchmarks/bench_serving.py --out $(OUT) 2>&1 \
	  | tee $(OUT)/bench_serving.log
	if [ -d .baseline/mamba_align ]; then set -o pipefail; for r in 64 512; do \
	  PYTHONPATH=$(CURDIR)/.baseline:$(SITE) python3 benchmarks/bench_dispatch.py --out $(OUT) \
	  --rows $$r --label baseline_rows$$r 2>&1 | tee $(OUT)/bench_dispatch_baseline_rows$$r.log; \
	  done; fi
