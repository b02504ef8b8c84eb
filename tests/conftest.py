"""Shared fixtures: one tiny model, warm-started for a few seconds, for every test that needs weights."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# One OpenMP thread per process unless a job asks for more (the workflow's rules set their own), and
# waiting threads that sleep: under `pytest -n 3` the three workers' processes share 2 cores, where
# OpenMP's spinning threads burn the core the other process needs. Two smoke cells at once took
# 46-58 s with 2 spinning threads each, 21-22 s with OMP_WAIT_POLICY=PASSIVE, 19-20 s with 1 thread
# (docs/measurements.md, "The test suite at the speed of a change"). Set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"


def slowdown() -> float:
    """How many times slower than idle this machine runs now: its 1-minute load per core, at least 1.
    Waits in tests are nominal seconds (an idle 2-core machine) times this, never a fixed sleep."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def wait_for(what: str, ready, nominal: float, proc=None, poll: float = 0.1):
    """Poll `ready()` until it returns something true, and return that. Fails, naming `what`, after
    `nominal` seconds times the largest `slowdown()` seen, or as soon as `proc` (a Popen) has ended."""
    start, factor = time.monotonic(), slowdown()
    while not (value := ready()):
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"waiting for {what}: the process ended first (exit status {proc.returncode})")
        factor = max(factor, slowdown())
        if time.monotonic() - start > nominal * factor:
            raise AssertionError(f"waiting for {what}: not within {nominal} s x {factor:.1f} (load per core)")
        time.sleep(poll)
    return value


@contextmanager
def stopped_after(proc, stop=signal.SIGTERM, timeout: float = 120):
    """The block with `proc` (a Popen); if it still runs when the block ends (a failed assertion),
    `stop` is sent (SIGTERM: snakemake stops its jobs and fork server; SIGINT: the Slurm executor
    cancels its jobs), then SIGKILL after `timeout` seconds: a failed test leaves nothing running."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(stop)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# What makes a test take seconds or more: its marker, or a fixture that builds something (a warm
# start, the rehearsal's checkpoint). Every other test is `quick`: `pytest -m quick` is the inner
# loop of development (docs/extending.md); the README's test command still runs everything.
# Heaviest first: under `pytest -n 3` (pytest-xdist, `--dist loadfile` from pyproject.toml) whole files
# go to the workers in this order of their heaviest marker, so the two Slurm files (8-10 min each alone, mostly
# waiting on the cluster) start first on two workers and the third worker's files fill their waits.
HEAVY_MARKERS = ("slurm", "slow", "engine", "snakemake")
HEAVY_FIXTURES = {"tiny_model_dir", "smoke_warm_start", "rehearsal_cache"}


# each test file's wall seconds in a run of the suite (bench/suite_profile.py --file-seconds); a
# file not in it counts as 0 s; only the order of the run depends on it
FILE_SECONDS = json.loads((Path(__file__).parent / "file_seconds.json").read_text())


def file_rank(marker_names: set[str]) -> int:
    """A file's place in the run: the rank of its heaviest marker in HEAVY_MARKERS, quick files last."""
    return next((i for i, name in enumerate(HEAVY_MARKERS) if name in marker_names), len(HEAVY_MARKERS))


def pytest_collection_modifyitems(config, items):
    for item in items:
        heavy = (set(HEAVY_MARKERS) & {m.name for m in item.iter_markers()}
                 or HEAVY_FIXTURES & set(getattr(item, "fixturenames", ())))
        if not heavy:
            item.add_marker(pytest.mark.quick)

    def file_of(item) -> str:
        return item.nodeid.split("::")[0]

    markers_by_file: dict[str, set[str]] = {}
    for item in items:
        markers_by_file.setdefault(file_of(item), set()).update(m.name for m in item.iter_markers())
    # a stable sort: tests keep their order within a file; of files with the same rank, the longer
    # (as last measured) go first, so that pytest-xdist (--dist loadfile) hands out the long ones
    # early and the workers end together on short ones
    items.sort(key=lambda item: (file_rank(markers_by_file[file_of(item)]), -FILE_SECONDS.get(file_of(item), 0)))


