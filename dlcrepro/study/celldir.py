"""A cell's directory, from its first file to its summary: `run_cell` runs (or resumes, or returns
the finished, or copies a twin of) one grid cell into `out`.

    out/config.yaml       the cell and its whole config; a checkpoint or a copy must match its numbers' part (run_identity)
    out/train.log         what happened, time-stamped (cell_log)
    out/checkpoint.pt     the run's state every ckpt_every steps, with its sidecar (checkpoint.py), removed at the end
    out/metrics.parquet   one row per step (train.Trainer.step)
    out/summary.json      the run's aggregates (summarize)
    out/finished.pt       the finished run's rows and summary, with its sidecar, written before the summary and kept:
                          a job stopped after it (whose outputs Snakemake deletes) is rewritten from it (rewrite_finished)

The loop itself is train.py's (`train_steps`); a seed's θ_0 evaluation and a lagged sampler's shared
rollouts, read here, are initial_eval.py's and rollouts.py's.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import torch
import yaml

from ..report import analysis
from . import rollouts
from ..step import checkpoint, divergence, stamped
from ..core import paths, procs, tracking
from ..cluster import check_device
from ..core.config import Config, ConfigError
from ..step.corrections import get_correction
from ..step.diagnostics import EVAL_COLUMNS, metric_columns
from ..core.grid import computed_as, get_sampler
from .initial_eval import identity as initial_identity
from .initial_eval import load_initial_eval
from ..core.preload import import_job_modules
from ..core.procs import pause_point
from ..core.registry import UnknownNameError, engine_topk
from ..step.train import Cell, Trainer, train_steps
from ..core.util import DamagedFileError, atomic_save, atomic_write_text, disk_full, log, remove_leftovers

METRICS_FILE, SUMMARY_FILE, CONFIG_FILE, CKPT_FILE, LOG_FILE, FINISHED_FILE = (
    "metrics.parquet",
    "summary.json",
    "config.yaml",
    "checkpoint.pt",
    "train.log",
    "finished.pt",
)


def summarize(rows: list[dict], cell: Cell, meta: dict, seconds: dict) -> dict:
    """The run's summary: final test accuracy, noise-floor multiple, ESS crossings, resync steps, seconds.

    The aggregates are analysis.py's, applied to this one run: each is defined once.
    """
    ids = {k: meta.get(k, "") for k in analysis.RUN}
    df = pd.DataFrame(rows).assign(**ids)
    for col in ("step", "ess_lag_presync", *metric_columns(), *EVAL_COLUMNS):
        if col not in df:  # a column every row has, absent only from a run that diverged at step 1
            df[col] = pd.Series(dtype=float)
    one = lambda f, col: f(df)[col].iloc[0] if len(df) else math.nan  # noqa: E731
    acc = df["test_accuracy"].dropna()
    as_int = lambda x: None if pd.isna(x) else int(x)  # noqa: E731
    return {
        **meta,
        "steps": int(len(df)),
        "final_test_accuracy": divergence.final_test_accuracy(acc, cell.diverged_at_step),
        "diverged_at_step": cell.diverged_at_step,
        "initial_test_accuracy": cell.initial.get("test_accuracy", math.nan),
        "initial_accuracies": cell.initial,
        "noise_floor_multiple": float(one(analysis.noise_floor_multiple, "noise_floor_multiple")),
        "leave_floor_step": as_int(one(analysis.leave_floor_step, "leave_floor_step")),
        "ess_crossing_step": as_int(one(analysis.ess_crossings, "ess_crossing_step")),
        "ess_gauss_crossing_step": as_int(one(analysis.ess_crossings, "ess_gauss_crossing_step")),
        "resync_steps": list(cell.resync_steps),
        "seconds_by_phase": {k: round(v, 2) for k, v in seconds.items()},
    }


def resource_use(tr: Trainer) -> dict:
    """The job's peak memory, for the calibrated plan (cluster/calibrate.py): the host's (this process
    and, apart, its largest child, in MB) and the device's: torch's peak allocation and each engine's
    KV-cache reservation; on a CPU torch's is None (no device) and the engines' are host memory."""
    import resource

    own, children = (resource.getrusage(w).ru_maxrss / 1024 for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    engines = {tr.engine_name(role): tr.engine_of(role) for role in ("sampler", "probe")}
    return {
        "peak_host_rss_mb": round(own + children, 1),
        "device_memory": {
            "device": str(tr.device),
            "torch_max_allocated_bytes": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None,
            "engine_kv_cache_bytes": {name: e.kv_cache_bytes() for name, e in engines.items()},
        },
    }


def run_identity(meta: dict, cfg: Config) -> dict:
    """What makes a run this run: what its numbers depend on (stamped.cell_identity, the one list of
    those keys). A checkpoint is resumed, and a finished cell kept, only by the run it names."""
    return stamped.cell_identity(stamped.run_record(meta, cfg))


def other_numbers(ran: dict, meta: dict, cfg: Config) -> list[str]:
    """Where the run recorded as `ran` (a config.yaml read back) and this cell (`meta`) under `cfg`
    differ in what their numbers depend on, [] where they do not: their `run_identity`s through the
    one comparison of identities, `stamped.mismatch`."""
    return stamped.mismatch(stamped.cell_identity(ran), run_identity(meta, cfg))


def finished_run(cell: Path) -> dict | None:
    """The record (config.yaml) of the finished run in `cell`, None if it holds none (no summary,
    table or config.yaml)."""
    if not all((cell / f).exists() for f in (SUMMARY_FILE, METRICS_FILE, CONFIG_FILE)):
        return None
    return yaml.safe_load((cell / CONFIG_FILE).read_text()) or {}


def finished_as(cell: Path, meta: dict, cfg: Config) -> bool:
    """Whether `cell` holds a finished run, computed there (not copied), of exactly this cell
    (`meta`) and of the numbers of `cfg` (`run_identity`: where it is watched or written aside)."""
    ran = finished_run(cell)
    if ran is None or "computed_as" in ran:
        return False
    return not other_numbers(ran, meta, cfg)


@contextmanager
def cell_log(path: Path):
    """`note(msg)`: `msg` on stderr and, time-stamped, on a line of the cell's log file, which is
    closed however the block ends."""
    with open(path, "a") as f:

        def note(msg: str) -> None:
            log(msg)
            try:
                f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}\n")
                f.flush()
            except OSError as e:
                raise (disk_full(e, path) or e) from e

        yield note


def copy_cell(src: Path, out: Path, meta: dict, cfg: Config, why: str) -> dict:
    """Write the cell `meta` as the finished run in `src`, which computes the same numbers bit for
    bit (grid.computed_as says why): its metrics table byte for byte, its summary under this cell's
    name with `computed_as` naming the source."""
    t0 = time.perf_counter()
    damaged = analysis.metrics_problem(src)
    if damaged:
        raise DamagedFileError(f"{src}: {damaged}; {out} copies it. Rerun that cell: delete {src} and rerun the same command")
    record = {"cell": meta, "computed_as": str(src), "why": why, **stamped.run_record(meta, cfg)}
    atomic_write_text(out / CONFIG_FILE, yaml.safe_dump(record, sort_keys=False))
    digest = atomic_save(out / METRICS_FILE, lambda tmp: shutil.copyfile(src / METRICS_FILE, tmp))
    ran = json.loads((src / SUMMARY_FILE).read_text())
    summary = {**ran, **meta, "computed_as": str(src), "why": why, "metrics_file": digest}
    summary["wall_seconds"] = round(time.perf_counter() - t0, 3)
    summary.pop("tracking", None)
    with cell_log(out / LOG_FILE) as note:
        note(f"{out} is the run in {src} ({why}): metrics copied, not recomputed")
        if cfg.tracking.backends:  # its series are in the trackers once, under the run it copies
            twin = tracking.run_name(ran)
            summary["tracking"] = f"not logged: this cell is the run logged as {twin}"
            note(f"tracking: not logged to {', '.join(cfg.tracking.backends)}: this cell is the run logged there as {twin}")
    atomic_write_text(out / SUMMARY_FILE, json.dumps(summary, indent=1))
    return summary


def check_names(cfg: Config, model: str, sampler: str, correction: str) -> None:
    """Fail fast, before anything is written, on a model the config lacks or an unregistered
    sampler or correction; the error lists the known names."""
    if model not in cfg.models:
        raise UnknownNameError(f"unknown model {model!r}; known: {sorted(cfg.models)}")
    get_sampler(sampler), get_correction(correction)


def cell_model_dir(cfg: Config, model: str, model_dir: str | None) -> Path:
    """The weights the cell starts from: `model_dir` if given, else the config's; it must hold a model."""
    mdir = paths.model_dir(cfg, model, model_dir)
    if not (mdir / "config.json").exists():
        hint = "run `python -m dlcrepro warmstart` first" if cfg.models[model].kind == "tiny" else "is it a model directory?"
        raise FileNotFoundError(f"model directory {mdir} has no config.json ({hint})")
    return mdir


