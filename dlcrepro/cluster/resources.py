"""A job's Slurm resources, by job kind: one function, `job_resources`, read by the workflow's rules
(workflow/rules/common.smk, `job_resource`), the plan and the device check."""

from __future__ import annotations

import math
from typing import Callable

from ..core.config import Config
from .costs import initial_eval_minutes, rollouts_minutes

# A training job's resources where neither its model nor the config's `resources` name them. One CPU:
# a tiny cell's step is small products, softmaxes and engine calls that barely use a second thread, so
# `--cores 2` runs two one-thread jobs at once. Measured on 2 AVX-512 EPYC cores (docs/measurements.md, "The
# schedule on two cores"): 4 tiny cells of 40 steps took 85 s two at a time on one thread each, 119 s
# one at a time on two threads (33.7 against 25.1 s a cell); the threads changed only the last bit of
# the probes' gradient norms. Not measured on 4 or 8 cores, where the same rule gives 4 or 8 jobs at once.
TRAIN_DEFAULTS = {"gpu": 0, "runtime": 30, "mem_mb": 4000, "cpus_per_task": 1}
# What a cell that copies another one's metrics asks of a cluster: no GPU, one core, minutes.
COPY_RESOURCES = {"gpu": 0, "runtime": 10, "mem_mb": 2000, "cpus_per_task": 1}
# A batch-size scan's (workflow/rules/scaling.smk): a few training steps' work per rung, on two threads.
SCAN_DEFAULTS = {"gpu": 0, "runtime": 60, "mem_mb": 4000}
SCAN_THREADS = 2

# The jobs whose runtime the cost model estimates (costs.py): minutes of one job, None where the
# model is not in the cost model. Such a job asks for a training job's resources of its model, its
# runtime twice the estimate rounded up to 10 minutes (the training jobs' rule), at most a
# training job's.
ESTIMATES: dict[str, Callable[[Config, str, str | None], float | None]] = {
    "rollouts": lambda cfg, model, sampler: rollouts_minutes(cfg, model, sampler),
    "initial_eval": lambda cfg, model, sampler: initial_eval_minutes(cfg, model),
}
JOBS = ("train", "pilot", "copy", "scan", *ESTIMATES)


def job_resources(cfg: Config, model: str, job: str = "train", sampler: str | None = None, calibration: dict | None = None,
                  name: str | None = None, attempt: int = 1) -> dict[str, int]:
    """The Slurm resources (gpu, runtime, mem_mb, cpus_per_task) of a job of kind `job` on `model`:

        train         the model's `resources`, else the config's `resources`, else TRAIN_DEFAULTS
        pilot         a pilot cell (calibrate.py): a training job's
        copy          a cell that copies another's metrics: COPY_RESOURCES
        rollouts      a training job's, its runtime from the cost model (ESTIMATES; `sampler` needed)
        initial_eval  the same
        scan          as a training job's, with SCAN_DEFAULTS, on SCAN_THREADS cores

    With a `calibration` (calibrate.load_calibration) that holds the job `name` (a cell's
    model/sampler/correction/seed<k>, a rollouts job's model/sampler/seed<k>, a θ_0 evaluation's
    model/seed<k>), its runtime and mem_mb are the calibration's. Attempt n of a job (Snakemake's
    `attempt`: a retry after a failure, e.g. a job killed at its time limit) asks for 2^(n-1) times
    the runtime. Values given on a command line arrive as text, hence int()."""
    r = _base_resources(cfg, model, job, sampler)
    if calibration is not None and name is not None:
        key = f"{'train' if job == 'copy' else job}/{name}"
        r.update({k: int(v) for k, v in calibration["jobs"].get(key, {}).items() if k in ("runtime", "mem_mb")})
    r["runtime"] *= 2 ** (int(attempt) - 1)
    return r


def _base_resources(cfg: Config, model: str, job: str, sampler: str | None) -> dict[str, int]:
    if job == "copy":
        return dict(COPY_RESOURCES)
    own = cfg.models[model].resources
    if job == "scan":
        r = {k: int(own.get(k, cfg.resources.get(k, d))) for k, d in SCAN_DEFAULTS.items()}
        return {**r, "cpus_per_task": SCAN_THREADS}
    if job not in ("train", "pilot") and job not in ESTIMATES:
        raise ValueError(f"unknown job kind {job!r}: one of {', '.join(JOBS)}")
    r = {k: int(own.get(k, cfg.resources.get(k, d))) for k, d in TRAIN_DEFAULTS.items()}
    est = ESTIMATES[job](cfg, model, sampler) if job in ESTIMATES else None
    if est is not None:
        r["runtime"] = min(r["runtime"], 10 * math.ceil(2 * est / 10))
    return r


def gres(resources: dict[str, int]) -> str:
    """A job's GPUs as a Slurm GRES string ("gpu:1"; "" for none). A GRES string, not a `gpu` count:
    the Slurm jobstep plugin 0.6.1 rejects a count computed by a function ("gpu must be an integer,
    but is 1")."""
    return f"gpu:{resources['gpu']}" if resources["gpu"] > 0 else ""


def gpu_key(cfg: Config, model: str) -> str:
    """The config key that sets a model's GPU count."""
    return f"models.{model}.resources.gpu" if "gpu" in cfg.models[model].resources else "resources.gpu"


def gpu_minutes(resources: dict[str, int]) -> int:
    return resources["gpu"] * resources["runtime"]
