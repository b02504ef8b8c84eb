"""θ_0's evaluation, computed once per (model, seed) and read by that seed's cells.

Every cell's accuracy curve starts at θ_0 (`Trainer.evaluate(0)`, before step 1): the BF16 probe
engine, holding the warm-started weights, answers the eval problems greedily and `eval_samples`
times sampled (seeded by the seed and step 0) and, with `eval_on: pool`, the held-out test problems
greedily. Nothing of it depends on the sampler or the correction, so the 28 cells of a seed computed
the same numbers 28 times. `python -m dlcrepro initial-eval` computes them once into a small JSON
file (the workflow's rule `initial_eval`); a cell given the file (`train --initial`) takes θ_0's
accuracies from it and still loads θ_0 into its probe engine and checks that load, as before.
Without the file a cell evaluates θ_0 itself: the same numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .config import Config, ConfigError, to_dict
from .util import DamagedFileError, atomic_write_text, log

FORMAT = 1  # bump when the file's layout changes

# the train section's keys that `Trainer.evaluate` reads (the engine and task sections: all of them)
EVAL_KEYS = ("eval_on", "eval_mode", "eval_samples", "pool_size")


def identity(cfg: Config, model: str, seed: int, model_dir: Path) -> dict:
    """Everything θ_0's evaluation depends on; a cell uses a file only if its own is the same."""
    t = cfg.train_for(model)
    return {
        "format": FORMAT,
        "model": model,
        "model_dir": str(model_dir),
        "seed": int(seed),
        "engine": to_dict(cfg.engine),
        "task": to_dict(cfg.task),
        "train": {k: getattr(t, k) for k in EVAL_KEYS},
    }


def write_initial_eval(cfg: Config, model: str, seed: int, out: Path, model_dir: Path) -> dict:
    """Evaluate θ_0 as a cell of `seed` does and save its accuracies with their identity to `out`;
    returns the accuracies."""
    from .cluster import check_device
    from .train import Trainer

    check_device(cfg, model)  # a GPU job on a CPU torch stops here, as a training job does
    torch.manual_seed(seed)  # as train_cell seeds before it builds its Trainer
    # A `bf16` run's Trainer: its one engine is the BF16 probe engine, built as every cell builds it.
    tr = Trainer(cfg, model, "bf16", "pg", seed, model_dir)
    accuracies = tr.evaluate(0)
    blob = {"identity": identity(cfg, model, seed, model_dir), "accuracies": accuracies}
    atomic_write_text(Path(out), json.dumps(blob, indent=1))
    log(f"θ_0 of {model}, seed {seed}: {json.dumps(accuracies)} into {out}")
    return accuracies


def load_initial_eval(path: Path, want: dict) -> dict[str, float]:
    """θ_0's accuracies from `path`, if the file was written for exactly `want` (`identity`); else
    a ConfigError naming what differs, or a DamagedFileError for a file that does not parse."""
    path = Path(path)
    try:
        blob = json.loads(path.read_text())
        got, accuracies = blob["identity"], blob["accuracies"]
    except FileNotFoundError:
        raise
    except Exception as e:
        raise DamagedFileError(f"{path}: not a readable θ_0 evaluation ({type(e).__name__}: {e}); delete it and rerun its rule") from e
    want = json.loads(json.dumps(want))  # as the file holds it (tuples become lists)
    differ = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    if differ:
        raise ConfigError(f"{path} holds θ_0's evaluation of another run: {', '.join(differ)} differ "
                          f"(file: {', '.join(f'{k}={got.get(k)!r}' for k in differ)}); delete it and rerun its rule")
    return {k: float(v) for k, v in accuracies.items()}
