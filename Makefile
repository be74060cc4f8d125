# The two commands of the README: `make run` (the embedded default pipeline) and `make test` (the
# whole suite, what CI runs), with `make test-fast` (the tests not marked slow) for iterating;
# `make lint` and `make format` before a commit; `make gpu-check` on a GPU machine.
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

.PHONY: run test test-fast lint format venv bwrap browser slurm clean gpu-check

$(BIN)/stillroom: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[test]"
	$(BIN)/python -m stillroom.grading.punkt_data  # IFEval's Punkt model, offline
	touch $@

# bubblewrap, the OS sandbox of untrusted code (stillroom/sandbox.py): installed with apt-get when
# missing and running as root; otherwise the sandbox warns loudly and runs without it
bwrap:
	@command -v bwrap >/dev/null || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || { \
	  echo "installing bubblewrap"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends bubblewrap >/dev/null \
	  || echo "WARNING: could not install bubblewrap: untrusted code runs without an OS sandbox" >&2; }

# A headless browser and OCR, for the tests that screenshot the snakemake --report HTML
# (tests/workflow/browser.py): installed like bubblewrap; without them those tests skip, saying so
browser:
	@{ command -v chromium && command -v tesseract; } >/dev/null || [ "$$(id -u)" != 0 ] \
	  || ! command -v apt-get >/dev/null || { \
	  echo "installing chromium and tesseract-ocr"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends chromium tesseract-ocr tesseract-ocr-eng fonts-dejavu-core \
	    >/dev/null || echo "WARNING: no chromium, tesseract-ocr: report screenshot tests skip" >&2; }

# The .pth file that hooked Snakemake's config loader, left in a venv made before its removal
venv: $(BIN)/stillroom bwrap browser
	rm -f $(VENV)/lib/python*/site-packages/stillroom-snakemake-yaml.pth

run: venv
	$(BIN)/snakemake --cores $(CORES)
	$(BIN)/stillroom show results/tiny

# The local SLURM cluster, where scripts/slurm-up.sh installed it and we are root: brought up (it is
# idempotent, about 3 s). The SLURM executor plugin asks the controller for its config whenever
# snakemake starts, and waits 9 s for one that is installed but stopped: 9 s on every test that
# runs snakemake. A machine without SLURM answers at once; .ci/run installs and starts it.
slurm:
	@! command -v slurmctld >/dev/null || [ "$$(id -u)" != 0 ] || scripts/slurm-up.sh >/dev/null

test: venv slurm
	$(BIN)/pytest -q

# Everything but the tests marked slow (pyproject.toml: Snakemake runs, trained models, servers)
test-fast: venv slurm
	$(BIN)/pytest -q -m "not slow"

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
