"""Shared fixtures: one tiny model, warm-started for a few seconds, for every test that needs weights."""

from __future__ import annotations

import os
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