def same_run(cfg: Config, meta: dict, out: Path) -> tuple[Path | None, str]:
    """The finished run this cell may copy instead of training, and why: the cell of the correction
    that computes its numbers bit for bit (grid.computed_as), beside `out` in the grid's layout
    (<correction>/<seed dir>) and finished under exactly this config. (None, why) if there is none."""
    same, why = computed_as(meta["sampler"], meta["correction"], cfg.train_for(meta["model"]))
    if same != meta["correction"] and out.parent.name == meta["correction"]:
        src = out.parent.parent / same / out.name
        if finished_as(src, {**meta, "correction": same}, cfg):
            return src, why
    return None, why


def start_or_resume(tr: Trainer, ckpt: Path, out: Path, meta: dict, run: dict, note) -> Cell:
    """The run's state: from its checkpoint if there is one that verifies as this run's, else fresh,
    with θ_0's accuracies (where every run's accuracy curve starts: `Trainer.evaluate(0)`); a
    checkpoint that does not verify is set aside, named. The run's engine then holds θ_s."""
    cell, resumed = None, False
    if ckpt.exists():
        try:
            cell = tr.load_checkpoint(ckpt, run)
            resumed = True
            note(f"resuming {out} from step {cell.step}")
        except checkpoint.BadCheckpoint as e:
            aside = checkpoint.set_aside(ckpt, e.kind)
            note(f"{e}: set aside as {aside} (delete it once you have looked); starting {out} again from step 0")
    if cell is None:
        cell = Cell()
        note(f"starting {out}: {meta}")
        cell.initial = tr.evaluate(0)
    where = {k: os.environ[k] for k in ("SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES") if k in os.environ}
    note(f"device {tr.device}, torch threads {torch.get_num_threads()}" + "".join(f", {k}={v}" for k, v in where.items()))
    tr.start_engines(cell, resumed)
    return cell


