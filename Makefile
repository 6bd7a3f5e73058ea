# make demo: install, generate a small ListOps set, train `transformer`, print the results.
# make test: install, run the default test suite (CI's first stage; test-exhaustive its second).
# make venv-latest / test-latest / test-jax-gpu: the same suite on today's JAX (below).
PY ?= python3
VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DATA := data/listops_mini
DEMO_WORKDIR := workdirs/demo/listops_mini_transformer

.PHONY: demo test test-exhaustive venv clean-demo tensorboard bench-kernels bench gpu-wheels gpu-results \
    venv-latest test-latest test-jax-gpu ci-latest

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -r requirements-dev.txt
	$(PYTHON) -m pip install -q --no-deps -e .
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

# make test-exhaustive: the rest of the per-variant cross products (tests/tiers.py: every
# variant, every setting) and the long process tests whose path a default test takes, which
# `make test` leaves out to keep a developer's wait short;
# CI runs it after `make test`.
test-exhaustive: $(STAMP)
	$(PYTHON) -m pytest -n 2 -q -m exhaustive

# make tensorboard LOGDIR=<workdir or sweep dir>: TensorBoard on the event files runs write
# (tensorboardX writes them; TensorBoard itself lives in its own venv, .venv-tensorboard,
# so that its protobuf and grpcio leave .venv's versions alone).
LOGDIR ?= workdirs
tensorboard:
	test -x .venv-tensorboard/bin/tensorboard || \
	    ($(PY) -m venv .venv-tensorboard && .venv-tensorboard/bin/pip install -q tensorboard)
	.venv-tensorboard/bin/tensorboard --logdir=$(LOGDIR)

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

# make gpu-wheels (here, where the package registry is reachable): the Python 3.12 wheels
# of what the lent GPU machines' image lacks, into .gpu-wheels/ (git-ignored, 4.4 MiB), to
# carry with the tree. The image (the device tool's package list) has jax, flax, optax,
# orbax-checkpoint, numpy, scipy, matplotlib, pillow, absl-py, pyyaml, protobuf, etils,
# cloudpickle, psutil, packaging, pytest, pytest-xdist and hypothesis; the suite needs
# ml_collections, grain and tensorboardX besides, and grain needs array_record and
# portpicker (resolved with pip download for Python 3.12: their other requirements are in
# the image; tensorflow-datasets only reads Text and Image folders, which the suite does
# not). These five, at the versions the suite runs with here, without dependencies; then
# lra.gpu.common.check_wheels names any requirement neither carried nor in the image.
GPU_WHEELS := .gpu-wheels
GPU_WHEEL_PACKAGES := ml_collections==1.1.0 grain==0.2.18 tensorboardX==2.6.5 \
    array_record==0.8.6 portpicker==1.6.0
GPU_PY ?= python3
GPU_OUT ?= results/gpu
GPU_BUDGET ?= 7.5
GPU_SITE ?= /tmp/lra-gpu-site
GPU_PACK ?=

gpu-wheels: $(STAMP)
	rm -rf $(GPU_WHEELS)
	$(PYTHON) -m pip download -q --no-deps -d $(GPU_WHEELS) $(GPU_WHEEL_PACKAGES) \
	    --only-binary=:all: --python-version 3.12 --implementation cp \
	    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
	    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	    --platform manylinux1_x86_64
	$(PYTHON) -c 'import sys; from lra.gpu.common import check_wheels; \
	    sys.exit(check_wheels("$(GPU_WHEELS)"))'

# make gpu-results (on the GPU machine): installs the carried wheels, if any, into
# $(GPU_SITE) (the image's packages untouched), then runs one call of the suite:
# $(GPU_BUDGET) minutes of stages into $(GPU_OUT) (docs/gpu_suite.md); the
# first call is the kernel tests, the 4K kernel table and one time-boxed ListOps run. Run
# it again to continue. GPU_PACK=<path.tgz> packs $(GPU_OUT) without checkpoints there.
gpu-results:
	if ls $(GPU_WHEELS)/*.whl >/dev/null 2>&1; then \
	    $(GPU_PY) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
	        --upgrade --target $(GPU_SITE) $(GPU_WHEELS)/*.whl; fi
	PYTHONPATH=$(GPU_SITE)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) -m lra.gpu_suite \
	    --out=$(GPU_OUT) --budget_minutes=$(GPU_BUDGET)$(if $(GPU_PACK), --pack=$(GPU_PACK))
