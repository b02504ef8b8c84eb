"""What dlcrepro/run/heap.py's settings save, and that they change no number: cells with and without them.

    .venv/bin/python bench/heap_settings.py [--config configs/tiny.yaml] [--steps 20] [--repeats 2]
        [--cells bf16/pg stale/dlc]

Runs the given cells at once (one `python -m dlcrepro train` process each, one thread, as the
workflow's two-jobs-at-a-time schedule does), alternately with glibc's default heap
(DLCREPRO_DEFAULT_HEAP=1) and with heap.py's settings, `--repeats` times each. Prints each cell's
phase seconds (the sum of its summary's `seconds_by_phase`, set-up included) per run, the mean ratio
kept/default, and whether every metrics column but the `sec_*` timings is identical between the
two. Needs a warm-started model. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd


def run_cells(cfg: str, cells: list[str], steps: int, out: Path, default_heap: bool) -> dict[str, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("DLCREPRO_SERVER", None)  # each cell in its own process: the settings are per process
    if default_heap:
        env["DLCREPRO_DEFAULT_HEAP"] = "1"
    else:
        env.pop("DLCREPRO_DEFAULT_HEAP", None)
    procs = {}
    for cell in cells:
        sampler, correction = cell.split("/")
        cmd = [sys.executable, "-m", "dlcrepro", "train", "--config", cfg, "--set", f"train.steps={steps}",
               "--sampler", sampler, "--correction", correction, "--seed", "0", "--out", str(out / cell)]
        procs[cell] = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for cell, p in procs.items():
        if p.wait():
            raise SystemExit(f"{cell}: `dlcrepro train` exited {p.returncode} (see {out / cell})")
    return {cell: sum(json.loads((out / cell / "summary.json").read_text())["seconds_by_phase"].values()) for cell in cells}


def numbers(path: Path) -> pd.DataFrame:
    m = pd.read_parquet(path / "metrics.parquet")
    return m.drop(columns=[c for c in m.columns if c.startswith("sec_")])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/tiny.yaml")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--cells", nargs="+", default=["bf16/pg", "stale/dlc"], help="sampler/correction, seed 0")
    args = p.parse_args()
    seconds: dict[str, dict[str, list[float]]] = {"default": {}, "kept": {}}
    identical = True
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for side in ("default", "kept"):
                out = Path(tmp) / f"{side}{r}"
                got = run_cells(args.config, args.cells, args.steps, out, default_heap=side == "default")
                print(f"repeat {r} {side:>7s} heap: " + ", ".join(f"{c} {s:.2f} s" for c, s in got.items()), flush=True)
                for c, s in got.items():
                    seconds[side].setdefault(c, []).append(s)
                identical &= all(numbers(out / c).equals(numbers(Path(tmp) / "default0" / c)) for c in args.cells)
    for c in args.cells:
        d, k = statistics.mean(seconds["default"][c]), statistics.mean(seconds["kept"][c])
        print(f"{c}: phases {d:.2f} s default, {k:.2f} s kept: {k / d:.3f}x")
    print("every metrics column but the timings identical:", identical)


if __name__ == "__main__":
    main()
