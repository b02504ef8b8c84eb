"""The cluster path end to end on a real single-node Slurm on localhost, driven by the users' `slurm`
profile (tests/slurm_support.py): the smoke grid with every kind of job, a GPU request, a rehearsal
cell of the paper config. What a stopped, requeued, timed-out or killed job costs:
test_slurm_faults.py, which pytest-xdist runs beside this file on the same cluster."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from slurm_support import job_counts, run, slurm_cmd, smoke_variant

from conftest import ROOT

pytestmark = pytest.mark.slurm


# The smallest grid with every kind of job the tiny study submits: a synced and a lagged sampler, a
# trained cell and its copy in each, a lagged cell reading its sampler's shared rollouts, θ_0's
# evaluation, the warm start, and the tables and figures over them (the full smoke grid, 28 cells:
# tests/test_workflow.py, locally).
SLURM_GRID = {"samplers": ["fp8", "stale"], "corrections": ["pg", "ppo"]}


def test_smoke_grid_through_slurm_then_a_deleted_cell_reruns_with_its_copy_only(slurm_cluster, snakemake_slurm, outdirs,
                                                                                tmp_path):
    out, config = outdirs
    cfg = smoke_variant(tmp_path, grid=SLURM_GRID)
    variant = yaml.safe_load(cfg.read_text())
    # a 60-step warm start (the fault tests' study's), not 250: its job is the subject here, as a 2-CPU
    # Slurm job, not the model it makes (the session's 250-step one: conftest.smoke_warm_start)
    variant["models"]["tiny"]["warmstart"]["steps"] = 60
    cfg.write_text(yaml.safe_dump(variant))
    p = run(slurm_cmd(snakemake_slurm, config, configfile=cfg))
    assert p.returncode == 0, p.stderr[-4000:]
    counts = job_counts(p.stdout + p.stderr)
    # `reproduce`: every run ends by comparing itself with the committed study (here: none named, said so)
    assert counts == {"warmstart": 1, "initial_eval": 1, "rollouts": 1, "train": 4, "collect": 1, "tables": 1, "figures": 1,
                      "reproduce": 1, "all": 1, "total": 12}, p.stdout[-3000:]
    assert len(list(out["results_dir"].glob("tiny/*/*/seed0/summary.json"))) == 4
    assert (out["tables_dir"] / "findings.md").exists() and (out["figures_dir"] / "ess.png").exists()
    log = (out["results_dir"] / "_logs" / "train" / "tiny" / "stale" / "pg" / "seed0.log").read_text()
    assert "SLURM_JOB_ID=" in log  # it really ran as a Slurm job
    # the shared rollouts
    assert "read from" in (out["results_dir"] / "tiny" / "stale" / "pg" / "seed0" / "train.log").read_text()
    for sampler in ("fp8", "stale"):  # ppo is a copy of pg under one update per batch (dlcrepro/core/grid.py)
        copy = json.loads((out["results_dir"] / "tiny" / sampler / "ppo" / "seed0" / "summary.json").read_text())
        assert copy["computed_as"] == str(out["results_dir"] / "tiny" / sampler / "pg" / "seed0")

    # the deleted cell trains again, its copy follows; nothing else reruns
    shutil.rmtree(out["results_dir"] / "tiny" / "fp8" / "pg" / "seed0")
    p = run(slurm_cmd(snakemake_slurm, config, configfile=cfg))
    assert p.returncode == 0, p.stderr[-4000:]
    counts = job_counts(p.stdout + p.stderr)
    assert counts.get("train") == 2 and "warmstart" not in counts, p.stderr[-3000:]
    src = out["results_dir"] / "tiny" / "fp8" / "pg" / "seed0"
    copy = json.loads((out["results_dir"] / "tiny" / "fp8" / "ppo" / "seed0" / "summary.json").read_text())
    assert (src / "summary.json").exists() and copy["computed_as"] == str(src)


def test_gpu_marked_job_receives_its_gpu_and_refuses_to_train_on_a_cpu_torch(slurm_cluster, snakemake_slurm, warm_outdirs,
                                                                             tmp_path):
    """`gpu: 1` reaches the cell's first job, its seed's θ_0 evaluation, as --gres=gpu:1
    (CUDA_VISIBLE_DEVICES: one of the local cluster's fake GPUs), and the job, whose torch is the
    CPU build, stops before anything loads, naming its environment (dlcrepro/cluster/device.py,
    check_device); the cell is never trained."""
    out, config, shared = warm_outdirs
    cell = out["results_dir"] / "tiny" / "bf16" / "pg" / "seed0"
    cfg = smoke_variant(tmp_path, resources={"gpu": 1})
    # --retries 0: the profile's one retry would submit the same refusal again (~20 s here)
    p = run(slurm_cmd(snakemake_slurm, config, cell / "summary.json", extra=("--retries", "0", *shared), configfile=cfg))
    assert p.returncode != 0, p.stderr[-4000:]
    assert "warmstart" not in job_counts(p.stdout + p.stderr), p.stdout[-3000:]  # the session's warm start is up to date
    log = (out["results_dir"] / "_logs" / "initial_eval" / "tiny" / "seed0.log").read_text()
    assert re.search(r"CUDA_VISIBLE_DEVICES=\d", log) and "SLURM_JOB_ID=" in log, log
    assert "resources.gpu=1 asks for a GPU, but this torch is a CPU-only build" in log and sys.executable in log, log
    assert not (cell / "train.log").exists()  # nothing was trained


def test_a_rehearsal_cell_of_the_paper_config_runs_as_a_slurm_job(slurm_cluster, snakemake_slurm, outdirs, tmp_path,
                                                                  rehearsal_cache):
    """configs/rehearsal.yaml (the paper's config on a Qwen3 checkpoint made here, found by id in the
    Hugging Face cache) through `--profile slurm`: stale/dlc, cut to 2 steps, as real Slurm jobs (its
    seed's θ_0 evaluation, its sampler's shared rollouts, the cell: the engine's top-k, a lagged
    sampler). The checkpoint and data are in the cache already, so the rule that builds them does not
    run. (The fp8 engine on this checkpoint: tests/test_rehearsal.py; an fp8 cell as a Slurm job: the
    smoke grid above.)"""
    out, config = outdirs
    cfg = yaml.safe_load((ROOT / "configs" / "rehearsal.yaml").read_text())
    cfg["train"].update(steps=2, eval_every=2, ckpt_every=0)
    cfg["task"]["n_test"] = 8
    path = tmp_path / "rehearsal-variant.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cell = out["results_dir"] / "qwen3-rehearsal" / "stale" / "dlc" / "seed0"
    env = {**os.environ, "HF_HUB_CACHE": str(rehearsal_cache)}
    p = subprocess.run(slurm_cmd(snakemake_slurm, config, cell / "summary.json", configfile=path),
                       cwd=ROOT, capture_output=True, text=True, timeout=1800, env=env)
    assert p.returncode == 0, p.stderr[-4000:]
    counts = job_counts(p.stdout + p.stderr)
    assert counts.get("train") == 1 and counts.get("rollouts") == 1 and counts.get("initial_eval") == 1, p.stderr[-3000:]
    assert "rehearsal_assets" not in counts, p.stderr[-3000:]
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["model_dir"].startswith(str(rehearsal_cache)), summary
    assert summary["process"] == "own process"  # a Slurm job never hands its work to a fork server
    log = (out["results_dir"] / "_logs" / "train" / "qwen3-rehearsal" / "stale" / "dlc" / "seed0.log").read_text()
    assert "SLURM_JOB_ID=" in log, log
    assert "read from" in (cell / "train.log").read_text()  # the lagged cell's first steps: the rollouts job's file
