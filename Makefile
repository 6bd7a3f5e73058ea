# make demo: install, generate a small ListOps set, train `transformer`, print the results.
# make test: install, run the default test suite (what CI runs).
# make venv-latest / test-latest / test-jax-gpu: the same suite on today's JAX (below).
PY ?= python3
VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DATA := data/listops_mini
DEMO_WORKDIR := workdirs/demo/listops_mini_transformer

.PHONY: demo test venv clean-demo bench-kernels bench gpu-wheels gpu-results \
    venv-latest test-latest test-jax-gpu ci-latest

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -r requirements-dev.txt
	touch $(STAMP)

venv: $(STAMP)

$(DEMO_DATA)/basic_test.tsv: | $(STAMP)
	$(PYTHON) -m lra.tasks.listops --output_dir=$(DEMO_DATA) \
	    --num_train_samples=20000 --num_valid_samples=1000 --num_test_samples=1000 \
	    --min_length=10 --max_length=60 --max_depth=4

demo: $(STAMP) $(DEMO_DATA)/basic_test.tsv
	$(PYTHON) launch.py --config=configs/listops.py:mini --workdir=$(DEMO_WORKDIR)

clean-demo:
	rm -rf $(DEMO_WORKDIR)

test: $(STAMP)
	$(PYTHON) -m pytest -n 2 -q

# Efficiency table of every registered mixer against transformer (CPU: minutes).
bench: $(STAMP)
	$(PYTHON) -m lra.benchmark --models=all --lengths=1024,2048,3072,4096

# make bench-kernels: Pallas linear attention vs its XLA path and dense attention (a table).
bench-kernels: $(STAMP)
	$(PYTHON) -m lra.bench_kernels

# make venv-latest (root, package registries only): a Debian 13 root made by debootstrap
# in .jax-envs/ (git-ignored, reused when present) with Python 3.13 and two venvs of
# requirements-dev.txt: the newest JAX on the package index and JAX $(JAX_GPU_VERSION), the
# GPU machine's (scripts/jax_env.sh; JAX_ENV_REFRESH=1 remakes them). make test-latest,
# make test-jax-gpu: the default suite there. make ci-latest: CI's short stage under the
# newest JAX (scripts/ci_latest.sh).
JAX_ENV := scripts/jax_env.sh
JAX_GPU_VERSION ?= 0.11.2

venv-latest:
	$(JAX_ENV) build latest $(JAX_GPU_VERSION)

test-latest:
	$(JAX_ENV) build latest
	$(JAX_ENV) run latest python -m pytest -n 2 -q -p no:cacheprovider

test-jax-gpu:
	$(JAX_ENV) build $(JAX_GPU_VERSION)
	$(JAX_ENV) run $(JAX_GPU_VERSION) python -m pytest -n 2 -q -p no:cacheprovider

ci-latest:
	scripts/ci_latest.sh

# make gpu-wheels (here, where the package registry is reachable): Python 3.12 wheels of
# the dependencies a GPU image lacks, into .gpu-wheels/ (git-ignored), to copy or carry to
# the GPU machine with the tree. The image is expected to have jax, flax, optax, orbax,
# numpy, scipy, matplotlib, pillow, absl-py, pytest and hypothesis; the suite needs
# ml_collections, grain and tensorboardX besides (tensorflow-datasets only reads Text and
# Image folders, which the suite does not), with whatever they need (pip resolves it).
GPU_WHEELS := .gpu-wheels
GPU_WHEEL_PACKAGES := ml_collections|grain|tensorboardX
GPU_PY ?= python3
GPU_OUT ?= results/gpu
GPU_BUDGET ?= 25

gpu-wheels: $(STAMP)
	mkdir -p $(GPU_WHEELS)
	grep -iE '^($(GPU_WHEEL_PACKAGES))[<>=~! ]' requirements.txt | sed 's/ *#.*//' \
	    > $(GPU_WHEELS)/requirements.txt
	$(PYTHON) -m pip download -q -d $(GPU_WHEELS) -r $(GPU_WHEELS)/requirements.txt \
	    --only-binary=:all: --python-version 3.12 --implementation cp \
	    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
	    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	    --platform manylinux1_x86_64
	du -sh $(GPU_WHEELS)

# make gpu-results (on the GPU machine): installs the carried wheels if present (what the
# image already has is kept), then runs every measurement in $(GPU_BUDGET) minutes into
# $(GPU_OUT) (README, "On a GPU: one command"). Run it again to continue what ran out of time.
gpu-results:
	if [ -f $(GPU_WHEELS)/requirements.txt ]; then \
	    PIP_BREAK_SYSTEM_PACKAGES=1 $(GPU_PY) -m pip install -q --no-index \
	        --find-links $(GPU_WHEELS) -r $(GPU_WHEELS)/requirements.txt; fi
	$(GPU_PY) -m lra.gpu_suite --out=$(GPU_OUT) --budget_minutes=$(GPU_BUDGET)
