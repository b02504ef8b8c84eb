"""The plan calibrated from the jobs that ran (`python -m dlcrepro plan --calibrate <results dir>`).

Three steps, each a function from tables (lists of per-job dicts) to tables:

    measurements(cfg, results)   I/O: one row per finished job (summary.json, Snakemake's benchmark
                                 file): its kind, cost class, wall seconds, peak host memory, a
                                 trained cell's seconds per phase and how often each phase ran
    project(cfg, measured)       pure: one row per job of the grid (and the pilot's), its minutes
                                 measured (it ran), projected from its cost class's measurements,
                                 or assumed (the H200 cost model, or nothing), and its requests
    calibration(cfg, projected)  pure: what `job_resources` reads back (`<results>/_calibration.<name>.json`)

A trained cell's time is additive in its phases (phases.PHASES): each phase's seconds per occurrence,
measured on a cell of the same cost class (the same model, engine precision, top-k log-probs or
none, SGD steps per batch), times how often the cell pays it (every step; probes on probe steps;
evaluations on eval steps; checkpoints every ckpt_every steps; sampling and syncs only on the steps
a lagged sampler does not read from its shared rollouts), plus the class's fixed seconds (process
start, model load, engine start: the job's wall time less its phases). A rollouts job is projected
from one of the same model and sampler, a θ_0 evaluation from one of the same model. Torch- and
pandas-free: the Snakefile reads the calibration file at parse time.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from pathlib import Path
from typing import TypedDict

from ..core.config import Config, to_dict
from ..core.grid import computed_as, get_sampler
from ..core.phases import ENGINE_PHASES, PHASES, Schedule
from ..core.registry import correction_info, engine_topk, updates_per_batch
from .cells import GridCell, grid_cells, initial_eval_jobs, rollouts_jobs
from .costs import estimated_minutes, initial_eval_minutes, rollouts_minutes

CALIBRATION_FILE = "_calibration.{name}.json"  # per config name: the tiny and paper studies share results/
PILOT_DIR = "_pilot"
# A pilot cell's steps, and its checkpoint interval: enough for every phase to run at least once
# (its last step evaluates; a checkpoint after step 1).
PILOT_STEPS = 2
PILOT_OVERRIDES = {"train.steps": PILOT_STEPS, "train.ckpt_every": 1}
# Requests from a projection: runtime this many times the projected minutes (a projection from a
# few steps errs; a job over its limit is killed and retried with a doubled limit), rounded up to
# 10 minutes; memory this many times the measured peak, rounded up to 1000 MB.
RUNTIME_MARGIN = 1.5
MEM_MARGIN = 1.5
FORMAT = 1


def cost_class(cfg: Config, model: str, sampler: str, correction: str) -> str:
    """A trained cell's cost class: what its time depends on besides its schedule. The engine's
    precision (bf16, fp8), whether it returns top-k log-probs (a correction that reads q), and the
    SGD steps per batch (a multi-update correction's gradients)."""
    t = cfg.train_for(model)
    topk = "topk" if engine_topk(correction, cfg.engine) else "no-topk"
    return f"{model}|{get_sampler(sampler).precision}|{topk}|{updates_per_batch(correction, t)} SGD/batch"


def pilot_cells(cfg: Config) -> list[GridCell]:
    """The pilot's cells: per model, one cell of each cost class the grid's trained cells have, on
    the grid's first seed, each a correction that is its own computation under its sampler; a
    sampler synced every step preferred (a lagged one's cells read shared rollouts, which a cell cut
    to PILOT_STEPS cannot)."""
    trained = [c for c in grid_cells(cfg) if c.same_as is None]
    samplers = sorted(dict.fromkeys(cfg.grid.samplers), key=lambda s: not get_sampler(s).always_synced)
    chosen: dict[str, GridCell] = {}
    for c in trained:
        k = cost_class(cfg, c.model, c.sampler, c.correction)
        if k in chosen:
            continue
        for s in samplers:  # the preferred sampler of this precision whose cell is its own computation
            if (get_sampler(s).precision == get_sampler(c.sampler).precision
                    and computed_as(s, c.correction, cfg.train_for(c.model))[0] == c.correction):
                chosen[k] = GridCell(c.model, s, c.correction, int(cfg.grid.seeds[0]))
                break
        else:
            chosen[k] = GridCell(c.model, c.sampler, c.correction, int(cfg.grid.seeds[0]))
    return list(chosen.values())


def pilot_rollouts_jobs(cfg: Config) -> list[tuple[str, str, int]]:
    """The pilot's rollouts jobs: per model and lagged sampler, its first seed's (a job the grid
    needs anyway)."""
    first: dict[tuple[str, str], tuple[str, str, int]] = {}
    for m, s, seed in rollouts_jobs(cfg):
        first.setdefault((m, s), (m, s, seed))
    return list(first.values())


def pilot_initial_eval_jobs(cfg: Config) -> list[tuple[str, int]]:
    """The pilot's θ_0 evaluations: per model, its first seed's (read by its pilot cells)."""
    first: dict[str, tuple[str, int]] = {}
    for m, seed in initial_eval_jobs(cfg):
        first.setdefault(m, (m, seed))
    return list(first.values())


def config_digest(cfg: Config) -> str:
    """What a calibration's projection depends on: the config's task, engine, train and models
    sections (resources aside). A calibration of another config is refused."""
    d = to_dict(cfg)
    models = {m: {k: v for k, v in (spec or {}).items() if k != "resources"} for m, spec in d.get("models", {}).items()}
    key = {k: d.get(k) for k in ("task", "engine", "train")} | {"models": models}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- schedules


def phase_counts(cfg: Config, model: str, sampler: str, steps: int, first: int = 1, train_overrides: dict | None = None,
                 resyncs: bool = False) -> dict[str, int]:
    """How many times each phase runs over steps `first`..`steps` of a cell (train.Trainer.step):
    every step, probes on probe steps and the last, evaluations on eval steps and the last,
    checkpoints every ckpt_every steps but the last; a lagged sampler's sampling and syncs only
    after its shared steps (before them it reads its shared rollouts: the workflow's cells), unless
    its correction `resyncs`: it reads them only until its first resync, which no schedule says, so
    it is counted as sampling every step (as the cost model counts it: plan.py)."""
    t = cfg.train_for(model)
    schedule = Schedule.of(t, steps=steps, **(train_overrides or {}))
    ks = range(first, steps + 1)
    shared = 0 if resyncs else get_sampler(sampler).shared_steps(steps, t.sync_every)
    counts = dict.fromkeys(PHASES, len(ks))
    counts["probe"] = schedule.count(schedule.probes, first)
    counts["eval"] = schedule.count(schedule.evaluates, first)
    counts["checkpoint"] = schedule.count(schedule.checkpoints, first)
    for p in ENGINE_PHASES:
        counts[p] = sum(k > shared for k in ks)
    return counts


# ----------------------------------------------------------------------------- what ran


def _benchmark(path: Path) -> dict[str, float]:
    """Snakemake's benchmark file: wall seconds `s`, `max_rss` (MB), `cpu_time` of the job's last run."""
    if not path.exists():
        return {}
    rows = list(csv.DictReader(path.open(), delimiter="\t"))
    if not rows:
        return {}
    out = {}
    for k in ("s", "max_rss", "cpu_time"):
        try:
            out[k] = float(rows[-1][k])
        except (KeyError, ValueError):  # "NA" where psutil could not read the process
            pass
    return out


# One finished job as `measurements` reads it back. "class": its cost class (`cost_class`; a
# rollouts job's model|sampler, a θ_0 evaluation's model, "copy"); wall_s: Snakemake's benchmark,
# else the summary's; peak_host_mb: the larger of the benchmark's and the summary's; the device's
# peaks (None on a CPU). A trained cell's also: its steps, how its process started and its start-up
# seconds, and per phase (phases.PHASES) the seconds it spent (`seconds`) over the steps it timed and
# how often the phase ran in them (`counts`, phase_counts).
MeasuredJob = TypedDict("MeasuredJob", {
    "kind": str, "name": str, "class": str, "wall_s": float | None, "peak_host_mb": float | None,
    "torch_peak_bytes": int | None, "kv_cache_bytes": dict | None,
    "steps": int, "process": str | None, "startup_s": float | None,
    "seconds": dict[str, float], "counts": dict[str, int],
}, total=False)


def _job_row(kind: str, name: str, bench: dict, summary: dict | None = None) -> MeasuredJob:
    mem = [v for v in (bench.get("max_rss"), (summary or {}).get("peak_host_rss_mb")) if v is not None and not math.isnan(v)]
    wall = bench.get("s")
    if wall is None and summary is not None:
        wall = summary.get("wall_seconds")
    device = (summary or {}).get("device_memory") or {}
    return {"kind": kind, "name": name, "wall_s": wall, "peak_host_mb": max(mem) if mem else None,
            "torch_peak_bytes": device.get("torch_max_allocated_bytes"), "kv_cache_bytes": device.get("engine_kv_cache_bytes")}


def measurements(cfg: Config, results: Path) -> list[MeasuredJob]:
    """One row per finished job of this config's grid and pilot under `results`: kind (train, pilot,
    copy, rollouts, initial_eval), name, class, wall_s, peak_host_mb, device memory (absent on a CPU),
    and for a trained cell its phase seconds (`seconds`) and how often each ran (`counts`)
    over the steps it timed (a resumed cell's summary times those since its resumption)."""
    results = Path(results)
    bench_dir = results / "_benchmarks"
    rows: list[MeasuredJob] = []
    cells = [("train", c) for c in grid_cells(cfg)] + [("pilot", c) for c in pilot_cells(cfg)]
    for kind, c in cells:
        base = results / PILOT_DIR if kind == "pilot" else results
        path = base / c.name / "summary.json"
        if not path.exists():
            continue
        summary = json.loads(path.read_text())
        bench = _benchmark(bench_dir / kind / f"{c.name}.tsv")
        if "computed_as" in summary:
            rows.append({**_job_row("copy", c.name, bench), "class": "copy"})
            continue
        steps = int(summary.get("steps", 0))
        timed = int(summary.get("steps_timed", steps))
        overrides = {"ckpt_every": PILOT_OVERRIDES["train.ckpt_every"]} if kind == "pilot" else None
        counts = phase_counts(cfg, c.model, c.sampler, steps, steps - timed + 1, overrides)
        seconds = {p: float(summary.get("seconds_by_phase", {}).get(p, 0.0)) for p in PHASES}
        if correction_info(c.correction).resync and get_sampler(c.sampler).shared_steps(steps, cfg.train_for(c.model).sync_every):
            # a lagged cell that resyncs samples from its first resync on: on steps no schedule says,
            # so its sampling and syncs teach no rate (their seconds stay in its fixed part's sum)
            for p in ENGINE_PHASES:
                counts[p] = 0
        rows.append({**_job_row(kind, c.name, bench, summary), "class": cost_class(cfg, c.model, c.sampler, c.correction),
                     "steps": steps, "process": summary.get("process"), "startup_s": summary.get("startup_seconds"),
                     "seconds": seconds, "counts": counts})
    for m, s, seed in rollouts_jobs(cfg):
        name = f"{m}/{s}/seed{seed}"
        if (results / "_rollouts" / f"{name}.pt").exists():
            rows.append({**_job_row("rollouts", name, _benchmark(bench_dir / "rollouts" / f"{name}.tsv")), "class": f"{m}|{s}"})
    for m, seed in initial_eval_jobs(cfg):
        name = f"{m}/seed{seed}"
        if (results / "_initial" / f"{name}.json").exists():
            rows.append({**_job_row("initial_eval", name, _benchmark(bench_dir / "initial_eval" / f"{name}.tsv")), "class": m})
    return rows


# ----------------------------------------------------------------------------- the projection


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def phase_rates(measured: list[MeasuredJob]) -> dict[str, dict]:
    """Per trained-cell cost class: each phase's seconds per occurrence (Σ seconds / Σ occurrences
    over the class's measured cells that it occurred in), its fixed seconds (mean of wall − Σ those
    phases − the process's start-up: a phase a cell has no count of, as a lagged cell's reading of
    its shared steps, stays in its fixed part), its peak host memory (the largest), and the cells
    it came from."""
    by_class: dict[str, list[MeasuredJob]] = {}
    for r in measured:
        if r["kind"] in ("train", "pilot") and r["wall_s"] is not None:
            by_class.setdefault(r["class"], []).append(r)
    rates = {}
    for k, rows in by_class.items():
        per = {}
        for p in PHASES:
            n = sum(r["counts"][p] for r in rows)
            per[p] = sum(r["seconds"][p] for r in rows if r["counts"][p]) / n if n else None
        fixed = _mean([max(0.0, r["wall_s"] - sum(r["seconds"][p] for p in PHASES if r["counts"][p])
                            - (r.get("startup_s") or 0.0)) for r in rows])
        mem = [r["peak_host_mb"] for r in rows if r["peak_host_mb"] is not None]
        rates[k] = {"per": per, "fixed_s": fixed, "peak_host_mb": max(mem) if mem else None,
                    "from": [f"{r['kind']} {r['name']}" for r in rows]}
    return rates


def startup(measured: list[MeasuredJob]) -> dict | None:
    """The start-up a trained job's projection adds: how the measured trained jobs' processes
    mostly started (their own, importing torch and vLLM, as every Slurm job does; or forked by the
    local executor's fork server) and the mean start-up seconds of those that started so. It
    depends on the executor, not the cell: the rest of a grid starts as its pilot did. None where no
    job recorded it."""
    rows = [r for r in measured if r["kind"] in ("train", "pilot") and r.get("process") and r.get("startup_s") is not None]
    if not rows:
        return None
    kinds = [r["process"] for r in rows]
    most = max(sorted(set(kinds)), key=kinds.count)
    same = [r["startup_s"] for r in rows if r["process"] == most]
    return {"process": most, "seconds": _mean(same), "jobs": len(same)}


def _plain(measured: list[MeasuredJob], kind: str) -> dict[str, dict]:
    """Per class of a job kind without phases (rollouts, initial_eval, copy): mean wall seconds and
    the largest peak host memory of its finished jobs."""
    out: dict[str, dict] = {}
    for r in measured:
        if r["kind"] == kind and r["wall_s"] is not None:
            out.setdefault(r["class"], []).append(r)
    return {k: {"wall_s": _mean([r["wall_s"] for r in rows]),
                "peak_host_mb": max((r["peak_host_mb"] for r in rows if r["peak_host_mb"] is not None), default=None),
                "from": [r["name"] for r in rows]} for k, rows in out.items()}


def request_runtime(minutes: float) -> int:
    return max(10, 10 * math.ceil(RUNTIME_MARGIN * minutes / 10))


def request_mem_mb(peak_mb: float) -> int:
    return max(1000, 1000 * math.ceil(MEM_MARGIN * peak_mb / 1000))


def _uncalibrated(cfg: Config, kind: str, model: str, sampler: str | None, correction: str | None) -> tuple[dict, float | None]:
    """The request and the cost model's minutes a job has without a calibration."""
    from .resources import job_resources

    r = job_resources(cfg, model, "train" if kind == "pilot" else kind, sampler)
    est = {"train": lambda: estimated_minutes(cfg, model, correction), "pilot": lambda: None, "copy": lambda: None,
           "rollouts": lambda: rollouts_minutes(cfg, model, sampler),
           "initial_eval": lambda: initial_eval_minutes(cfg, model)}[kind]()
    return r, est


def all_jobs(cfg: Config) -> list[dict]:
    """Every job of the grid and of the pilot: kind, name, model, sampler, correction, class."""
    jobs = [dict(kind="initial_eval", name=f"{m}/seed{s}", model=m, sampler=None, correction=None,
                 cls=m) for m, s in initial_eval_jobs(cfg)]
    jobs += [dict(kind="rollouts", name=f"{m}/{s}/seed{k}", model=m, sampler=s, correction=None,
                  cls=f"{m}|{s}") for m, s, k in rollouts_jobs(cfg)]
    for kind, cells in (("pilot", pilot_cells(cfg)), ("train", grid_cells(cfg))):
        for c in cells:
            copy = kind == "train" and c.same_as is not None
            jobs.append(dict(kind="copy" if copy else kind, name=c.name, model=c.model, sampler=c.sampler,
                             correction=c.correction,
                             cls="copy" if copy else cost_class(cfg, c.model, c.sampler, c.correction)))
    return jobs


def project(cfg: Config, measured: list[MeasuredJob]) -> list[dict]:
    """One row per job (all_jobs): its uncalibrated request and cost-model minutes, then its minutes
    and where they come from (`source`: measured, the job ran; projected, from its class's
    measurements; assumed, none: the cost model's, or none at all), and the requests they give
    (runtime, mem_mb; the uncalibrated ones where assumed). GPUs are the uncalibrated request's."""
    rates, plain = phase_rates(measured), {k: _plain(measured, k) for k in ("rollouts", "initial_eval", "copy")}
    start = startup(measured)
    ran = {(r["kind"], r["name"]): r for r in measured}
    rows = []
    for j in all_jobs(cfg):
        r, est = _uncalibrated(cfg, j["kind"], j["model"], j["sampler"], j["correction"])
        row = {**{k: j[k] for k in ("kind", "name", "model", "sampler", "correction")}, "class": j["cls"], "gpu": r["gpu"],
               "assumed_minutes": est, "runtime_uncalibrated": r["runtime"], "mem_mb_uncalibrated": r["mem_mb"],
               "minutes": est, "peak_host_mb": None, "source": "assumed",
               "basis": "the H200 cost model" if est is not None else "none"}
        done = ran.get((j["kind"], j["name"]))
        if done is not None and done["wall_s"] is not None:
            row.update(minutes=done["wall_s"] / 60, peak_host_mb=done["peak_host_mb"], source="measured", basis="it ran",
                       torch_peak_bytes=done["torch_peak_bytes"], kv_cache_bytes=done["kv_cache_bytes"])
        elif j["kind"] in ("train", "pilot") and j["cls"] in rates:
            k = rates[j["cls"]]
            if j["kind"] == "pilot":
                counts = phase_counts(cfg, j["model"], j["sampler"], PILOT_STEPS, 1,
                                      {"ckpt_every": PILOT_OVERRIDES["train.ckpt_every"]})
            else:
                counts = phase_counts(cfg, j["model"], j["sampler"], cfg.train_for(j["model"]).steps,
                                      resyncs=correction_info(j["correction"]).resync)
            unmeasured = [p for p in PHASES if counts[p] and k["per"][p] is None]
            startup_s = start["seconds"] if start else 0.0
            seconds = startup_s + k["fixed_s"] + sum(counts[p] * (k["per"][p] or 0.0) for p in PHASES)
            basis = "phases of " + ", ".join(k["from"]) + (f"; never measured: {', '.join(unmeasured)}" if unmeasured else "")
            if start:
                basis += f"; start-up as a {start['process']} ({start['seconds']:.1f} s, mean of {start['jobs']} jobs)"
            row.update(minutes=seconds / 60, peak_host_mb=k["peak_host_mb"], source="projected", basis=basis, startup_s=startup_s)
        elif j["kind"] in plain and j["cls"] in plain[j["kind"]]:
            k = plain[j["kind"]][j["cls"]]
            row.update(minutes=k["wall_s"] / 60, peak_host_mb=k["peak_host_mb"], source="projected",
                       basis="mean of " + ", ".join(k["from"]))
        if row["source"] != "assumed":
            row["runtime"] = request_runtime(row["minutes"])
            row["mem_mb"] = request_mem_mb(row["peak_host_mb"]) if row["peak_host_mb"] else r["mem_mb"]
        else:
            row["runtime"], row["mem_mb"] = r["runtime"], r["mem_mb"]
        rows.append(row)
    return rows


def calibration(cfg: Config, projected: list[dict], results: str) -> dict:
    """The calibration file's content: each job's calibrated requests, keyed `<kind>/<name>` as
    `job_resources` asks (a copy under `train/`, its rule's), for this config only (its digest)."""
    jobs = {}
    for r in projected:
        if r["source"] == "assumed":
            continue
        kind = "train" if r["kind"] == "copy" else r["kind"]
        jobs[f"{kind}/{r['name']}"] = {"runtime": r["runtime"], "mem_mb": r["mem_mb"], "minutes": round(r["minutes"], 3),
                                       "source": r["source"]}
        if r.get("startup_s") is not None and r["source"] == "projected":
            jobs[f"{kind}/{r['name']}"]["startup_s"] = round(r["startup_s"], 2)
    return {"format": FORMAT, "config": cfg.name, "digest": config_digest(cfg), "results_dir": str(results),
            "margins": {"runtime": RUNTIME_MARGIN, "mem": MEM_MARGIN}, "jobs": jobs}


class CalibrationError(ValueError):
    pass


def calibration_path(cfg: Config, results: str | Path) -> Path:
    """Where `plan --calibrate` writes a config's calibration and the rules read it."""
    return Path(results) / CALIBRATION_FILE.format(name=cfg.name)


def load_calibration(cfg: Config, results: str | Path) -> dict | None:
    """The calibration file under `results`, checked against this config; None where there is none."""
    path = calibration_path(cfg, results)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CalibrationError(f"{path}: not a calibration file ({e}); delete it or rerun `python -m dlcrepro plan --calibrate "
                               f"{results}`") from e
    if data.get("format") != FORMAT or data.get("digest") != config_digest(cfg):
        raise CalibrationError(
            f"{path} was calibrated for another config than {cfg.name!r} (its task, engine, train or models section changed): "
            f"rerun `python -m dlcrepro plan --config <your configs> --calibrate {results}`, or delete it to use the "
            "uncalibrated requests")
    return data


# ----------------------------------------------------------------------------- the text


def calibration_text(cfg: Config, projected: list[dict], written: Path | None = None) -> str:
    """The calibrated plan beside the uncalibrated one: per job kind and class, the jobs, their
    minutes each (measured, projected or assumed) against the cost model's, their requests against
    the uncalibrated ones; totals of job-hours and GPU-hours; device memory where recorded."""
    groups: dict[tuple[str, str], list[dict]] = {}
    order = ("initial_eval", "rollouts", "pilot", "train", "copy")
    for r in sorted(projected, key=lambda r: order.index(r["kind"])):
        groups.setdefault((r["kind"], r["class"]), []).append(r)
    fmt = "{:<13}{:<40}{:>5}{:>6}  {:>13}{:>13}  {:<22}{:<22}"
    lines = [f"dlcrepro plan, calibrated: {cfg.name}", "",
             fmt.format("job", "class", "jobs", "done", "min/job", "cost model", "request", "uncalibrated")]
    for (kind, cls), rows in groups.items():
        mins = [r["minutes"] for r in rows if r["minutes"] is not None]
        sources = sorted({r["source"] for r in rows})
        each = f"{_mean(mins):.1f} {'+'.join(s[0] for s in sources)}" if mins else "— assumed"
        model = rows[0]["assumed_minutes"]
        req = sorted({(r["runtime"], r["mem_mb"]) for r in rows})
        unc = sorted({(r["runtime_uncalibrated"], r["mem_mb_uncalibrated"]) for r in rows})
        text = lambda rs: ", ".join(f"{a} min {b // 1000} GB" for a, b in rs)  # noqa: E731
        lines.append(fmt.format(kind, cls[:39], len(rows), sum(r["source"] == "measured" for r in rows), each,
                                "—" if model is None else f"{model:.1f}", text(req), text(unc)))
    lines.append("min/job: m measured (the job ran), p projected from its class's measured jobs, a assumed (nothing measured)")
    grid = [r for r in projected if r["kind"] != "pilot"]
    left = [r for r in grid if r["source"] != "measured"]
    def total(rows, key, gpu=False) -> str:
        vals = [r[key] * (r["gpu"] if gpu else 1) for r in rows if r[key] is not None]
        return f"{sum(vals) / 60:.2f}" if vals else "—"
    unknown = sum(r["minutes"] is None for r in left)
    lines += ["", f"grid: {len(grid)} jobs, {len(grid) - len(left)} done, {len(left)} to run"
              + (f" ({unknown} with no time: nothing measured of their class and no cost model)" if unknown else ""),
              f"  job-hours to run: {total(left, 'minutes')} calibrated vs {total(left, 'assumed_minutes')} by the cost model",
              f"  GPU-hours to run: {total(left, 'minutes', True)} calibrated; requested {total(left, 'runtime', True)} "
              f"calibrated vs {total(left, 'runtime_uncalibrated', True)} uncalibrated",
              f"  requests: runtime {RUNTIME_MARGIN}x the minutes (10-min steps), memory {MEM_MARGIN}x the measured peak; a job "
              "killed at its time limit is retried with twice its runtime and resumes from its checkpoint"]
    ran = [r for r in projected if r["source"] == "measured"]
    devices = [r for r in ran if r.get("torch_peak_bytes") is not None]
    lines.append("  device memory: " + ("; ".join(f"{r['name']} torch {r['torch_peak_bytes'] / 2**30:.1f} GiB" for r in devices)
                                        if devices else "absent (no job that ran recorded a GPU's)"))
    if written:
        lines.append(f"written: {written} (the rules' requests read it; delete it to go back to the uncalibrated ones)")
    return "\n".join(lines)


def projection_errors(calibrated: dict, measured: list[MeasuredJob]) -> list[dict]:
    """Per job that a calibration projected and has since run: projected and measured minutes, the
    relative error (projected / measured − 1), and for a trained cell how its process started and
    the error on its work, start-up set apart on both sides (`work_error`): a local run's jobs
    fork from the fork server or, before it is up, import for themselves (~16 s, against ~0.8 s), which
    is the executor's doing, not the cost model's; None where either side has no start-up."""
    ran = {f"{'train' if r['kind'] == 'copy' else r['kind']}/{r['name']}": r for r in measured}
    out = []
    for key, job in calibrated["jobs"].items():
        r = ran.get(key)
        if job["source"] == "projected" and r is not None and r["wall_s"]:
            m = r["wall_s"] / 60
            row = {"job": key, "kind": r["kind"], "projected_min": job["minutes"], "measured_min": m,
                   "error": job["minutes"] / m - 1,
                   "process": r.get("process"), "work_error": None}
            if job.get("startup_s") is not None and r.get("startup_s") is not None:
                row["projected_work_min"] = job["minutes"] - job["startup_s"] / 60
                row["measured_work_min"] = m - r["startup_s"] / 60
                row["work_error"] = row["projected_work_min"] / row["measured_work_min"] - 1
            out.append(row)
    return out


def projection_error_totals(errors: list[dict]) -> dict | None:
    """Over the trained cells of `projection_errors`: their count, the total cell-time's error (Σ
    projected / Σ measured − 1) and the largest cell error, on wall time and on work (start-up
    apart, over the cells that recorded it). None where no trained cell is among them."""
    cells = [e for e in errors if e["kind"] == "train"]
    if not cells:
        return None
    worked = [e for e in cells if e["work_error"] is not None]
    out = {"cells": len(cells), "projected_min": sum(e["projected_min"] for e in cells),
           "measured_min": sum(e["measured_min"] for e in cells),
           "worst": max(cells, key=lambda e: abs(e["error"])), "work_cells": len(worked), "work_total": None, "worst_work": None}
    out["total"] = out["projected_min"] / out["measured_min"] - 1
    if worked:
        out["work_total"] = sum(e["projected_work_min"] for e in worked) / sum(e["measured_work_min"] for e in worked) - 1
        out["worst_work"] = max(worked, key=lambda e: abs(e["work_error"]))
    return out
