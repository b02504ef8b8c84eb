#!/usr/bin/env bash
# Do the GPU environment's pins install together? Resolves this package with its `gpu` and `test`
# extras (vllm==0.32.0 beside the pins of transformers, tokenizers, safetensors, numpy) with uv's
# resolver for Linux x86_64, Python 3.11, against PyPI, where vllm's torch is the CUDA build:
# nothing is downloaded beyond package metadata, nothing installed. A pin that cannot live beside
# vllm's own requirements fails here, naming the conflict, instead of in `setup.sh --gpu` on a
# cluster. Needs the network (not part of the test suite). Extra requirements given as arguments
# are resolved beside the extras (try a pin before writing it into pyproject.toml).
#   bash scripts/check_gpu_pins.sh                        # exit 0: resolvable; else uv's explanation
#   bash scripts/check_gpu_pins.sh 'some-package==1.2'     # a new dependency beside the pins
#   OUT=gpu-pins.txt bash scripts/check_gpu_pins.sh       # keep the full resolution (default: a temp file)
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-$(command -v uv || echo .venv/bin/uv)}
[[ -x $UV ]] || { echo "check_gpu_pins: no uv (bash scripts/setup.sh installs it into .venv)" >&2; exit 2; }
INDEX=${INDEX:-https://pypi.org/simple}
OUT=${OUT:-$(mktemp -t gpu-pins.XXXXXX.txt)}
EXTRA=$(mktemp -t gpu-pins-extra.XXXXXX.in)
trap 'rm -f "$EXTRA"' EXIT
printf '%s\n' "$@" > "$EXTRA"
# --no-config: no local pip/uv configuration (find-links of CPU wheels, local caps) leaks in.
"$UV" pip compile --no-config --quiet --index-url "$INDEX" --python-version 3.11 \
    --python-platform x86_64-manylinux_2_28 --extra gpu --extra test pyproject.toml "$EXTRA" -o "$OUT"
echo "check_gpu_pins: the gpu extra resolves for linux x86_64, python 3.11, from $INDEX ($(grep -c '==' "$OUT") packages, $OUT):"
grep -E '^(vllm|torch|transformers|tokenizers|safetensors|numpy)==' "$OUT" | sed 's/^/  /'
echo "  CUDA libraries: $(grep -E '^nvidia-cuda-runtime' "$OUT" || echo 'none (a CPU torch?)')"
