"""Shared fixtures: one tiny model, warm-started for a few seconds, for every test that needs weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

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


@pytest.fixture(scope="session")
def smoke_cfg():
    from dlcrepro.config import load

    return load(SMOKE)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smoke_cfg) -> Path:
    """The smoke config's tiny model after its short warm start (the real `warmstart` code path)."""
    from dlcrepro.warmstart import warmstart

    out = tmp_path_factory.mktemp("tiny")
    warmstart(smoke_cfg, "tiny", out)
    return out / "model"


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
    cache = tmp_path_factory.mktemp("hf-cache")
    p = subprocess.run([sys.executable, "-m", "dlcrepro", "rehearsal", "--cache", str(cache), "--warmstart-steps", "20",
                        "--summary", str(cache / "summary.json")], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stderr[-4000:]
    return cache
