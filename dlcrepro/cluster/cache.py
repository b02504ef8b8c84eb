"""The weights and data the grid's jobs read from this machine's Hugging Face cache (never
downloaded): which are found, which are incomplete or missing, and which of those a job still to
run needs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.config import Config
from .cells import finished, grid_cells


@dataclass(frozen=True)
class Need:
    """A model's weights or the task's data, and where they were found (or how to fetch them)."""

    key: str
    value: str
    found: Path | None
    problem: str = ""
    fix: str = ""
    built_here: bool = False  # the workflow makes it (the rehearsal's, paths.BUILT_HERE): never missing
    readers: tuple[str, ...] = ()  # the grid's models whose training jobs read it


# A checkpoint's weights: one file, or shards listed in the file's `.index.json` weight_map
# (safetensors first; a local directory may hold PyTorch's format).
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def checkpoint_problem(d: Path) -> str:
    """"" when `d` holds a complete checkpoint: config.json and the weights (model.safetensors, or
    model.safetensors.index.json with every shard its weight_map names; the same for
    pytorch_model.bin), else what is missing.

    In a hub cache snapshot each file is a symlink into the repo's blobs/, made once the file has
    arrived; a download that stopped leaves shards absent (or links dangling) and its partial
    blob as blobs/*.incomplete, which `huggingface-cli download` resumes."""
    missing = [] if (d / "config.json").exists() else ["config.json"]
    for name in WEIGHT_FILES:
        index = d / f"{name}.index.json"
        if (d / name).exists():
            break
        if index.exists():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            absent = [s for s in shards if not (d / s).exists()]  # exists() is False for a dangling link
            if absent:
                missing.append(f"{len(absent)} of {len(shards)} shards of {index.name} ({', '.join(absent)})")
            break
    else:
        missing.append(f"the weights ({' or '.join(f'{n}[.index.json]' for n in WEIGHT_FILES)})")
    if not missing:
        return ""
    if d.parent.name != "snapshots":  # a local directory, not a download
        return f"incomplete checkpoint at {d}: missing {'; '.join(missing)}"
    partial = list((d.parents[1] / "blobs").glob("*.incomplete"))
    held = f"; blobs/ holds {len(partial)} partial file(s) (*.incomplete)" if partial else ""
    return f"incomplete download at {d}: missing {'; '.join(missing)}{held}; rerunning the download resumes it"


def needs(cfg: Config) -> list[Need]:
    """What the grid's jobs read from disk and do not build: each `hf` model's weights (read by that
    model's jobs) and a parquet task's data (read by every job), found as a local path or in the
    Hugging Face cache (never downloaded)."""
    models = tuple(dict.fromkeys(cfg.grid.models))
    items = [(f"models.{m}.path", cfg.models[m].path, "model", (m,)) for m in models if cfg.models[m].kind == "hf"]
    if cfg.task.source == "parquet":
        items.append(("task.path", cfg.task.path, "dataset", models))
    return [Need(key, value, **_find(key, value, kind), readers=readers) for key, value, kind, readers in items]


def _find(key: str, value: str | None, kind: str) -> dict[str, Any]:
    """A need's `found`, `problem` ("" if none), `fix` (the line that fetches it) and `built_here`."""
    from ..core.paths import BUILT_HERE, NotCached, resolve_local

    if not value:  # the schema allows it; validate() refuses it, but the Snakefile only builds
        what = "for kind 'hf'" if kind == "model" else "when task.source is 'parquet'"
        return dict(found=None, problem=f"{key} is required {what}: a local path or a Hugging Face id")
    flag = " --repo-type dataset" if kind == "dataset" else ""
    fix = f"huggingface-cli download{flag} {value}" if "/" in value and not Path(value).is_absolute() else ""
    try:
        found = resolve_local(value, kind, key)
    except NotCached as e:
        built = value in BUILT_HERE
        return dict(found=None, built_here=True) if built else dict(found=None, problem=e.problem, fix=fix)
    if kind == "model":
        return dict(found=found, problem=checkpoint_problem(found), fix=fix)
    has_data = any(found.rglob("*.parquet")) or found.suffix == ".parquet"
    no_data = f"found at {found} but without parquet files: an interrupted download?"
    return dict(found=found, problem="" if has_data else no_data, fix=fix)


def blocking(cfg: Config, found: list[Need]) -> list[Need]:
    """The missing needs (of `found`) that a job still to run reads: a trained cell without its
    summary.json loads its model's weights and the task's data; a finished cell and a cell that
    copies another's run load nothing."""
    waiting = {c.model for c in grid_cells(cfg) if c.same_as is None and not finished(cfg, c)}
    return [n for n in found if n.problem and waiting.intersection(n.readers)]


def missing_message(cfg: Config) -> str:
    """The missing weights and data that a cell still to run needs (`blocking`), with the line that
    fetches each; "" when nothing is missing or only finished cells would have read it."""
    from ..core.paths import hf_hub_cache

    bad = blocking(cfg, needs(cfg))
    if not bad:
        return ""
    lines = [f"missing from this machine's Hugging Face cache ({hf_hub_cache()}); fetch on a login node, then rerun:"]
    for n in bad:
        lines.append(f"  {n.key}={n.value}: {n.problem}" + (f"\n    {n.fix}" if n.fix else ""))
    return "\n".join(lines)

