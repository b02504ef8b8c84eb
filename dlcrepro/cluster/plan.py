"""The plan, printed before anything runs (`python -m dlcrepro plan`, and the Snakefile): cells
trained and copied, GPU-hours requested and estimated, the largest job, each model's peak memory,
and the weights and data the jobs read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.config import Config
from ..core.registry import correction_info
from .cache import blocking, needs
from .calibrate import (PILOT_DIR, PILOT_STEPS, calibration_path, load_calibration, pilot_cells, pilot_initial_eval_jobs,
                        pilot_rollouts_jobs)
from .cells import finished, grid_cells, initial_eval_jobs, rollouts_jobs
from .costs import (RESPONSE_TOKENS, estimated_minutes, failure_minutes, initial_eval_minutes, rollouts_minutes,
                    shared_sampling_minutes)
from .memory import GPU_GIB, PROMPT_TOKENS, engines_per_job, peak_memory, worst_peak_memory
from .resources import gpu_minutes, job_resources


def memory_line(cfg: Config, model: str, snapshot: Path | None) -> str:
    """The plan's line on a model's peak memory, from the config.json of its checkpoint."""
    arch = json.loads((snapshot / "config.json").read_text()) if snapshot else {}
    mem, worst = peak_memory(cfg, model, arch), worst_peak_memory(cfg, model, arch)
    if mem is None:
        why = "its config.json lacks the shape keys" if snapshot else "no complete checkpoint here to read config.json from"
        return f"  {model}: not estimated ({why})"
    gpu = job_resources(cfg, model)["gpu"] > 0
    n = engines_per_job(cfg)
    share = f"{n} x {cfg.engine.gpu_memory_utilization} of a {GPU_GIB} GiB H200" if gpu else f"{n} on CPU"
    card = f" of the card's {GPU_GIB}" if gpu else ""
    return (
        f"  {model}: {mem.params / 1e9:.2f} B params; trainer {mem.trainer:.1f} GiB (weights {mem.weights:.1f}, "
        f"flat gradients {mem.gradients:.1f}, activations {mem.activations:.1f}, logits {mem.logits:.1f}) "
        f"+ engines {mem.engines:.1f} GiB ({share}) = {mem.total:.1f} GiB; at worst {worst.total:.1f} GiB{card} "
        f"({worst.rows} responses of {worst.response_tokens} tokens per micro-batch, engine.max_tokens={cfg.engine.max_tokens})"
    )


# The users' Slurm profile (the repository's slurm/config.yaml): its `retries` is how often snakemake
# submits a failed job again, each time with twice the runtime (resources.job_resources' `attempt`).
SLURM_PROFILE = Path(__file__).resolve().parents[2] / "slurm" / "config.yaml"


def profile_retries(path: Path = SLURM_PROFILE) -> int | None:
    """A Snakemake profile's `retries` (0 where it sets none; None: no profile file there)."""
    import yaml

    if not Path(path).is_file():
        return None
    return int((yaml.safe_load(Path(path).read_text()) or {}).get("retries", 0))


def failure_lines(cfg: Config, cells, retries: int | None, profile: str) -> list[str]:
    """The plan's lines on what a failed training job can cost (costs.failure_minutes), per model: one
    failure, a job that uses every retry of the profile, and the grid if every trained job did."""
    if not any(job_resources(cfg, m)["gpu"] for m in cfg.grid.models):
        return []  # a CPU study: nothing billed by the GPU-hour
    n = 1 if retries is None else retries
    head = f"{profile}: {retries} retries, each with twice the runtime" if retries is not None else f"no {profile}: 1 retry"
    lines = ["", f"what a failure costs ({head}): a training job stopped by a node failure, a preemption or its time limit "
                 "resumes from its last checkpoint, losing at most one checkpoint interval and the engines' start; one "
                 "stopped after its last write loses no step (docs/faults.md)"]
    total = 0.0
    for m in dict.fromkeys(cfg.grid.models):
        t, gpu = cfg.train_for(m), job_resources(cfg, m)["gpu"]
        trained = [c for c in cells if c.model == m and c.same_as is None]
        each = [gpu * (failure_minutes(cfg, m, c.correction) or 0) for c in trained]
        interval = f"a checkpoint every {t.ckpt_every} of {t.steps} steps" if t.ckpt_every else f"no checkpoint in {t.steps}"
        if not trained or gpu == 0 or failure_minutes(cfg, m) is None:
            lines.append(f"  {m} ({interval}): — (" + ("no GPU" if gpu == 0 else "not in the cost model") + ")")
            continue
        total += n * sum(each) / 60
        span = f"{min(each):.1f}" if round(min(each), 1) == round(max(each), 1) else f"{min(each):.1f}-{max(each):.1f}"
        lines.append(f"  {m} ({interval}): ≤ {span} GPU-min a failure, ≤ {n * max(each):.1f} a job failing {n} times; "
                     f"≤ {n * sum(each) / 60:.1f} GPU-h if every trained job did")
    trained = sum(c.same_as is None for c in cells)
    lines.append(f"  grid: ≤ {total:.1f} GPU-h if every trained job failed {n} times, beside the {trained} jobs' estimate")
    return lines


