#!/usr/bin/env bash
# Check every GPU-side piece of the paper path on this machine, one PASS/FAIL/SKIP line each, in at
# most 8 minutes. Needs one CUDA GPU and PyTorch; transformers and vLLM are used when importable
# (pieces that need them SKIP otherwise); no model weights and no network: the models are built here.
#   bash scripts/gpu_check.sh              # all pieces on cuda
#   PYTHON=.venv/bin/python bash scripts/gpu_check.sh --only quantizer corrections
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0
echo "gpu_check: $("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout 480 "$PY" -m dlcrepro.run.gpu_check "$@"
rc=$?
[ $rc -eq 124 ] && echo "FAIL gpu_check ran past its 8 minutes"
exit $rc
