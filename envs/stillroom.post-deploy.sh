#!/usr/bin/env bash
# Snakemake runs this once in the new environment, from the workflow's working directory (the
# repository root, as the README runs it): the stillroom package itself; the environment file
# already holds its dependencies.
set -euo pipefail
pip install --no-deps --no-build-isolation --editable .
