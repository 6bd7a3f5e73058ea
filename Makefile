# make demo: install, generate a small ListOps set, train `transformer`, print the results.
# make test: install, run the default test suite (what CI runs).
PY ?= python3
VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DATA := data/listops_mini
DEMO_WORKDIR := workdirs/demo/listops_mini_transformer

.PHONY: demo test venv clean-demo bench-kernels bench

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
