"""Faults a long study meets (docs/faults.md), each injected into a real run of a two-cell smoke
study: nothing is left running, nothing half-done is taken as done, the rerun resumes and ends with
exactly the cells of an undisturbed run (every non-timing column), and where a person must act the
message says what to do."""

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import (KILL_TRAIN, KILLS, ROOT, SMOKE, check_kill_table, kill_in_a_chain, stopped_after,
                      wait_for)

from dlcrepro.core import procs
from dlcrepro.step.checkpoint import sidecar, verified_step

pytestmark = pytest.mark.slow

CELLS = [("stale", "pg"), ("stale", "is")]  # two cells, neither a copy of the other; a lagged sampler
TARGETS = [f"results/tiny/{s}/{c}/seed0/summary.json" for s, c in CELLS]
AGGREGATE = "results/_aggregate/steps.parquet"
# jobs run in the study's directory, not the checkout: they import this checkout's package
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def cell(d: Path, sampler: str, correction: str) -> Path:
    return d / "results" / "tiny" / sampler / correction / "seed0"


def snakemake(d: Path, *args) -> list[str]:
    """The study's snakemake, as a user runs it from the study's directory (locks on: no --nolock)."""
    return [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(d),
            "--configfile", str(d / "study.yaml"), "--cores", "1", *args]


def run(cmd, **kw):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800, env=ENV, **kw)


STARTED: list[subprocess.Popen] = []


