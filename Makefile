# The two commands of the README: `make run` (the embedded default pipeline) and `make test` (the
# whole suite but the SLURM tests), with `make test-fast` (the tests not marked slow) for iterating;
# `make lint` and `make format` before a commit; `make gpu-check` on a GPU machine. The tests install
# nothing outside .venv and need no root: what they use from the operating system is `make host`'s,
# as root (CI: .ci/run).
PYTHON ?= python3
VENV ?= .venv
# CPU machines take the local torch 2.13.0 CPU wheel; on a GPU machine: make TORCH_SPEC="torch==2.13.0" run
TORCH_SPEC ?= torch==2.13.0
CORES ?= 2
GPU_CHECK_OUT ?= results/gpu-check.json
BIN := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: run test test-fast test-slurm lint format host venv bwrap clean gpu-check

$(BIN)/stillroom: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[test]"
	$(BIN)/python -m stillroom.grading.punkt_data  # IFEval's Punkt model, offline
	touch $@

# What the suite uses from the operating system, on Debian as root, and the one target that changes
# the host: bubblewrap (the OS sandbox of untrusted code, stillroom/sandbox.py; without it the
# sandbox warns loudly), chromium and tesseract (the report screenshot tests,
# tests/workflow/browser.py) and the local SLURM cluster (scripts/slurm-up.sh, for make test-slurm;
# it names this host in /etc/hosts where its name does not resolve, as torchrun needs).
# Without them the tests that need them skip, naming what is missing.
HOST_PACKAGES := bubblewrap chromium tesseract-ocr tesseract-ocr-eng fonts-dejavu-core
host:
	@[ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null || { \
	  echo "make host installs Debian packages and starts SLURM: run it as root on Debian/Ubuntu" >&2; \
	  exit 1; }
	@missing=$$(for p in $(HOST_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null \
	  | grep -q 'install ok installed' || echo $$p; done); [ -z "$$missing" ] || { \
	  echo "installing" $$missing; apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends $$missing >/dev/null; }
	scripts/slurm-up.sh

# The .pth file that hooked Snakemake's config loader, left in a venv made before its removal
venv: $(BIN)/stillroom
	rm -f $(VENV)/lib/python*/site-packages/stillroom-snakemake-yaml.pth

# bubblewrap, the OS sandbox of the kernel track's untrusted code (stillroom/sandbox.py), for `make
# run`: installed with apt-get when missing and running as root; otherwise the sandbox warns loudly
bwrap:
	@command -v bwrap >/dev/null || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || { \
	  echo "installing bubblewrap"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends bubblewrap >/dev/null \
	  || echo "WARNING: could not install bubblewrap: untrusted code runs without an OS sandbox" >&2; }

run: venv bwrap
	$(BIN)/snakemake --cores $(CORES)
	$(BIN)/stillroom show results/tiny

# -rs names every skipped test and why (the SLURM tests: make test-slurm)
test: venv
	$(BIN)/pytest -q -rs

# Everything but the tests marked slow (pyproject.toml: Snakemake runs, trained models, servers)
test-fast: venv
	$(BIN)/pytest -q -rs -m "not slow"

# The tests marked slurm, on the cluster `make host` brings up; under CI=true they fail without it
test-slurm: venv
	$(BIN)/pytest -q -rs --slurm -m slurm

# ruff over the Python, snakefmt over the workflow's files, Snakemake's own lint of the workflow
# on the default config, run in a scratch directory so that it writes nothing here
lint: $(BIN)/stillroom
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/snakefmt --check Snakefile rules
	scratch=$$(mktemp -d) && trap 'rm -rf "$$scratch"' EXIT && \
	  $(BIN)/snakemake -s $(abspath Snakefile) --directory "$$scratch" --lint

# What lint checks, fixed where a tool can; ruff's fixes last, so that it ends naming what is left
# to fix by hand
format: $(BIN)/stillroom
	$(BIN)/ruff format .
	$(BIN)/snakefmt Snakefile rules
	$(BIN)/ruff check --fix .

# The GPU-only code paths once, within 8 minutes, summary in $(GPU_CHECK_OUT). Without a GPU it
# writes a "skipped" summary and succeeds; CI never runs it.
gpu-check: venv
	$(BIN)/python -m stillroom.gpucheck --out $(GPU_CHECK_OUT)

clean:
	rm -rf results .snakemake
