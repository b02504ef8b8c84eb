"""Stop a job that asks for a GPU where torch has none, before anything loads."""

from __future__ import annotations

import os
import sys

from ..core.config import Config, ConfigError
from .resources import gpu_key, job_resources


class DeviceError(ConfigError):
    """A job whose config asks for a GPU runs where torch has none."""


def check_device(cfg: Config, model: str) -> None:
    """Stop a job that asks for GPUs (`resources.gpu` > 0) before anything loads when torch is a
    CPU-only build or sees no CUDA device: the paper's model must never train on CPU. The error
    names the interpreter, torch's build and the fix."""
    gpus = job_resources(cfg, model)["gpu"]
    if gpus <= 0:
        return
    import torch

    cuda_build = torch.version.cuda
    seen = torch.cuda.device_count() if cuda_build and torch.cuda.is_available() else 0
    if seen >= gpus:
        return
    where = ", ".join(f"{k}={os.environ[k]}" for k in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID") if k in os.environ)
    env = (f"python {sys.executable}, torch {torch.__version__}" + (f" (CUDA {cuda_build})" if cuda_build else "")
           + (f", {where}" if where else ""))
    if not cuda_build:
        why = "this torch is a CPU-only build"
        fix = (
            "run the job in the GPU environment: build it with `bash scripts/setup.sh --gpu` (docs/cluster.md, "
            "\"2. Build the environments\"), or give the jobs its interpreter (`python: /path/to/env/bin/python` "
            "in the config) or `--sdm conda` (envs/train-gpu.yaml)"
        )
    else:
        why = f"torch sees {seen} CUDA device(s)"
        fix = "submit the job to a GPU partition with its GPU request (`--profile slurm` sets --gres from the config)"
    raise DeviceError(
        f"{gpu_key(cfg, model)}={gpus} asks for a GPU, but {why} ({env}); refusing to train {model!r} on CPU. "
        f"Fix: {fix}; to train this model on CPU on purpose, set {gpu_key(cfg, model)}: 0."
    )

