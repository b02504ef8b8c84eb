"""Files stamped with an identity: what they were computed for, written beside what they hold and
checked on every load, so that a file of another run is refused, naming what differs.

Three kinds use it: a run's checkpoint (its sidecar names the run: checkpoint.py), a lagged
sampler's shared rollouts (rollouts.py) and a seed's θ_0 evaluation (initial_eval.py); a finished
cell's config.yaml is read the same way (celldir.other_numbers, for `finished_as` and
`finished_here`). All compare identities through one function, `mismatch`. A cell's identity is
what its numbers depend on (`cell_identity`, the one list of those keys), never where it is
written, watched or scheduled (`tracking` among those: no identity holds it). The two shared files,
which stand in for an engine's output, name their model by its weights' hash and the node's kernel
path (`model_and_kernels`). An identity
is a dict of plain values (a config section as `to_dict` gives it, names, numbers); it is compared
as it reads back from JSON (`normal`), so a tuple written is the list read.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..core.config import Config, ConfigError, to_dict
from ..core.util import DamagedFileError, atomic_save, atomic_write_text


def normal(identity) -> object:
    """`identity` as it reads back from JSON (tuples become lists, keys strings): what is compared."""
    return json.loads(json.dumps(identity))


def differences(there, here, prefix: str = "", limit: int = 4) -> list[str]:
    """The dotted keys where two nested dicts differ, with both values: 'config.train.lr: 0.15 there, 0.3 here'."""
    if isinstance(there, dict) and isinstance(here, dict):
        out = []
        for k in sorted(set(there) | set(here), key=str):
            out += differences(there.get(k), here.get(k), f"{prefix}{k}.", limit)
        return out[:limit]
    return [] if there == here else [f"{prefix.rstrip('.')}: {there!r} there, {here!r} here"]


def mismatch(got, want, skip: tuple[str, ...] = ()) -> list[str]:
    """Where two identities differ, as JSON reads them back, leaving out the top-level keys `skip`:
    each difference as 'config.train.lr: 0.15 there, 0.3 here' (at most 4 a level); [] if they are
    the same. The one comparison of identities: a checkpoint's (checkpoint.verify), a finished cell's
    (celldir.other_numbers) and a shared file's (`require_same`)."""
    got, want = normal(got), normal(want)
    if isinstance(got, dict) and isinstance(want, dict):
        got, want = ({k: v for k, v in d.items() if k not in skip} for d in (got, want))
    return differences(got, want)


def differing_keys(got: dict, want: dict, skip: tuple[str, ...] = ()) -> list[str]:
    """The top-level keys whose values differ between two identities (as JSON reads them back), but `skip`."""
    got, want = normal(got), normal(want)
    return sorted(k for k in set(got) | set(want) if k not in skip and got.get(k) != want.get(k))


# what a differing key means where it is not the run's own settings
WHY = {
    "kernel_path": "it was computed on a node with other kernels: run this cell on such a node, or",
    "weights": "it was computed from other weights (a model directory by content: weights.py):",
}


def require_same(path: Path, got: dict, want: dict, what: str, skip: tuple[str, ...] = ()) -> None:
    """A ConfigError if the file at `path` was stamped `got` and this run wants `want` (but `skip`):
    '<path> holds <what> of another run: seed differ (seed: 1 there, 0 here); delete it and rerun its rule'."""
    diff = mismatch(got, want, skip)
    if diff:
        keys = differing_keys(got, want, skip)
        detail = "; ".join(diff)
        why = "".join(f"{WHY[k]} " for k in keys if k in WHY)
        raise ConfigError(f"{path} holds {what} of another run: {', '.join(keys)} differ ({detail}); "
                          f"{why}delete it and rerun its rule")


# The one list of what a cell's numbers depend on, besides the cell itself (model, sampler,
# correction, seed, model directory): these sections of its config, the train section with its
# model's overrides applied, and its model's entry. Keys of those that are not its numbers are
# named in NOT_NUMBERS: how often its state is saved (its checkpoints' own seconds aside, the same
# rows), the model's Slurm resources, and its train overrides (merged into `train`).
NUMBER_SECTIONS = ("task", "engine", "train")
NOT_NUMBERS = {"train": ("ckpt_every",), "model": ("resources", "train")}
# The config's other keys say where a run is written, watched, run or scheduled, never what it
# computes: changing one neither restarts a resumed cell nor unfinishes a finished one.
# tests/test_stamped.py fails on a config key in neither list.
WORKFLOW_KEYS = ("name", "artifacts", "results_dir", "figures_dir", "tables_dir", "committed_tables_dir", "committed_figures_dir",
                 "python", "fork_server", "train_env", "resources", "grid", "tracking", "decide")


