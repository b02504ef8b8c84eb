"""What the trackers (config `tracking`) cost a training cell, per step and per run.

    .venv/bin/python bench/tracking_overhead.py --model-dir <warm-started model> [--config configs/smoke.yaml]
        [--sampler stale] [--correction dlc] [--steps 20] [--reps 3]

(1) The same cell run `--reps` times without trackers and with all three (TensorBoard, W&B offline,
MLflow on the SQLite default), interleaved, each in this one process: the median seconds per step
(the step's phases, `sec_*`) and of the whole run (`wall_seconds`), and their ratio with/without.
(2) Each backend alone, replaying that cell's metrics rows through the real library a step's
time apart: seconds to start a run, that a step's logging blocks the run (median and max) and to
finish, with MLflow both on a SQLite file and on a local `mlflow server`. Prints a table; a
benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dlcrepro.core import tracking  # noqa: E402
from dlcrepro.core.config import load  # noqa: E402
from dlcrepro.study.celldir import run_cell  # noqa: E402
from dlcrepro.step.train import PHASES  # noqa: E402

ALL = ["tensorboard", "wandb", "mlflow"]


def cell_run(args, root: Path, backends: list[str], rep: int) -> dict:
    """One run of the cell; its summary and its mean step seconds."""
    results = root / f"results-{rep}-{'-'.join(backends) or 'none'}"
    cfg = load(args.config, {"train.steps": args.steps, "results_dir": str(results), "tracking.backends": backends})
    out = results / "tiny" / args.sampler / args.correction / "seed0"
    summary = run_cell(cfg, "tiny", args.sampler, args.correction, 0, out, model_dir=args.model_dir)
    df = pd.read_parquet(out / "metrics.parquet")
    step = df[[f"sec_{p}" for p in PHASES]].sum(axis=1)
    return {"summary": summary, "step_s": float(step.median()), "rows": df,
            "tracking_s": summary["seconds_by_phase"].get("tracking", 0.0)}


def replay(args, root: Path, backend: str, rows: pd.DataFrame, summary: dict, step_s: float, mlflow_uri: str = "") -> dict:
    """Start, log every row `step_s` apart (the training step, idle here), finish: one backend, the
    real library; the seconds each call blocks the run."""
    sets = {"results_dir": str(root / f"replay-{backend}-{bool(mlflow_uri)}"), "tracking.backends": [backend]}
    if mlflow_uri:
        sets["tracking.mlflow_uri"] = mlflow_uri
    cfg = load(args.config, sets)
    cell = {"model": "tiny", "sampler": args.sampler, "correction": args.correction, "seed": 0, "model_dir": str(args.model_dir)}
    notes = []
    trackers = tracking.open_trackers(cfg, root / f"replay-cell-{backend}-{bool(mlflow_uri)}", notes.append, first_step=1)
    t = time.perf_counter()
    trackers.start(cell, tracking.cell_params(cfg, cell))
    start = time.perf_counter() - t
    per_step = []
    for row in rows.to_dict("records"):
        time.sleep(step_s)  # a step's time: what a background send (MLflow's queue) overlaps with
        t = time.perf_counter()
        trackers.log(int(row["step"]), row)
        per_step.append(time.perf_counter() - t)
    t = time.perf_counter()
    trackers.finish(summary)
    return {"start": start, "step_median": statistics.median(per_step), "step_max": max(per_step),
            "finish": time.perf_counter() - t, "status": trackers.status, "notes": notes}


def mlflow_server(root: Path) -> tuple[subprocess.Popen, str]:
    port = 5000 + os.getpid() % 1000
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
           "--backend-store-uri", f"sqlite:///{root / 'server.db'}", "--artifacts-destination", str(root / "server-artifacts")]
    proc = subprocess.Popen(cmd, stdout=(root / "server.log").open("w"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    uri = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 600
    while time.monotonic() < end:
        assert proc.poll() is None, (root / "server.log").read_text()[-2000:]
        try:
            if urllib.request.urlopen(f"{uri}/health", timeout=2).status == 200:
                return proc, uri
        except OSError:
            time.sleep(0.5)
    raise TimeoutError("mlflow server did not start")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/smoke.yaml")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--sampler", default="stale")
    p.add_argument("--correction", default="dlc")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    os.environ.setdefault("WANDB_MODE", "offline")
    root = Path(tempfile.mkdtemp(prefix="tracking-overhead-"))
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start; results in {root}")

    runs = {"none": [], "all": []}
    for rep in range(args.reps):
        for kind, backends in (("none", []), ("all", ALL)):
            r = cell_run(args, root, backends, rep)
            runs[kind].append(r)
            print(f"  rep {rep} {kind:4s}: wall {r['summary']['wall_seconds']:6.1f} s, median step {r['step_s']:.3f} s, "
                  f"in trackers {r['tracking_s']:.2f} s, load {os.getloadavg()[0]:.1f}", flush=True)
    med = {k: {m: statistics.median(r[m] if m != "wall" else r["summary"]["wall_seconds"] for r in v)
               for m in ("step_s", "wall", "tracking_s")}
           for k, v in runs.items()}
    print(f"\n(1) {args.steps}-step cell {args.sampler}/{args.correction}, median of {args.reps}:")
    print(f"  step (sec_* phases): {med['none']['step_s']:.3f} s without, {med['all']['step_s']:.3f} s with all three: "
          f"ratio {med['all']['step_s'] / med['none']['step_s']:.3f}")
    print(f"  whole run (wall_seconds): {med['none']['wall']:.1f} s without, {med['all']['wall']:.1f} s with: "
          f"ratio {med['all']['wall'] / med['none']['wall']:.3f}; time inside the trackers {med['all']['tracking_s']:.2f} s")

    rows, summary = runs["none"][0]["rows"], runs["none"][0]["summary"]
    server, uri = mlflow_server(root)
    try:
        print(f"\n(2) each backend replaying the {len(rows)} rows, {med['none']['step_s']:.3f} s apart:")
        for name, backend, mlflow_uri in (("tensorboard", "tensorboard", ""), ("wandb offline", "wandb", ""),
                                          ("mlflow sqlite", "mlflow", ""), ("mlflow server", "mlflow", uri)):
            r = replay(args, root, backend, rows, summary, med["none"]["step_s"], mlflow_uri)
            print(f"  {name:14s} start {r['start']:6.2f} s, per step median {1000 * r['step_median']:6.1f} ms "
                  f"(max {1000 * r['step_max']:6.1f}) = {r['step_median'] / med['none']['step_s']:.2%} of a step, "
                  f"finish {r['finish']:5.2f} s {json.dumps(r['status'])}", flush=True)
    finally:
        os.killpg(server.pid, 9)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