def train_cell(cfg: Config, meta: dict, mdir: Path, out: Path, note, keep_checkpoint: bool, shared_rollouts: Path | None = None,
               initial_eval: Path | None = None) -> dict:
    """Train the cell `meta` to its last step (resuming from its checkpoint if there is one) and
    write its metrics and summary; the checkpoint is then removed unless `keep_checkpoint`.
    `shared_rollouts`: the file of its sampler's shared steps (rollouts.py), which it samples itself
    without; `initial_eval`: the file of its seed's θ_0 evaluation (initial_eval.py), which it
    computes itself without."""
    t0 = time.perf_counter()
    # the process's start-up before this (interpreter and imports in its own process, under a second
    # in a fork server's child): on the job's wall clock but not its summary's; the calibration projects it apart
    startup = procs.seconds_since_start()
    started = {"process": procs.how_started(), "startup_seconds": None if startup is None else round(startup, 2)}
    shared, initial = None, None
    if initial_eval is not None:  # checked before anything loads, as the rollouts are
        initial = load_initial_eval(initial_eval, initial_identity(cfg, meta["model"], meta["seed"], mdir))
        note(f"θ_0's accuracies are read from {initial_eval}")
    if shared_rollouts is not None:  # checked before anything loads: another run's file stops here
        topk = engine_topk(meta["correction"], cfg.engine)  # what Trainer.topk will be
        shared = rollouts.load(shared_rollouts, rollouts.identity(cfg, meta["model"], meta["sampler"], meta["seed"], mdir, topk),
                               topk)
        note(f"steps {min(shared)}-{max(shared)}: the batches its engine samples at θ_0 are read from {shared_rollouts}")
    torch.manual_seed(meta["seed"])
    tr = Trainer(cfg, meta["model"], meta["sampler"], meta["correction"], meta["seed"], mdir, shared_rollouts=shared,
                 initial=initial)
    setup_sec = time.perf_counter() - t0
    ckpt, run = out / CKPT_FILE, run_identity(meta, cfg)
    cell = start_or_resume(tr, ckpt, out, meta, run, note)
    first_step = cell.step  # a resumed run times only the steps after it
    trackers = tracking.open_trackers(cfg, out, note, first_step=cell.step + 1)
    trackers.start(meta, tracking.cell_params(cfg, meta))
    try:
        totals = train_steps(tr, cell, ckpt=ckpt, run=run, note=note, desc=tracking.run_name(meta), trackers=trackers)
    except BaseException:
        trackers.finish(None)  # the trackers' runs end as failed; the checkpoint is kept
        raise
    totals["setup"] = setup_sec
    if trackers.status:
        totals["tracking"] = trackers.seconds  # starting the trackers and each step's logging
    digest = write_metrics(out, cell.rows)
    summary = summarize(cell.rows, cell, meta, totals)
    summary["wall_seconds"] = round(time.perf_counter() - t0, 1)
    summary["steps_timed"] = cell.step - first_step  # the steps seconds_by_phase covers
    summary.update(started)
    summary.update(resource_use(tr))
    summary["sampler_computes_with"] = tr.engine.computes_with  # which FP8 path (or BF16) sampled this cell
    summary["metrics_file"] = digest  # what `collect` checks the table against
    trackers.finish(summary)
    if trackers.status:
        summary["tracking"] = trackers.status
    if keep_checkpoint:  # the final θ_t and θ_s, e.g. for `python -m dlcrepro scan --checkpoint`
        tr.save_checkpoint(ckpt, cell, run)
    # from here on the work is kept outside the workflow's outputs, which Snakemake deletes when the
    # job fails (a time limit, a node failure just after this): its retry writes them from this record
    checkpoint.save(out / FINISHED_FILE, {"rows": cell.rows, "summary": summary}, finished_identity(meta, cfg), cell.step, None)
    pause_point("finished_record")
    atomic_write_text(out / SUMMARY_FILE, json.dumps(summary, indent=1))
    pause_point("summary_written")
    if not keep_checkpoint:
        checkpoint.remove(ckpt)
        pause_point("checkpoint_removed")
    shown = ('final_test_accuracy', 'noise_floor_multiple', 'resync_steps', 'diverged_at_step')
    note(f"finished {out}: {json.dumps({k: summary[k] for k in shown})}")
    return summary