def start(cmd, out: Path, track: bool = True, **kw) -> subprocess.Popen:
    """Start `cmd` with its output into the file `out` (a pipe left unread would stall it); stopped
    at the test's end if it still runs then (`track`)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=open(out, "w"), stderr=subprocess.STDOUT, text=True, env=ENV, **kw)
    if track:
        STARTED.append(proc)
    return proc


@pytest.fixture(autouse=True)
def nothing_left_running():
    """A failed test leaves nothing running: what it started and did not end gets SIGTERM (a
    snakemake then stops its jobs and its fork server), then SIGKILL."""
    yield
    while STARTED:
        with stopped_after(STARTED.pop()):
            pass


def metrics(d: Path) -> dict:
    return {(s, c): pd.read_parquet(cell(d, s, c) / "metrics.parquet") for s, c in CELLS}


def assert_same_cells(got: dict, reference: dict) -> None:
    for key, ref in reference.items():
        cols = [c for c in ref.columns if not c.startswith("sec_")]
        pd.testing.assert_frame_equal(got[key][cols], ref[cols], obj=f"cell {key}")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """(a study's directory, its cells' metrics): the smoke config cut to a warm start of 60 steps
    and two cells of 6 steps with a checkpoint every 2, run once undisturbed through snakemake (the
    fork server on) to the collected steps. The metrics are what every rerun must give."""
    d = tmp_path_factory.mktemp("study")
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg.update(results_dir="results", figures_dir="figures", tables_dir="tables", artifacts="artifacts", python=sys.executable)
    cfg["models"]["tiny"]["warmstart"]["steps"] = 60
    cfg["train"].update(steps=6, ckpt_every=2, eval_every=3)
    cfg["grid"].update(samplers=sorted({s for s, _ in CELLS}), corrections=[c for _, c in CELLS])
    (d / "study.yaml").write_text(yaml.safe_dump(cfg))
    p = run(snakemake(d, *TARGETS, AGGREGATE))
    assert p.returncode == 0, p.stderr[-4000:]
    return d, metrics(d)


def fresh(study, to: Path) -> Path:
    """A copy of the study with none of its results. Its run starts with the warm start, in a process
    of its own while the fork server imports: every cell then trains in a child of the server."""
    shutil.copytree(study[0], to, symlinks=True)
    for sub in ("artifacts", "results/tiny", "results/_logs", "results/_aggregate", ".snakemake/incomplete"):
        shutil.rmtree(to / sub, ignore_errors=True)
    return to


def forked_cell_with_checkpoint(d: Path) -> Path | None:
    """A cell being trained in a child of the fork server (its job did not fall back to its own
    process) with a whole checkpoint on disk."""
    for s, c in CELLS:
        job_log = d / "results" / "_logs" / "train" / "tiny" / s / c / "seed0.log"
        if (job_log.exists() and "running in this process" not in job_log.read_text()
                and verified_step(cell(d, s, c) / "checkpoint.pt")):
            return cell(d, s, c)
    return None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_signal_to_snakemake_stops_every_job_and_the_fork_server_and_the_rerun_resumes(study, tmp_path, sig):
    d = fresh(study, tmp_path / "study")
    proc = start(snakemake(d, *TARGETS), tmp_path / "run.out")
    interrupted = wait_for("a cell training in the fork server's child, with a checkpoint",
                           lambda: forked_cell_with_checkpoint(d), 90, proc)
    reached = verified_step(interrupted / "checkpoint.pt")
    tree = procs.descendants(proc.pid)  # the jobs, their processes, the fork server and the jobs it forked
    assert any(b"serve" in Path(f"/proc/{p}/cmdline").read_bytes() for p in tree if procs.alive(p)), "no fork server running"

    proc.send_signal(sig)
    t0 = time.monotonic()
    wait_for("every job and the fork server gone", lambda: not any(procs.alive(p) for p in tree), 10)
    print(f"{sig.name}: {len(tree)} processes gone {time.monotonic() - t0:.1f} s after the signal")
    proc.wait(timeout=60)
    out = (tmp_path / "run.out").read_text()
    assert proc.returncode != 0, out[-3000:]
    assert f"snakemake got {sig.name}" in out and f"Stopped on {sig.name}" in out and "rerun the same command" in out, out[-3000:]
    assert not list((d / ".snakemake" / "locks").glob("*")), "the lock is left behind"
    assert not (interrupted / "summary.json").exists() and not (interrupted / "metrics.parquet").exists()
    if sig == signal.SIGTERM:  # what the rerun finds does not depend on the signal: one rerun, SIGTERM's
        p = run(snakemake(d, *TARGETS))
        assert p.returncode == 0, p.stderr[-4000:]
        resumed = re.search(r"resuming .* from step (\d+)", (interrupted / "train.log").read_text())
        assert resumed and int(resumed.group(1)) >= reached, (interrupted / "train.log").read_text()
        assert_same_cells(metrics(d), study[1])


# ----------------------------------------------------------------------------- checkpoints and tables


@pytest.fixture(scope="module")
def server(study):
    """A fork server for the cells these tests run alone (seconds each instead of imports each)."""
    from dlcrepro.run.server import private_dir

    path = str(private_dir() / f"faults-{os.getpid()}.sock")
    log = study[0] / "faults-server.log"
    proc = start([sys.executable, "-m", "dlcrepro", "serve", "--socket", path, "--watch-pid", str(os.getpid())], log, track=False)
    wait_for("the fork server's socket", lambda: os.path.exists(path), 60, proc)
    yield path
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


def train_cmd(study, out: Path, *args, server: str | None = None) -> list[str]:
    """`python -m dlcrepro train` of the study's first cell into `out` (what its snakemake job runs)."""
    d = study[0]
    s, c = CELLS[0]
    cmd = [sys.executable, "-m", "dlcrepro", "train", "--config", str(d / "study.yaml"), "--model-dir",
           str(d / "artifacts" / "tiny" / "model"),
           "--sampler", s, "--correction", c, "--seed", "0", "--out", str(out), *args]
    return cmd + (["--server", server] if server else [])


def plant(src: Path, out: Path) -> Path:
    """Copy the checkpoint in `src` (with its sidecar) into a new cell directory `out`; its path there."""
    out.mkdir(parents=True)
    for f in (src / "checkpoint.pt", sidecar(src / "checkpoint.pt")):
        shutil.copy(f, out / f.name)
    return out / "checkpoint.pt"


def test_a_truncated_checkpoint_is_set_aside_and_the_cell_starts_again(study, server, tmp_path):
    kept = tmp_path / "kept"
    p = run(train_cmd(study, kept, "--keep-checkpoint", server=server))
    assert p.returncode == 0, p.stderr[-3000:]
    ckpt = plant(kept, tmp_path / "cell")
    size = ckpt.stat().st_size
    cut = random.Random(27).randrange(1, size)
    with open(ckpt, "r+b") as f:
        f.truncate(cut)

    p = run(train_cmd(study, ckpt.parent, server=server))
    assert p.returncode == 0, p.stderr[-3000:]
    log = (ckpt.parent / "train.log").read_text()
    assert f"is damaged (truncated: {cut:,} bytes" in log and f"records step 6: {size:,} bytes" in log, log
    assert f"set aside as {ckpt}.damaged" in log and "starting" in log and "again from step 0" in log, log
    assert (ckpt.parent / "checkpoint.pt.damaged").stat().st_size == cut and not ckpt.exists()
    got = pd.read_parquet(ckpt.parent / "metrics.parquet")
    assert_same_cells({CELLS[0]: got}, {CELLS[0]: study[1][CELLS[0]]})