def _hours(minutes: float) -> str:
    return f"{minutes / 60:.1f}"


def plan_text(cfg: Config, source: str = "") -> str:
    """The plan: cells trained vs copied, GPU-hours requested (Σ runtime × GPUs) and estimated by
    the cost model per model, the largest single job, and the weights and data the jobs read."""
    from ..core.paths import hf_hub_cache

    cells = grid_cells(cfg)
    g = cfg.grid
    cal = load_calibration(cfg, cfg.results_dir)  # the requests of `plan --calibrate`, where it ran
    lines = [
        f"dlcrepro plan: {cfg.name}" + (f" ({source})" if source else ""),
        f"grid: {len(g.models)} models x {len(g.samplers)} samplers x {len(g.corrections)} corrections x {len(g.seeds)} seeds"
        f" = {len(cells)} cells: {sum(c.same_as is None for c in cells)} trained, "
        f"{sum(c.same_as is not None for c in cells)} copied"
        " (a copy waits for the cell it equals and asks for no GPU)",
    ]
    warm = [m for m in dict.fromkeys(g.models) if cfg.models[m].kind == "tiny"]
    if warm:
        lines.append(f"warm start: {len(warm)} CPU job(s) first ({', '.join(warm)})")
    shared = rollouts_jobs(cfg)
    if shared:
        lines.append(f"shared rollouts: {len(shared)} job(s) first, one per lagged sampler and seed: the batches its cells "
                     "sample from θ_0, sampled once (dlcrepro/study/rollouts.py); counted in the GPU-hours below")
    initial = initial_eval_jobs(cfg)
    if initial:
        lines.append(f"θ_0 evaluations: {len(initial)} job(s) first, one per model and seed: θ_0's accuracies, where every "
                     "cell's curve starts, evaluated once (dlcrepro/study/initial_eval.py); counted in the GPU-hours below")
    pilot = pilot_cells(cfg)
    lines.append(f"pilot (target `pilot`, then `python -m dlcrepro plan --calibrate {cfg.results_dir}`): {len(pilot)} cell(s) "
                 f"cut to {PILOT_STEPS} steps, one per cost class, under {Path(cfg.results_dir) / PILOT_DIR}, with "
                 f"{len(pilot_initial_eval_jobs(cfg))} θ_0 evaluation(s) and {len(pilot_rollouts_jobs(cfg))} rollouts job(s) "
                 "of the grid's own")
    def row(*cols) -> str:
        return "{:<12}{:>6}{:>9}{:>8}{:>6}  {:<22}{:>16}  {}".format(*cols)

    lines += ["", row("model", "cells", "trained", "copied", "done", "each trained job", "GPU-h requested", "GPU-h estimated")]
    total_req, total_est, largest = 0.0, 0.0, None
    for m in dict.fromkeys(g.models):
        mine = [c for c in cells if c.model == m]
        trained = [c for c in mine if c.same_as is None]
        done = sum(finished(cfg, c) for c in mine)
        r = job_resources(cfg, m)
        each = [job_resources(cfg, m, "train", c.sampler, cal, c.name) for c in trained]
        requested = sum(gpu_minutes(job_resources(cfg, m, "train" if c.same_as is None else "copy", c.sampler, cal,
                                                  c.name)) for c in mine)
        ests = [estimated_minutes(cfg, m, c.correction) for c in trained]  # a cell of several SGD steps a batch costs more
        est_gpu = None if not ests or ests[0] is None else r["gpu"] * sum(ests)
        for _, sampler, seed in (j for j in shared if j[0] == m):  # each rollouts job, and the cells that read it
            requested += gpu_minutes(job_resources(cfg, m, "rollouts", sampler, cal, f"{m}/{sampler}/seed{seed}"))
            if est_gpu is not None:
                readers = [c for c in trained
                           if c.sampler == sampler and c.seed == seed and not correction_info(c.correction).resync]
                # a resync correction reads the file only until its first resync: counted as sampling it all
                est_gpu += r["gpu"] * (rollouts_minutes(cfg, m, sampler)
                                       - len(readers) * shared_sampling_minutes(cfg, m, sampler))
        for _, seed in (j for j in initial if j[0] == m):  # each θ_0 evaluation job
            requested += gpu_minutes(job_resources(cfg, m, "initial_eval", None, cal, f"{m}/seed{seed}"))
            if est_gpu is not None:
                est_gpu += r["gpu"] * initial_eval_minutes(cfg, m)
        runtimes = sorted({e["runtime"] for e in each}) or [r["runtime"]]
        mems = sorted({e["mem_mb"] for e in each}) or [r["mem_mb"]]
        span = lambda xs: f"{xs[0]}" if len(xs) == 1 else f"{xs[0]}-{xs[-1]}"  # noqa: E731
        per_job = f"{r['gpu']} GPU, {span(runtimes)} min, {span([x // 1000 for x in mems])} GB"
        est_text = "—" if est_gpu is None else f"{_hours(est_gpu)} ({span(sorted({round(x) for x in ests}))} min/job)"
        lines.append(row(m, len(mine), len(trained), len(mine) - len(trained), done, per_job, _hours(requested), est_text))
        total_req += requested
        total_est += est_gpu or 0
        for c, e in zip(trained, each):
            key = (gpu_minutes(e), e["runtime"], e["mem_mb"])
            if largest is None or key > largest[0]:
                largest = (key, c, e, sum(x == e for x in each))
    n_trained = sum(c.same_as is None for c in cells)
    lines.append(row("total", len(cells), n_trained, len(cells) - n_trained, "", "", _hours(total_req), _hours(total_est)))
    lines.append("GPU-h requested: Σ runtime × GPUs of the Slurm requests; estimated: the H200 cost model of docs/cluster.md (— "
                 "where a model is not in it)")
    where = calibration_path(cfg, cfg.results_dir)
    lines.append(f"requests calibrated: {len(cal['jobs'])} jobs' runtime and memory from {where} (python -m dlcrepro plan "
                 "--calibrate)"
                 if cal else f"requests uncalibrated (no {where}: run the pilot, then python -m dlcrepro plan --calibrate "
                             f"{cfg.results_dir})")
    if largest:
        _, cell, r, n = largest
        lines.append(
            f"largest single job: train {cell.name} (and {n - 1} like it): {r['gpu']} GPU, {r['runtime']} min, "
            f"{r['mem_mb']} MB, {r['cpus_per_task']} CPUs"
        )
    lines += failure_lines(cfg, cells, profile_retries(), str(Path("slurm") / "config.yaml"))
    found = needs(cfg)
    checkpoints = {n.readers[0]: n.found for n in found if n.key.startswith("models.") and not n.problem}
    hf = [m for m in dict.fromkeys(g.models) if cfg.models[m].kind == "hf"]
    if hf:
        lines += ["", f"peak memory of a job (cluster.peak_memory: measured per micro-batch, docs/cluster.md; "
                      f"{PROMPT_TOKENS}-token prompts, {RESPONSE_TOKENS}-token responses):"]
        lines += [memory_line(cfg, m, checkpoints.get(m)) for m in hf]
    lines += ["", f"weights and data (Hugging Face cache {hf_hub_cache()}):"]
    for m in warm:
        lines.append(f"  models.{m}: built here by the warm start ({Path(cfg.artifacts) / m / 'model'})")
    if cfg.task.source != "parquet":
        lines.append("  task: generated here (task.source: generate)")
    needed = blocking(cfg, found)
    for n in found:
        if n.built_here and n.found is None:
            lines.append(f"  {n.key}={n.value}: built here first (rule rehearsal_assets: python -m dlcrepro rehearsal)")
        elif not n.problem:
            lines.append(f"  {n.key}={n.value}: ok ({n.found})")
        else:
            unused = "" if n in needed else " (no cell left to run reads it: its cells are finished)"
            lines.append(f"  {n.key}={n.value}: MISSING{unused}: {n.problem}" + (f"; fix: {n.fix}" if n.fix else ""))
    return "\n".join(lines)


def load_merged(paths: list[str], overrides: dict[str, Any] | None = None) -> Config:
    """Config files merged in order as Snakemake merges `--configfile`s (nested keys updated; a
    file with a `base` key laid over its base first), then dotted overrides; built (ranges
    checked) without importing torch."""
    from ..core.config import build, read_layers

    return build(read_layers(paths, overrides))
