# flashwatt: the two commands of the README.
#   make run    set up .venv, run the default suite locally, print the report's path
#   make test   set up .venv, bring up a local Slurm and Chromium (root, Debian), run every test
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# CPU build where no GPU is present; on a GPU node pick the CUDA build of your cluster.
TORCH_SPEC ?= torch==2.13.0
SNAKEMAKE_ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup run test test-unit lint clean

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

run: setup
	$(BIN)/flashwatt run $(SNAKEMAKE_ARGS)

# Slurm tests need the single-node Slurm that .ci/slurm/up.sh starts (and stops afterwards).
# Tests marked nvcc (the kernels compiled for sm_80/sm_90/sm_90a) run too and fail without
# the CUDA compiler; CI has it. Tests marked browser open the reports in headless Chromium,
# which .ci/chromium.sh installs from the distribution's packages (root, like Slurm).
test: setup lint
	bash .ci/chromium.sh
	bash .ci/slurm/up.sh
	status=0; $(BIN)/python -m pytest $(PYTEST_ARGS) -m "not gpu" || status=$$?; \
	bash .ci/slurm/down.sh; exit $$status

test-unit: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS) -m "not gpu and not slurm"

# Snakemake's linter over the workflow; a finding fails the command (and `make test`).
lint: setup
	$(BIN)/snakemake --lint

clean:
	rm -rf results figures .snakemake