def test_a_checkpoint_of_another_config_is_set_aside_naming_the_difference(study, server, tmp_path):
    other = tmp_path / "other"
    p = run(train_cmd(study, other, "--set", "train.lr=0.15", "--set", "train.steps=2", "--keep-checkpoint", server=server))
    assert p.returncode == 0, p.stderr[-3000:]
    ckpt = plant(other, tmp_path / "cell")

    p = run(train_cmd(study, ckpt.parent, server=server))
    assert p.returncode == 0, p.stderr[-3000:]
    log = (ckpt.parent / "train.log").read_text()
    assert "is of another run (config.train.lr: 0.15 there, 0.3 here; config.train.steps: 2 there, 6 here)" in log, log
    assert f"set aside as {ckpt}.other-run" in log and "again from step 0" in log, log
    assert (ckpt.parent / "checkpoint.pt.other-run").exists() and not ckpt.exists()
    got = pd.read_parquet(ckpt.parent / "metrics.parquet")
    assert_same_cells({CELLS[0]: got}, {CELLS[0]: study[1][CELLS[0]]})


def test_a_truncated_metrics_table_stops_collect_naming_the_cell_and_the_line_that_reruns_it(study, tmp_path):
    d = tmp_path / "study"
    shutil.copytree(study[0], d, symlinks=True)
    damaged = cell(d, *CELLS[0])
    table = damaged / "metrics.parquet"
    with open(table, "r+b") as f:
        f.truncate(random.Random(27).randrange(1, table.stat().st_size))

    p = run(snakemake(d, AGGREGATE))
    assert p.returncode != 0
    log = (d / "results" / "_logs" / "collect.log").read_text()
    rel = damaged.relative_to(d)
    assert "collect: 1 finished cell(s) with a damaged file; nothing was collected" in log, log
    assert f"  {rel}: metrics.parquet is " in log, log
    line = next(x for x in log.splitlines() if x.startswith("Rerun them: "))[len("Rerun them: "):]
    assert line.startswith(f"rm -r {rel} && ") and "snakemake" in line, line
    assert not (d / AGGREGATE).exists()

    p = subprocess.run(line, shell=True, cwd=d, capture_output=True, text=True, timeout=1800, env=ENV)
    assert p.returncode == 0, p.stderr[-4000:]
    assert (d / AGGREGATE).exists()
    assert_same_cells(metrics(d), study[1])


# ----------------------------------------------------------------------------- a full disk


class SmallDisk:
    """A small file system for one cell: a tmpfs mount where mounting is allowed (root), else this
    process's children get a file size limit (RLIMIT_FSIZE, `ulimit -f`) below a checkpoint's size."""

    def __init__(self, where: Path, mb: int):
        self.path = where
        where.mkdir()
        self.mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m", "tmpfs", str(where)],
                                      capture_output=True).returncode == 0 if os.geteuid() == 0 else False

    def fill(self) -> None:
        """Take every byte left (tmpfs), as another program on the machine would."""
        with open(self.path / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
            except OSError:
                pass

    def free(self) -> None:
        (self.path / "filler").unlink(missing_ok=True)

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


def limit_file_size(nbytes: int):
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))


