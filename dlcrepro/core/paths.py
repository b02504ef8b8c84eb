"""Where a config's models and data sets are on disk: local paths, the warm-start output of tiny
models, and the local Hugging Face cache (never downloaded). Below `config` (the typed schema),
which it reads; torch-free."""

from __future__ import annotations

import os
from pathlib import Path

from .config import Config, ConfigError


# The rehearsal's checkpoint and data set (dlcrepro/study/rehearsal.py): Hugging Face ids that no hub
# serves; the workflow builds them into the cache, where a paper job then finds them by id.
REHEARSAL_MODEL = "dlcrepro/Qwen3-Rehearsal"
REHEARSAL_DATASET = "dlcrepro/Countdown-Rehearsal"
BUILT_HERE = {REHEARSAL_MODEL: "model", REHEARSAL_DATASET: "dataset"}


def cache_repo_dir(hub: Path, repo_id: str, kind: str) -> Path:
    """A repository's folder in the hub cache: `models--org--name` (or `datasets--…`)."""
    return hub / f"{kind}s--{repo_id.replace('/', '--')}"


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache directory ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    return Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser() / "hub"


class NotCached(ConfigError):
    """An id that is neither a local path nor a usable snapshot in the cache; `problem` says which
    without the key and the fetch line (the plan prints those in columns of its own)."""

    def __init__(self, message: str, problem: str):
        super().__init__(message)
        self.problem = problem


def cached_snapshot(repo: Path) -> Path | None:
    """The snapshot of a hub cache repo (`<cache>/models--org--name`) that a job reads: the commit
    `refs/main` names (what `huggingface-cli download` last fetched for `main`; an older snapshot
    left beside it is not the model any more), else the only snapshot; None when there is none.

    Raises ConfigError (without the config key: callers add it) when refs/main names a commit
    that has no snapshot, or when there is no refs/main and several snapshots to choose from."""
    # a hidden directory is a snapshot still being laid out (rehearsal.write_snapshot's .<commit>.tmp)
    snaps = sorted(d.name for d in (repo / "snapshots").glob("*") if d.is_dir() and not d.name.startswith("."))
    ref = repo / "refs" / "main"
    if ref.is_file():
        commit = ref.read_text().strip()
        if commit in snaps:
            return repo / "snapshots" / commit
        raise ConfigError(f"{ref} names commit {commit}, but {repo / 'snapshots'} has no such snapshot "
                          f"(has: {', '.join(snaps) or 'none'}): an interrupted download?")
    if len(snaps) > 1:
        raise ConfigError(f"{repo} has no refs/main and {len(snaps)} snapshots ({', '.join(snaps)}): "
                          "give the path of the one to use")
    return repo / "snapshots" / snaps[0] if snaps else None


def resolve_local(path: str, kind: str, key: str) -> Path:
    """A local path, or a Hugging Face `kind` ("model" or "dataset") id found in the local cache
    (its snapshot: `cached_snapshot`).

    Never downloads: jobs run with HF_HUB_OFFLINE=1, so a missing item is an error saying how to
    fetch it on a login node.
    """
    p = Path(path).expanduser()
    if p.exists():
        return p
    hub = hf_hub_cache()
    flag = " --repo-type dataset" if kind == "dataset" else ""
    fetch = f"huggingface-cli download{flag} {path}"
    try:
        snap = cached_snapshot(cache_repo_dir(hub, path, kind))
    except ConfigError as e:
        raise NotCached(f"{key}={path!r}: {e}. Fetch it again on a login node: `{fetch}`", str(e)) from None
    if snap is not None:
        return snap
    raise NotCached(
        f"{key}={path!r}: no such path and not in the Hugging Face cache ({hub}). "
        f"Fetch it on a login node first: `{fetch}`",
        "not a local path and not in the Hugging Face cache",
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
