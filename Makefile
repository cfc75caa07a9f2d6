# flashwatt: the two commands of the README.
#   make run    set up .venv, run the default suite locally, print the report's path
#   make test   set up .venv, bring up a local Slurm and Chromium (root, Debian), run every test but the GPU ones
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# CPU build where no GPU is present; on a GPU node pick the CUDA build of your cluster.
TORCH_SPEC ?= torch==2.13.0
SNAKEMAKE_ARGS ?=
PYTEST_ARGS ?=
# Parallel test workers (pytest-xdist). Each module runs whole on one worker, the Slurm
# tests together on one (tests/conftest.py); 3 on 2 cores, since the Slurm tests' worker
# mostly waits on its jobs.
TEST_WORKERS ?= 3
XDIST = -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

.PHONY: setup run test test-unit test-quick lint clean

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

run: setup
	$(BIN)/flashwatt run $(SNAKEMAKE_ARGS)

# Every test but the GPU ones, in one parallel run: unit, workflow (Snakemake end to end),
# slow (marked: a minute or more of CPU each), nvcc (the kernels compiled for sm_80/
# sm_90a; they fail without the CUDA compiler, which CI has) and slurm (they need the
# single-node Slurm that .ci/slurm/up.sh starts, and down.sh stops afterwards).
# Tests marked browser open the reports in headless Chromium, which .ci/chromium.sh installs
# from the distribution's packages (root, like Slurm).
test: setup lint
	bash .ci/chromium.sh
	bash .ci/slurm/up.sh
	status=0; $(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS) -m "not gpu" || status=$$?; \
	bash .ci/slurm/down.sh; exit $$status

# What needs neither Slurm nor a GPU (the workflow and slow tests included).
test-unit: setup
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS) -m "not gpu and not slurm"

# The quick loop while editing: no Slurm, GPU, workflow, slow or nvcc tests.
test-quick: setup
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS) -m "not gpu and not slurm and not workflow and not slow and not nvcc"

# Snakemake's linter over the workflow; a finding fails the command (and `make test`).
lint: setup
	$(BIN)/snakemake --lint

clean:
	rm -rf results figures .snakemake