def test_a_full_disk_fails_the_job_naming_the_disk_and_after_space_is_freed_the_rerun_completes(study, server, tmp_path):
    disk = SmallDisk(tmp_path / "disk", 32)
    try:
        out = disk.path / "cell"
        if disk.mounted:  # the disk fills after the first checkpoint: the second one cannot be written
            proc = start(train_cmd(study, out, server=server), tmp_path / "run.out")
            wait_for("the first checkpoint", lambda: verified_step(out / "checkpoint.pt"), 60, proc)
            disk.fill()
            proc.wait(timeout=600)
            said = (tmp_path / "run.out").read_text()
            assert f"no space left on device writing {out}/" in said, said[-3000:]
            assert f"on the file system at {disk.path} (" in said, said[-3000:]
            assert f"free space on {disk.path} and rerun the same command" in said
        else:  # a file size limit below a checkpoint's size: the first checkpoint cannot be written
            proc = start(train_cmd(study, out), tmp_path / "run.out", preexec_fn=limit_file_size(1 << 20))
            proc.wait(timeout=600)
            said = (tmp_path / "run.out").read_text()
            assert f"file too large writing {out}/" in said and "ulimit -f" in said, said[-3000:]
        assert proc.returncode == 2, said[-3000:]
        assert not list(out.glob(".*.tmp")) and not (out / "summary.json").exists()  # nothing half-written kept
        assert not (out / "checkpoint.pt").exists() or verified_step(out / "checkpoint.pt")

        disk.free()
        p = run(train_cmd(study, out, server=server))
        assert p.returncode == 0, p.stderr[-3000:]
        got = pd.read_parquet(out / "metrics.parquet")
        assert_same_cells({CELLS[0]: got}, {CELLS[0]: study[1][CELLS[0]]})
    finally:
        disk.close()


# ----------------------------------------------------------------------------- two runs at once


def test_two_studies_at_once_finish_each_through_its_own_fork_server_and_a_second_run_in_one_stops_on_its_lock(study, tmp_path):
    a, b = fresh(study, tmp_path / "a"), fresh(study, tmp_path / "b")
    one = TARGETS[:1]  # a cell each: the two studies share the machine's cores
    pa = start(snakemake(a, *one), tmp_path / "a.out")
    pb = start(snakemake(b, *one), tmp_path / "b.out")
    wait_for("study a's lock", lambda: list((a / ".snakemake" / "locks").glob("*")), 60, pa)
    second = run(snakemake(a, *one))
    assert second.returncode != 0 and "Directory cannot be locked" in second.stdout + second.stderr, second.stderr[-3000:]

    for proc, d in ((pa, a), (pb, b)):
        proc.wait(timeout=1800)
        assert proc.returncode == 0, (tmp_path / f"{d.name}.out").read_text()[-4000:]
        log = (d / "results" / "_logs" / "fork_server.log").read_text()
        own = f"snakemake-{proc.pid}.sock"
        assert own in log, log  # each study started its own server
        # its job went to its own study's server; or, where that server was still importing when the
        # job started (67 s once at load 10), ran in its own process saying so, never to the other's
        job_log = (d / "results" / "_logs" / "train" / "tiny" / CELLS[0][0] / CELLS[0][1] / "seed0.log").read_text()
        assert re.search(r"job \d+ in pid", log) or "no training server at" in job_log and own in job_log, (log, job_log)
        got = pd.read_parquet(cell(d, *CELLS[0]) / "metrics.parquet")
        assert_same_cells({CELLS[0]: got}, {CELLS[0]: study[1][CELLS[0]]})


def test_a_local_job_killed_at_any_moment_costs_its_retry_at_most_one_checkpoint_interval(smoke_warm_start, tmp_path):
    """The kills of conftest.KILLS through the local executor, one after another, each attempt in a
    process of its own (no fork server) and the next one snakemake's retry: each retry recomputes at
    most `ckpt_every` finished steps, none after the cell's last write (test_slurm_faults.py runs the same
    through Slurm jobs)."""
    out = {"results_dir": tmp_path / "results", "figures_dir": tmp_path / "figures", "tables_dir": tmp_path / "tables",
           "artifacts": smoke_warm_start.artifacts}
    smoke_warm_start.up_to_date_in(out["results_dir"])
    variant = yaml.safe_load(SMOKE.read_text())
    variant["train"].update(KILL_TRAIN)
    variant.update({k: str(v) for k, v in out.items()}, fork_server=False, python=sys.executable)
    (tmp_path / "kills.yaml").write_text(yaml.safe_dump(variant))
    cell = out["results_dir"] / "tiny" / "bf16" / "pg" / "seed0"
    cmd = [sys.executable, "-m", "snakemake", "--nolock", "--cores", "2", "--retries", str(len(KILLS)),
           *smoke_warm_start.SNAKEMAKE_ARGS, "--configfile", str(tmp_path / "kills.yaml"), "--", str(cell / "summary.json")]
    check_kill_table(kill_in_a_chain(cmd, cell, tmp_path, env={"PYTHONPATH": str(ROOT)}))
