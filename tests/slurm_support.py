"""What the real-Slurm tests (test_slurm.py, test_slurm_faults.py) share: the command line that
drives the users' `slurm` profile on the local test cluster, and how a test finds its own jobs there.
The cluster and the workflow env are fixtures in conftest.py. The local cluster's differences from a
real one (no accounting, so status by squeue; a short wait before the first status check) go on the
command line, never into the profile."""

import re
import subprocess

import yaml

from conftest import ROOT, SMOKE

LOCAL_CLUSTER_ARGS = [
    "--slurm-status-command", "squeue",  # no slurmdbd here: sacct cannot answer
    # the plugin's first status check, and its interval again after a job ends (it grows by 10 s per
    # check that finds none ended): 1 s here, where a job takes seconds; MinJobAge (300 s) stays >= 3x this
    "--slurm-init-seconds-before-status-checks", "1",
]


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
    naming the rule and wildcards): another run sharing the cluster keeps its jobs. The two Slurm test
    files run at once under pytest-xdist, so no cell that one of them looks up this way is trained by
    the other (test_slurm_faults.py's cells are `tiny/stale/dlc` and `tiny/bf16/pg`, test_slurm.py
    trains neither)."""
    model, sampler, correction, seed = cell.parts[-4], cell.parts[-3], cell.parts[-2], cell.name.removeprefix("seed")
    comment = f"rule_train_wildcards_{model}_{sampler}_{correction}_{seed}"
    args = ["-t", ",".join(states)] if states else []
    lines = subprocess.run(["squeue", "-h", *args, "-o", "%i|%Z|%k"], capture_output=True, text=True).stdout.splitlines()
    return [i for i, workdir, note in (line.split("|", 2) for line in lines if line.count("|") >= 2)
            if workdir == str(ROOT) and note == comment]


def job_counts(text):
    return {k: int(v) for k, v in re.findall(r"^(\w+)\s+(\d+)$", text, re.M)}