def write_metrics(out: Path, rows: list[dict]) -> dict:
    """The run's metrics table, one row per step, atomically; its digest (what `collect` checks)."""
    df = pd.DataFrame(rows)
    return atomic_save(out / METRICS_FILE, lambda tmp: df.to_parquet(tmp, index=False))


@functools.cache
def code_digest() -> str:
    """sha256 of the package's source (every dlcrepro/**/*.py, by path and bytes): the code a finished
    record was computed by."""
    root = Path(__file__).parents[1]  # dlcrepro/, above this layer's folder
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(f"{f.relative_to(root)}\0".encode() + f.read_bytes() + b"\0")
    return h.hexdigest()


def finished_identity(meta: dict, cfg: Config) -> dict:
    """What a finished record stands in for: the run's numbers (`run_identity`) as this code computes
    them. Other code (a fix, then `--forcerun`) recomputes the cell rather than rewrite the old numbers."""
    return {"run": run_identity(meta, cfg), "code": code_digest()}


def rewrite_finished(out: Path, meta: dict, cfg: Config, keep_checkpoint: bool) -> dict | None:
    """The summary of a run that finished in an earlier job stopped before it ended (Slurm's time
    limit, a node failure, a kill after its last write), whose outputs Snakemake then deleted: its
    metrics and summary written again from its finished record, no step recomputed. None if `out`
    holds no record of this run; one of other numbers or code is removed, a damaged one set aside."""
    path = out / FINISHED_FILE
    if not path.exists():
        return None
    with cell_log(out / LOG_FILE) as note:
        try:
            blob, _ = checkpoint.load(path, finished_identity(meta, cfg))
        except checkpoint.BadCheckpoint as e:
            if e.kind == "other-run":  # results this cell no longer stands for: never work to keep
                checkpoint.remove(path)
                note(f"{e}: removed")
            else:
                note(f"{e}: set aside as {checkpoint.set_aside(path, e.kind)}")
            return None
        note(f"{out} finished in an earlier job, stopped before it ended: its metrics and summary are written again from "
             f"{FINISHED_FILE}, no step recomputed")
        atomic_write_text(out / CONFIG_FILE, yaml.safe_dump(stamped.run_record(meta, cfg), sort_keys=False))
        summary = {**blob["summary"], "metrics_file": write_metrics(out, blob["rows"])}
        atomic_write_text(out / SUMMARY_FILE, json.dumps(summary, indent=1))
        pause_point("summary_written")  # the same moments as a training job's last writes (procs.py)
        if not keep_checkpoint:  # left by a job stopped between its record and the checkpoint's removal
            checkpoint.remove(out / CKPT_FILE)
            pause_point("checkpoint_removed")
        note(f"finished {out} (from {FINISHED_FILE})")
        return summary


