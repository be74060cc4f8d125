#!/usr/bin/env bash
# Snakemake runs this once in the new environment, from the workflow's working directory (the
# repository root, as the README runs it): the stillroom package itself and the Punkt model IFEval's
# checks read; the environment file already holds its dependencies.
set -euo pipefail
pip install --no-deps --no-build-isolation --editable .
python -m stillroom.grading.punkt_data  # IFEval's Punkt model, written offline