def run_dir(tmp_path_factory) -> Path:
    """The test run's own temporary directory, the same for all of its pytest-xdist workers."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def built_once(tmp_path_factory, name: str):
    """A directory for something a test run builds once, shared by the run's pytest-xdist workers
    (`pytest -n 3`): the first worker to get here builds it (inside the block) while the others wait
    on a file lock; they find it done, as a marker file says, and skip the block. Yields (the
    directory, whether to build it). Without workers it is the session's own directory."""
    from filelock import FileLock

    root = run_dir(tmp_path_factory)
    d, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        build = not done.exists()
        if build:
            shutil.rmtree(d, ignore_errors=True)  # a worker's failed build before this one
            d.mkdir(parents=True)
        yield d, build
        if build:
            done.touch()


@pytest.fixture(scope="session")
def smoke_cfg():
    from dlcrepro.core.config import load

    return load(SMOKE)


@dataclass(frozen=True)
class WarmStart:
    """The smoke config's warm start as the workflow's `warmstart` rule leaves it."""

    artifacts: Path  # <artifacts>/tiny/model, <artifacts>/tiny/warmstart.json
    job_config: Path  # the rule's input (results/_config/tiny.warmstart.yaml), older than its outputs
    # what a study sharing it adds to its snakemake command line: every rerun trigger but `input`,
    # which sees the job config's copy as another input file than the one the warm start was made from
    SNAKEMAKE_ARGS = ("--rerun-triggers", "mtime", "params", "software-env", "code")

    def up_to_date_in(self, results_dir: Path) -> None:
        """Make a study with `artifacts=self.artifacts`, this results directory and `SNAKEMAKE_ARGS`
        find the warm start done: its job config, copied with its modification time, is older than the
        warm start, and the workflow rewrites it only when its text changes (workflow/rules/common.smk)."""
        (results_dir / "_config").mkdir(parents=True, exist_ok=True)
        shutil.copy2(self.job_config, results_dir / "_config" / self.job_config.name)


@pytest.fixture(scope="session")
def smoke_warm_start(tmp_path_factory) -> WarmStart:
    """The smoke model's warm start, made once per test run by the workflow's own rule (locally).
    Every test that needs trained-from-scratch weights starts from it: the engine and trainer tests
    (`tiny_model_dir`) and the studies whose subject is not the warm start (a test's snakemake finds
    it up to date through `WarmStart.up_to_date_in`); the smoke pipeline's test and the Slurm grid's
    run their own."""
    with built_once(tmp_path_factory, "smoke-warm-start") as (d, build):
        out = {"results_dir": d / "results", "figures_dir": d / "figures", "tables_dir": d / "tables",
               "artifacts": d / "artifacts"}
        if build:
            target = out["artifacts"] / "tiny" / "warmstart.json"
            p = subprocess.run([sys.executable, "-m", "snakemake", "--nolock", "--cores", "2", "--configfile", str(SMOKE),
                                "--config",
                                *(f"{k}={v}" for k, v in out.items()), f"python={sys.executable}", "--", str(target)],
                               cwd=ROOT, capture_output=True, text=True, timeout=1800)
            assert p.returncode == 0, p.stderr[-4000:]
    return WarmStart(out["artifacts"], out["results_dir"] / "_config" / "tiny.warmstart.yaml")


