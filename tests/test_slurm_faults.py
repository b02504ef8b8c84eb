"""Jobs stopped on a real single-node Slurm on localhost (the users' `slurm` profile,
tests/slurm_support.py): cancelled with scancel, requeued, ended at their time limit, killed at each
moment of their cell; what each costs the rerun or retry. pytest-xdist runs this file beside
test_slurm.py on the same cluster: the cells here are `tiny/stale/dlc` and `tiny/bf16/pg` alone."""

import json
import os
import re
import signal
import subprocess

import pytest
import yaml
from slurm_support import cell_jobs, job_counts, run, slurm_cmd, smoke_variant

from conftest import (KILL_TRAIN, ROOT, SMOKE, check_kill_table, kill_in_a_chain, kills_through_slurm, stopped_after,
                      wait_for)
from dlcrepro.core import procs
from dlcrepro.step.checkpoint import verified_step

pytestmark = pytest.mark.slurm


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
