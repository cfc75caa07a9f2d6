# flashwatt: the two commands of the README.
#   make run    set up .venv, run the default suite locally, print the report's path
#   make test   set up .venv, bring up a local Slurm and Chromium (root, Debian), run every test but the
#               GPU ones and the heavy tier (`make test-heavy`, which CI runs after it: .ci/run)
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

.PHONY: setup run test test-heavy test-unit test-quick lint clean

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

run: setup
	$(BIN)/flashwatt run $(SNAKEMAKE_ARGS)

# pytest on the parallel workers, with the markers $(1), under the local Slurm (.ci/slurm/up.sh
# brings it up, down.sh stops it whatever the tests did) and with headless Chromium for the
# tests marked browser (.ci/chromium.sh installs it from the distribution's packages); both
# need root on Debian.
define pytest_under_slurm
	bash .ci/chromium.sh
	bash .ci/slurm/up.sh
	status=0; $(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS) -m "$(1)" || status=$$?; \
	bash .ci/slurm/down.sh; exit $$status
endef

# Every test but the GPU ones and the heavy tier, in one parallel run: unit, workflow
# (Snakemake end to end), slow (marked: a minute or more of CPU each), nvcc (the kernels
# compiled for sm_80; they fail without the CUDA compiler, which CI has), browser and slurm.
test: setup lint
	$(call pytest_under_slurm,not gpu and not heavy)

# The heavy tier: the sm_90a kernel builds, the training suite's workflow run and the
# preempted Slurm training job, each minutes of CPU and each path also covered by a cheaper
# test in `make test`. CI runs it after `make test` (.ci/run).
test-heavy: setup
	$(call pytest_under_slurm,heavy and not gpu)

# `make test` without Slurm and Chromium's install (no root needed; the workflow, slow and
# nvcc tests included; browser tests need Chromium installed).
test-unit: setup
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS) -m "not gpu and not slurm and not heavy"

# The quick loop while editing: no Slurm, GPU, workflow, slow, nvcc or heavy tests.
test-quick: setup
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS) -m "not gpu and not slurm and not workflow and not slow and not nvcc and not heavy"

# Snakemake's linter over the workflow; a finding fails the command (and `make test`).
lint: setup
	$(BIN)/snakemake --lint

clean:
	rm -rf results figures .snakemake