@pytest.fixture(scope="session")
def fork_server(tmp_path_factory):
    """A fork server (dlcrepro/run/server.py) for the test run: a `python -m dlcrepro train` given
    `--server` with its socket runs as the server's child, without ~10 s of imports and teardown. It
    runs each job through the same `cli.main`, and a job it cannot take runs in its own process."""
    from dlcrepro.run.server import private_dir

    path = str(private_dir() / f"tests-{os.getpid()}.sock")
    log = tmp_path_factory.mktemp("fork-server") / "serve.log"
    proc = subprocess.Popen([sys.executable, "-m", "dlcrepro", "serve", "--socket", path, "--watch-pid", str(os.getpid())],
                            cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        wait_for("the fork server's socket", lambda: os.path.exists(path), 60, proc)
        yield path
    finally:
        with stopped_after(proc):
            pass


@pytest.fixture(scope="session")
def tiny_model_dir(smoke_warm_start) -> Path:
    """The smoke config's tiny model after its short warm start (the real `warmstart` rule)."""
    return smoke_warm_start.artifacts / "tiny" / "model"


def small_model_dir(path: Path) -> Path:
    """A directory with a config.json and one small safetensors file: what a shared file's identity
    reads of a model (weights.model_identity), for the tests that stamp files without an engine."""
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file({"model.embed_tokens.weight": torch.arange(6, dtype=torch.float32).reshape(3, 2)}, path / "model.safetensors")
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    return path


PAPER_MODELS = ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B")
PAPER_DATASET = "Jiayi-Pan/Countdown-Tasks-3to4"
# The published shapes (config.json of each model on the hub), for the plan's memory estimate.
QWEN3_CONFIGS = {
    "Qwen/Qwen3-0.6B": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                            num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "Qwen/Qwen3-1.7B": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                            num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
}
COMMIT = "0" * 40  # the commit refs/main names


def cache_repo(root: Path, repo_dir: str, files: dict[str, bytes], commit: str = COMMIT, ref: bool = True) -> Path:
    """One hub repo as `huggingface-cli download` leaves it: each file's content in blobs/ under
    a name of its own, snapshots/<commit>/<file> a relative symlink to it, refs/main the commit.
    Returns the snapshot."""
    repo = root / repo_dir
    snap = repo / "snapshots" / commit
    for i, (name, content) in enumerate(files.items()):
        blob = repo / "blobs" / f"{commit[:8]}{i:032x}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if ref:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
    return snap


def fake_hf_cache(root: Path, models=PAPER_MODELS, datasets=(PAPER_DATASET,)) -> Path:
    """A Hugging Face hub cache laid out as `huggingface-cli download` leaves it (refs/main,
    snapshots/ of symlinks into blobs/), with a model's published config.json and empty weights:
    for the checks that look for weights and data, never for loading them."""
    for repo in models:
        config = json.dumps(QWEN3_CONFIGS.get(repo, {})).encode()
        cache_repo(root, f"models--{repo.replace('/', '--')}", {"config.json": config, "model.safetensors": b""})
    for repo in datasets:
        cache_repo(root, f"datasets--{repo.replace('/', '--')}", {"data/train-00000-of-00001.parquet": b""})
    return root


@pytest.fixture(scope="session")
def rehearsal_cache(tmp_path_factory) -> Path:
    """The rehearsal's checkpoint and data set, built by the real command into an empty Hugging Face
    cache, with a warm start cut to 20 steps (the path, not the skill, is under test)."""
    with built_once(tmp_path_factory, "hf-cache") as (cache, build):
        if build:
            p = subprocess.run([sys.executable, "-m", "dlcrepro", "rehearsal", "--cache", str(cache), "--warmstart-steps", "20",
                                "--summary", str(cache / "summary.json")], cwd=ROOT, capture_output=True, text=True, timeout=1800)
            assert p.returncode == 0, p.stderr[-4000:]
    return cache


# ----------------------------------------------------------------------------- the local Slurm cluster
# For tests/test_slurm.py and tests/test_slurm_faults.py, which pytest-xdist runs at once on two
# workers: most of their time is waiting on Slurm, so the two files' waits overlap.


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real single-node Slurm on localhost (scripts/slurm_up.sh), shared by the run's workers. The
    last worker done with it stops it, where this run started it; a developer's own cluster is left
    running. A worker that comes after the others stopped it starts it again."""
    if os.geteuid() != 0:
        pytest.skip("starting slurmctld/slurmd/munged needs root")
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        pytest.skip("Slurm is not installed and there is no apt-get to install it")
    from filelock import FileLock

    root = run_dir(tmp_path_factory)
    lock, users, started_here = FileLock(str(root / "slurm.lock")), root / "slurm.users", root / "slurm.started-here"
    with lock:
        up = subprocess.run(["bash", str(ROOT / "scripts" / "slurm_up.sh")], capture_output=True, text=True, timeout=600)
        assert up.returncode == 0, up.stdout + up.stderr
        if "already running" not in up.stdout:
            started_here.touch()
        users.write_text(str(int(users.read_text() if users.exists() else 0) + 1))
    try:
        yield
    finally:
        with lock:
            left = int(users.read_text()) - 1
            users.write_text(str(left))
            if left == 0 and started_here.exists():
                subprocess.run(["bash", str(ROOT / "scripts" / "slurm_down.sh")], capture_output=True, timeout=60)
                started_here.unlink()


@pytest.fixture(scope="session")
def snakemake_slurm(tmp_path_factory):
    """snakemake with the Slurm plugins, from its own env (scripts/setup_workflow_env.sh), made once per run."""
    with built_once(tmp_path_factory, "workflow-env") as (_, build):
        if build:
            p = subprocess.run(["bash", str(ROOT / "scripts" / "setup_workflow_env.sh")], capture_output=True, text=True,
                               timeout=900)
            assert p.returncode == 0, p.stdout + p.stderr
    return [str(ROOT / ".venv-workflow" / "bin" / "snakemake")]


def slurm_out_config(out: dict) -> list[str]:
    """`--config` values sending a run's outputs to `out`; its jobs run the package with the
    interpreter running these tests (the training env)."""
    return [f"{k}={v}" for k, v in out.items()] + [f"python={sys.executable}"]


@pytest.fixture
def outdirs(tmp_path):
    out = {"results_dir": tmp_path / "results", "figures_dir": tmp_path / "figures",
           "tables_dir": tmp_path / "tables", "artifacts": tmp_path / "artifacts"}
    return out, slurm_out_config(out)


@pytest.fixture
def warm_outdirs(tmp_path, smoke_warm_start):
    """`outdirs` whose artifacts are the test run's warm start, found up to date: the tests whose
    subject is a training job do not each wait for a warm-start job (the grid's test runs its own)."""
    out = {"results_dir": tmp_path / "results", "figures_dir": tmp_path / "figures",
           "tables_dir": tmp_path / "tables", "artifacts": smoke_warm_start.artifacts}
    smoke_warm_start.up_to_date_in(out["results_dir"])
    return out, slurm_out_config(out), list(smoke_warm_start.SNAKEMAKE_ARGS)


# A job killed at each moment of its cell, one after another (dlcrepro/core/procs.py's pause points: the job
# stops itself there, the test SIGKILLs it as a node failure would, snakemake's retry (`--retries`) is
# the next attempt and stops at the next moment): (the moment as DLCREPRO_PAUSE_AT names it, the steps
# the cell had finished when killed). A phase's count is its pass in that attempt's process. KILL_TRAIN:
# 6 steps, a checkpoint after steps 2 and 4, so no retry may train again more than 2 finished steps.
KILL_TRAIN = {"steps": 6, "ckpt_every": 2, "eval_every": 2}
KILLS = (
    ("sample:4", 3),  # attempt 1, step 4's sampling: steps 1-3 done, the checkpoint of step 2 on disk
    ("update:2", 3),  # attempt 2 (on from step 2), its second update: step 4's, its batch sampled and scored
    ("checkpoint_written:1", 4),  # attempt 3 (on from step 2), mid-save of step 4's checkpoint: whole, not yet vouched for
    ("finished_record", 6),  # attempt 4: the finished record (finished.pt) written, the summary not yet
    # attempts 5 and 6 write the outputs again from the record and stop at its last two moments, as a
    # training job would: the summary written, the checkpoint not yet removed (the retry finds the record
    # and the checkpoint, as after a kill at finished_record); the checkpoint removed (the record alone)
    ("summary_written", 6),
    ("checkpoint_removed", 6),  # the job's last act; attempt 7 writes the outputs and ends the cell
)
# Through Slurm each attempt is a job whose end the executor sees only at its next status check, whose
# interval grows with each check that finds none ended: from a kill to the retry's own kill or end took
# 34-166 s there in docs/faults.md's table, against 5-36 s locally. So the suite's Slurm chain is two
# kills: mid-save of step 4's checkpoint (a kill before the record) and after the finished record.
# DLCREPRO_ALL_KILLS=1 runs all of KILLS through Slurm too, as docs/faults.md's table did.
KILLS_SLURM = (("checkpoint_written:2", 4), ("finished_record", 6))


def kills_through_slurm() -> tuple[tuple[str, int], ...]:
    return KILLS if os.environ.get("DLCREPRO_ALL_KILLS") == "1" else KILLS_SLURM


def steps_retried(log: str) -> int:
    """The step a retry's train.log says it went on from: a resume's, 0 for a start, every step for
    outputs written again from the finished record."""
    if "no step recomputed" in log:
        return KILL_TRAIN["steps"]
    resumed = re.findall(r"resuming .* from step (\d+)", log)
    assert resumed or "starting" in log, log
    return int(resumed[0]) if resumed else 0


def kill_in_a_chain(cmd: list[str], cell: Path, tmp_path: Path, env: dict | None = None,
                    kills: tuple[tuple[str, int], ...] = KILLS) -> list[tuple]:
    """Run `cmd` (a snakemake making `cell` with `--retries` at least len(kills)) once undisturbed, then
    once more with the cell's directory deleted and its job killed at every moment of `kills` in turn,
    each attempt being the previous one's retry; the last retry must end with the undisturbed run's
    numbers. Rows: (where, steps done, the step the retry went on from, finished steps recomputed,
    steps left to the retry, seconds from the kill to the retry's own kill or end)."""
    import pandas as pd

    from dlcrepro.core import procs

    env = {**os.environ, **(env or {})}
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800, env=env)
    assert p.returncode == 0, p.stderr[-4000:]
    ref = pd.read_parquet(cell / "metrics.parquet")
    cols = [c for c in ref.columns if not c.startswith("sec_")]
    shutil.rmtree(cell)
    pause = tmp_path / "paused"
    paused = {**env, procs.PAUSE_ENV: ",".join(where for where, _ in kills), procs.PAUSE_FILE_ENV: str(pause)}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=paused)
    logs, killed_at = [], []  # train.log as it stood at each kill; when each kill came
    with stopped_after(proc, signal.SIGINT):
        for i, (where, _) in enumerate(kills):
            stop = Path(procs.pause_file(pause, i))
            pid = int(wait_for(f"attempt {i + 1} stopped at {where}",
                               lambda: stop.exists() and stop.read_text().strip(), 300, proc))
            wait_for(f"its process {pid} stopped", lambda: (procs._stat(pid) or ("", 0))[0] == "T", 60, proc)
            logs.append((cell / "train.log").read_text())
            os.kill(pid, signal.SIGKILL)
            killed_at.append(time.monotonic())
        output, _ = proc.communicate(timeout=1800)
    assert proc.returncode == 0, output[-4000:]
    ended = time.monotonic()
    logs.append((cell / "train.log").read_text())
    pd.testing.assert_frame_equal(ref[cols], pd.read_parquet(cell / "metrics.parquet")[cols], obj="the cell after every kill")
    rows = []
    for i, (where, done) in enumerate(kills):
        assert logs[i + 1].startswith(logs[i]), f"train.log rewritten after the kill at {where}"
        went_on = steps_retried(logs[i + 1].removeprefix(logs[i]))
        until = killed_at[i + 1] if i + 1 < len(kills) else ended
        rows.append((where, done, went_on, max(0, done - went_on), KILL_TRAIN["steps"] - went_on, round(until - killed_at[i])))
    return rows


def check_kill_table(rows: list[tuple]) -> None:
    """Print the rows as docs/faults.md's table; no retry recomputes more than one checkpoint interval,
    and none after the finished record."""
    table = "\n".join("| " + " | ".join(map(str, r)) + " |" for r in rows)
    print("\n| killed at | steps finished | the retry went on from | finished steps recomputed | steps left to the retry "
          "| seconds from the kill to the retry's own kill or end |\n" + table)
    assert all(lost <= KILL_TRAIN["ckpt_every"] for _, _, _, lost, _, _ in rows), table
    after = ("finished_record", "summary_written", "checkpoint_removed")
    assert all(lost == 0 and trained == 0 for w, _, _, lost, trained, _ in rows if w in after), table
