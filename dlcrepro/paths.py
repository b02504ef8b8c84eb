"""Where a config's models and data sets are on disk: local paths, the warm-start output of tiny
models, and the local Hugging Face cache (never downloaded). Below `config` (the typed schema),
which it reads; torch-free."""

from __future__ import annotations

import os
from pathlib import Path

from .config import Config, ConfigError


# The rehearsal's checkpoint and data set (dlcrepro/rehearsal.py): Hugging Face ids that no hub
# serves; the workflow builds them into the cache, where a paper job then finds them by id.
REHEARSAL_MODEL = "dlcrepro/Qwen3-Rehearsal"
REHEARSAL_DATASET = "dlcrepro/Countdown-Rehearsal"
BUILT_HERE = {REHEARSAL_MODEL: "model", REHEARSAL_DATASET: "dataset"}


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache directory ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    return Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser() / "hub"


def resolve_local(path: str, kind: str, key: str) -> Path:
    """A local path, or a Hugging Face `kind` ("model" or "dataset") id found in the local cache.

    Never downloads: jobs run with HF_HUB_OFFLINE=1, so a missing item is an error saying how to
    fetch it on a login node.
    """
    p = Path(path).expanduser()
    if p.exists():
        return p
    hub = hf_hub_cache()
    snaps = sorted((hub / f"{kind}s--{path.replace('/', '--')}" / "snapshots").glob("*"))
    if snaps:
        return snaps[-1]
    flag = " --repo-type dataset" if kind == "dataset" else ""
    raise ConfigError(
        f"{key}={path!r}: no such path and not in the Hugging Face cache ({hub}). "
        f"Fetch it on a login node first: `huggingface-cli download{flag} {path}`"
    )


def resolve_dataset_path(path: str) -> Path:
    return resolve_local(path, "dataset", "task.path")


def model_dir(cfg: Config, model: str, given: str | None = None) -> Path:
    """Where the model's weights are: the warm-start output for tiny models, else its local
    path or Hugging Face cache snapshot (never downloaded). `given` (a `--model-dir`) replaces the
    config's: a directory, or for an `hf` model its Hugging Face id (what the workflow passes),
    looked up in the local cache the same way."""
    m = cfg.models[model]
    if given:
        p = Path(given).expanduser()
        return p if p.exists() or m.kind == "tiny" else resolve_local(given, "model", "--model-dir")
    if m.kind == "tiny":
        return Path(cfg.artifacts) / model / "model"
    return resolve_local(m.path, "model", f"models.{model}.path")
