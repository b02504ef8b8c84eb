"""The cluster path end to end: a real single-node Slurm on localhost, driven by the users' `slurm`
profile. The local cluster's differences from a real one (no accounting, so status by squeue; a
short wait before the first status check) go on the command line, never into the profile."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
import yaml

from conftest import (KILL_TRAIN, ROOT, SMOKE, check_kill_table, kill_in_a_chain, kills_through_slurm, stopped_after,
                      wait_for)

from dlcrepro import procs
from dlcrepro.checkpoint import verified_step

pytestmark = pytest.mark.slurm

LOCAL_CLUSTER_ARGS = [
    "--slurm-status-command", "squeue",  # no slurmdbd here: sacct cannot answer
    # the plugin's first status check, and its interval again after a job ends (it grows by 10 s per
    # check that finds none ended): 1 s here, where a job takes seconds; MinJobAge (300 s) stays >= 3x this
    "--slurm-init-seconds-before-status-checks", "1",
]


@pytest.fixture(scope="session")
def slurm_cluster():
    if os.geteuid() != 0:
        pytest.skip("starting slurmctld/slurmd/munged needs root")
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        pytest.skip("Slurm is not installed and there is no apt-get to install it")
    up = subprocess.run(["bash", str(ROOT / "scripts" / "slurm_up.sh")], capture_output=True, text=True, timeout=600)
    assert up.returncode == 0, up.stdout + up.stderr
    started_here = "already running" not in up.stdout  # a developer's own cluster is left running
    try:
        yield
    finally:
        if started_here:
            subprocess.run(["bash", str(ROOT / "scripts" / "slurm_down.sh")], capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def snakemake_slurm():
    """snakemake with the Slurm plugins, from its own env (scripts/setup_workflow_env.sh)."""
    p = subprocess.run(["bash", str(ROOT / "scripts" / "setup_workflow_env.sh")], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    return [str(ROOT / ".venv-workflow" / "bin" / "snakemake")]


def out_config(out):
    # jobs run the package with the interpreter running these tests (the training env)
    return [f"{k}={v}" for k, v in out.items()] + [f"python={sys.executable}"]


@pytest.fixture
def outdirs(tmp_path):
    out = {"results_dir": tmp_path / "results", "figures_dir": tmp_path / "figures",
           "tables_dir": tmp_path / "tables", "artifacts": tmp_path / "artifacts"}
    return out, out_config(out)


@pytest.fixture
def warm_outdirs(tmp_path, smoke_warm_start):
    """`outdirs` whose artifacts are the test run's warm start, found up to date: the tests whose
    subject is a training job do not each wait for a warm-start job (the grid's test runs its own)."""
    out = {"results_dir": tmp_path / "results", "figures_dir": tmp_path / "figures",
           "tables_dir": tmp_path / "tables", "artifacts": smoke_warm_start.artifacts}
    smoke_warm_start.up_to_date_in(out["results_dir"])
    return out, out_config(out), list(smoke_warm_start.SNAKEMAKE_ARGS)


def slurm_cmd(snakemake_slurm, config, *targets, extra=(), configfile=SMOKE):
    return snakemake_slurm + ["--profile", "slurm", *LOCAL_CLUSTER_ARGS, "--nolock", *extra,
                              "--configfile", str(configfile), "--config", *config, "--", *map(str, targets)]


def smoke_variant(tmp_path, **sections):
    """The smoke config with some sections updated, as a file: nested values given with --config
    reach the Slurm jobs' snakemake as text ('12'), so they travel in a config file instead."""
    cfg = yaml.safe_load(SMOKE.read_text())
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    path = tmp_path / "smoke-variant.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run(cmd, timeout=900):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def cell_jobs(cell, *states):
    """The Slurm jobs of this checkout that train `cell` (its work directory and the plugin's comment
    naming the rule and wildcards): another run sharing the cluster keeps its jobs."""
    model, sampler, correction, seed = cell.parts[-4], cell.parts[-3], cell.parts[-2], cell.name.removeprefix("seed")
    comment = f"rule_train_wildcards_{model}_{sampler}_{correction}_{seed}"
    args = ["-t", ",".join(states)] if states else []
    lines = subprocess.run(["squeue", "-h", *args, "-o", "%i|%Z|%k"], capture_output=True, text=True).stdout.splitlines()
    return [i for i, workdir, note in (line.split("|", 2) for line in lines if line.count("|") >= 2)
            if workdir == str(ROOT) and note == comment]


def job_counts(text):
    return {k: int(v) for k, v in re.findall(r"^(\w+)\s+(\d+)$", text, re.M)}


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
    assert counts == {"warmstart": 1, "initial_eval": 1, "rollouts": 1, "train": 4, "collect": 1, "tables": 1, "figures": 1,
                      "all": 1, "total": 11}, p.stdout[-3000:]
    assert len(list(out["results_dir"].glob("tiny/*/*/seed0/summary.json"))) == 4
    assert (out["tables_dir"] / "findings.md").exists() and (out["figures_dir"] / "ess.png").exists()
    log = (out["results_dir"] / "_logs" / "train" / "tiny" / "stale" / "pg" / "seed0.log").read_text()
    assert "SLURM_JOB_ID=" in log  # it really ran as a Slurm job
    # the shared rollouts
    assert "read from" in (out["results_dir"] / "tiny" / "stale" / "pg" / "seed0" / "train.log").read_text()
    for sampler in ("fp8", "stale"):  # ppo is a copy of pg under one update per batch (dlcrepro/grid.py)
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


def test_scancel_mid_run_fails_the_job_and_the_rerun_resumes_from_its_checkpoint(slurm_cluster, snakemake_slurm, warm_outdirs,
                                                                                 tmp_path):
    out, config, shared = warm_outdirs
    cell = out["results_dir"] / "tiny" / "stale" / "dlc" / "seed0"
    target = cell / "summary.json"
    cfg = smoke_variant(tmp_path, train={"steps": 8, "ckpt_every": 2, "eval_every": 4})
    cmd = slurm_cmd(snakemake_slurm, config, target, extra=("--retries", "0", *shared), configfile=cfg)
    with stopped_after(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
                       signal.SIGINT) as proc:
        wait_for("the job's first checkpoint on disk", lambda: verified_step(cell / "checkpoint.pt"), 300, proc)
        train_jobs = cell_jobs(cell)
        assert train_jobs, "no Slurm job to cancel"
        subprocess.run(["scancel", *train_jobs], check=True)
        output, _ = proc.communicate(timeout=600)
    assert proc.returncode != 0, output[-3000:]  # reported failed
    assert "warmstart" not in job_counts(output), output[-3000:]  # the session's warm start is up to date
    assert not target.exists() and (cell / "checkpoint.pt").exists()

    p = run(slurm_cmd(snakemake_slurm, config, target, extra=shared, configfile=cfg))
    assert p.returncode == 0, p.stderr[-4000:]
    log = (cell / "train.log").read_text()
    assert re.search(r"resuming .* from step [1-9]", log), log
    assert target.exists()


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


def test_a_requeued_job_resumes_under_its_job_id_then_killed_at_its_time_limit_is_retried_with_twice_the_time(
        slurm_cluster, snakemake_slurm, warm_outdirs, tmp_path):
    """One snakemake run, one cell asking for 1 minute, and both ways Slurm restarts a job (one cell,
    so the two share their θ_0 evaluation and start-up):

    - `--slurm-requeue` (sbatch --requeue), for preemptible partitions: the job, requeued once its
      first checkpoint is on disk (`scontrol requeue`, what preemption with PreemptMode=REQUEUE does),
      starts again under the same job ID and the cell resumes from its checkpoint; snakemake, still
      watching that ID, neither fails nor resubmits it;
    - then Slurm ends it at its limit (TIMEOUT), snakemake submits it again with twice the runtime
      (job_resource's `attempt`, workflow/rules/common.smk), and the new job resumes from the
      checkpoint the last one left and finishes.

    Each run stops itself at a known moment (procs.pause_point: step 4's sampling, the checkpoint of
    step 2 of that run on disk) and waits there to be requeued or timed out, so no step count races a
    time limit on a machine of unknown speed."""
    out, config, shared = warm_outdirs
    cell = out["results_dir"] / "tiny" / "bf16" / "pg" / "seed0"
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg["train"].update(steps=8, ckpt_every=2, eval_every=4)
    cfg["models"]["tiny"]["resources"] = {"runtime": 1}
    path = tmp_path / "short-limit.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cmd = slurm_cmd(snakemake_slurm, config, cell / "summary.json", extra=("--retries", "1", "--slurm-requeue", *shared),
                    configfile=path)
    pause = tmp_path / "paused"
    # the first run stops after 3 steps (on from 0), the requeued one after 3 more (on from 2); the retry runs through
    env = {**os.environ, procs.PAUSE_ENV: "sample:4,sample:4", procs.PAUSE_FILE_ENV: str(pause)}
    log = cell / "train.log"
    with stopped_after(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env),
                       signal.SIGINT) as proc:
        wait_for("the first run stopped at step 4's sampling", lambda: os.path.exists(procs.pause_file(pause, 0)), 300, proc)
        assert verified_step(cell / "checkpoint.pt") == 2
        running = cell_jobs(cell, "RUNNING")
        assert len(running) == 1, running  # the cell's training job
        first = running[0]
        shown = lambda: subprocess.run(["scontrol", "show", "job", first], capture_output=True, text=True).stdout  # noqa: E731
        assert "Requeue=1" in shown() and "TimeLimit=00:01:00" in shown(), shown()
        subprocess.run(["scontrol", "requeue", first], check=True)
        wait_for("the requeued run stopped at its step 4's sampling", lambda: os.path.exists(procs.pause_file(pause, 1)),
                 300, proc)
        assert log.read_text().count(f"SLURM_JOB_ID={first}") == 2  # requeued: a second run of the same job
        wait_for("the requeued job's end at its time limit", lambda: "JobState=TIMEOUT" in shown(), 300, proc)
        assert verified_step(cell / "checkpoint.pt") == 4, "the killed job left no checkpoint to resume from"
        output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, output[-4000:]
    text = log.read_text()
    jobs = list(dict.fromkeys(re.findall(r"SLURM_JOB_ID=(\d+)", text)))
    assert len(jobs) == 2 and jobs[0] == first, text  # the requeued job, then the retry
    assert [int(s) for s in re.findall(r"resuming .* from step (\d+)", text)] == [2, 4], text
    limits = [re.search(r"TimeLimit=(\S+)",
                        subprocess.run(["scontrol", "show", "job", j], capture_output=True, text=True).stdout) for j in jobs]
    # the retry asks for twice the time (a job Slurm has purged already is not shown)
    want = ["00:01:00", "00:02:00"]
    assert [m.group(1) for m in limits if m] == [w for w, m in zip(want, limits) if m], limits
    assert json.loads((cell / "summary.json").read_text())["steps"] == 8


def test_a_job_killed_at_any_moment_costs_its_retry_at_most_one_checkpoint_interval(slurm_cluster, snakemake_slurm,
                                                                                    warm_outdirs, tmp_path):
    """Kills of conftest.KILLS_SLURM (all of KILLS with DLCREPRO_ALL_KILLS=1) through real Slurm jobs, one
    after another: each killed job fails, snakemake deletes its outputs and submits the retry as a new
    Slurm job with twice the time, which recomputes at most `ckpt_every` finished steps, none after the
    cell's last write; the last ends with the undisturbed run's numbers. Prints docs/faults.md's table."""
    out, config, shared = warm_outdirs
    cell = out["results_dir"] / "tiny" / "bf16" / "pg" / "seed0"
    cfg = smoke_variant(tmp_path, train=KILL_TRAIN)
    kills = kills_through_slurm()
    cmd = slurm_cmd(snakemake_slurm, config, cell / "summary.json", extra=("--retries", str(len(kills)), *shared),
                    configfile=cfg)
    check_kill_table(kill_in_a_chain(cmd, cell, tmp_path, kills=kills))