def finished_here(out: Path, meta: dict, cfg: Config) -> dict | None:
    """The summary of the finished run in `out` if it is this cell's under the numbers of `cfg`
    (computed or copied); None if `out` holds no finished run. A finished run of other numbers is
    refused, naming what differs: its results are never overwritten in place."""
    ran = finished_run(out)
    if ran is None:
        return None
    diff = other_numbers(ran, meta, cfg)
    if diff:
        raise ConfigError(f"{out} holds a finished run of other numbers ({'; '.join(diff)}): "
                          f"to train this one there, delete {out} and rerun the same command")
    return json.loads((out / SUMMARY_FILE).read_text())


def run_cell(cfg: Config, model: str, sampler: str, correction: str, seed: int, out: Path, model_dir: str | None = None,
             keep_checkpoint: bool = False, shared_rollouts: Path | None = None, initial_eval: Path | None = None) -> dict:
    """Run (or resume, or return the finished) cell; write metrics, config, summary and log into `out`.
    A cell whose numbers a finished cell of the grid computes bit for bit copies them instead.
    `shared_rollouts`: its sampler's shared steps (rollouts.py); `initial_eval`: its seed's θ_0
    evaluation (initial_eval.py): the same numbers, computed once."""
    out = Path(out)
    check_names(cfg, model, sampler, correction)
    mdir = cell_model_dir(cfg, model, model_dir)
    meta = {"model": model, "sampler": sampler, "correction": correction, "seed": seed, "model_dir": str(mdir)}
    done = finished_here(out, meta, cfg)
    if done is not None:
        return done
    done = rewrite_finished(out, meta, cfg, keep_checkpoint)
    if done is not None:
        return done
    src, why = same_run(cfg, meta, out)
    if src is not None:
        return copy_cell(src, out, meta, cfg, why)
    check_device(cfg, model)  # a config asking for a GPU stops here on a CPU torch or without a device
    # a job in its own process imports first what a fork server's child inherits: its start-up
    # (summary's startup_seconds) then holds every import, its setup phase none
    import_job_modules()
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / CONFIG_FILE, yaml.safe_dump(stamped.run_record(meta, cfg), sort_keys=False))
    with cell_log(out / LOG_FILE) as note:
        for tmp in remove_leftovers(out):  # a killed run's half-written file: never a result, only space taken
            note(f"removed {tmp.name}, left half-written by an earlier run")
        return train_cell(cfg, meta, mdir, out, note, keep_checkpoint, shared_rollouts, initial_eval)
