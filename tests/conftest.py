"""Shared fixtures: one tiny model, warm-started for a few seconds, for every test that needs weights."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"


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


def fake_hf_cache(root: Path, models=PAPER_MODELS, datasets=(PAPER_DATASET,)) -> Path:
    """A Hugging Face hub cache laid out as `huggingface-cli download` leaves it, with empty files:
    for the checks that look for weights and data, never for loading them."""
    for repo in models:
        snap = root / f"models--{repo.replace('/', '--')}" / "snapshots" / ("0" * 40)
        snap.mkdir(parents=True, exist_ok=True)
        (snap / "config.json").write_text("{}")
        (snap / "model.safetensors").write_bytes(b"")
    for repo in datasets:
        snap = root / f"datasets--{repo.replace('/', '--')}" / "snapshots" / ("0" * 40) / "data"
        snap.mkdir(parents=True, exist_ok=True)
        (snap / "train-00000-of-00001.parquet").write_bytes(b"")
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