def run_record(meta: dict, cfg: Config) -> dict:
    """A run as its config.yaml records it: its cell (`meta`) and its whole config."""
    return {"cell": meta, "config": to_dict(cfg)}


def cell_identity(record: dict) -> dict | None:
    """What the numbers of the run `record` (`run_record`, or a config.yaml read back) depend on:
    {"cell": ..., "config": {<NUMBER_SECTIONS>, "model": its entry}}, but NOT_NUMBERS. None for a
    record without a cell and its model's config (e.g. written by another program)."""
    try:
        cell, config = record["cell"], record["config"]
        model = dict(config["models"][cell["model"]])
        sections = {k: dict(config[k]) for k in NUMBER_SECTIONS}
    except (KeyError, TypeError, ValueError):
        return None
    sections["train"].update(model.get("train") or {})
    sections["model"] = model
    for section, keys in NOT_NUMBERS.items():
        for k in keys:
            sections[section].pop(k, None)
    return normal({"cell": cell, "config": sections})


def model_and_kernels(model_dir: Path, dtype: str) -> dict:
    """The part of a shared file's identity that names what computed it: the model by content, not by
    path (`weights.model_identity`: a moved checkout or another node's copy of the same weights reads
    the file, other weights at the same path do not), and this node's kernel path for an engine of
    `dtype` (`kernels.kernel_path`: a node with other kernels computes other floats)."""
    from .kernels import kernel_path
    from .weights import model_identity

    return {"weights": model_identity(model_dir), "kernel_path": kernel_path(dtype)}


def shared_identity(fmt: int, cfg: Config, model: str, model_dir: Path, train_keys: tuple[str, ...], **fields) -> dict:
    """The identity of a file a cell shares with others (the shared rollouts, θ_0's evaluation): its
    layout's `fmt`, the model by its weights' hash and the node by its kernel path
    (`model_and_kernels`, never `model_dir`), `fields` (sampler, seed, ...), the engine and task
    sections whole and the train section's `train_keys`, in that order."""
    t = cfg.train_for(model)
    return {
        "format": fmt,
        "model": model,
        **model_and_kernels(model_dir, cfg.engine.dtype),
        **fields,
        "engine": to_dict(cfg.engine),
        "task": to_dict(cfg.task),
        "train": {k: getattr(t, k) for k in train_keys},
    }


def write(path: Path, identity: dict, key: str, body, as_json: bool = False) -> dict:
    """Write `{"identity": identity, key: body}` at `path`, atomically: as indented JSON, or with
    `torch.save` (tensors). Returns the file's digest."""
    blob = {"identity": identity, key: body}
    if as_json:
        return atomic_write_text(Path(path), json.dumps(blob, indent=1))
    import torch

    return atomic_save(Path(path), lambda tmp: torch.save(blob, tmp))


def read(path: Path, key: str, what: str, as_json: bool = False) -> tuple[dict, object]:
    """(identity, body) of a file `write` wrote; a DamagedFileError naming `what` for one that does
    not parse. A torch file is loaded as tensors and plain containers only (`weights_only`): a file
    is never code."""
    path = Path(path)
    try:
        if as_json:
            blob = json.loads(path.read_text())
        else:
            import torch

            blob = torch.load(path, weights_only=True)
        return blob["identity"], blob[key]
    except FileNotFoundError:
        raise
    except Exception as e:
        raise DamagedFileError(f"{path}: not a readable {what} ({type(e).__name__}: {e}); delete it and rerun its rule") from e


def load(path: Path, want: dict, key: str, what: str, noun: str, as_json: bool = False,
         skip: tuple[str, ...] = ()) -> tuple[dict, object]:
    """`read` (`noun`: what the file is, for a damaged one), then `require_same` against `want` (`what`:
    what it holds): (the file's identity, its body) if it is this run's."""
    got, body = read(path, key, noun, as_json)
    require_same(path, got, want, what, skip)
    return got, body
