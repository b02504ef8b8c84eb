#!/usr/bin/env bash
# The calibrated plan's error, measured on the rehearsal (docs/measurements.md, "The pilot, the
# calibration and time limits that learn"), or on another config: the pilot, the plan calibrated from
# it (kept as _calibration.after-pilot.json), the rest of the grid, then each job's projected minutes
# against its measured ones and the total cell-time's error. A timing measurement: run it alone on
# the machine.
#
#   [CONFIG=configs/smoke.yaml] bash bench/calibrate_rehearsal.sh [results dir, default rehearsal/results]
set -euo pipefail
cd "$(dirname "$0")/.."
RESULTS=${1:-rehearsal/results}
# targets first: --configfile and --config take every word after them
CONFIG=${CONFIG:-configs/rehearsal.yaml}
NAME=$(.venv/bin/python -c "import sys; from dlcrepro.core.config import load; print(load(sys.argv[1]).name)" "$CONFIG")
SMK_ARGS=(--cores 2 --configfile "$CONFIG" --config "results_dir=$RESULTS")
PLAN=(.venv/bin/python -m dlcrepro plan --config "$CONFIG" --set "results_dir=$RESULTS")

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'); avx512f: $(grep -qw avx512f /proc/cpuinfo && echo yes || echo no);" \
     "amx: $(grep -qw amx_tile /proc/cpuinfo && echo yes || echo no); commit $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')"
start=$(date +%s)
.venv/bin/snakemake pilot "${SMK_ARGS[@]}"
echo "pilot: $(( $(date +%s) - start )) s"
"${PLAN[@]}" --calibrate "$RESULTS" | sed -n '1,/^written/p'
cp "$RESULTS/_calibration.$NAME.json" "$RESULTS/_calibration.after-pilot.json"
start=$(date +%s)
.venv/bin/snakemake "${SMK_ARGS[@]}"
echo "the rest of the grid: $(( $(date +%s) - start )) s"
"${PLAN[@]}" --calibrate "$RESULTS" --projection-error "$RESULTS/_calibration.after-pilot.json" | sed -n '1,/^$/p'
