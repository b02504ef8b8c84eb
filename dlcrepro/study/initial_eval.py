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

from ..step import stamped
from ..core.config import Config
from ..core.grid import probe_engine_sampler
from ..step.train import Trainer
from ..core.util import log

FORMAT = 1  # bump when the file's layout changes

# the train section's keys that `Trainer.evaluate` reads (the engine and task sections: all of them)
EVAL_KEYS = ("eval_on", "eval_mode", "eval_samples", "pool_size")


def identity(cfg: Config, model: str, seed: int, model_dir: Path) -> dict:
    """Everything θ_0's evaluation depends on; a cell uses a file only if its own is the same. The model is
    named by its weights' hash, not `model_dir`, and the node by its kernel path
    (`stamped.model_and_kernels`)."""
    return stamped.shared_identity(FORMAT, cfg, model, model_dir, EVAL_KEYS, seed=int(seed))


def write_initial_eval(cfg: Config, model: str, seed: int, out: Path, model_dir: Path) -> dict:
    """Evaluate θ_0 as a cell of `seed` does and save its accuracies with their identity to `out`;
    returns the accuracies."""
    from ..cluster import check_device

    check_device(cfg, model)  # a GPU job on a CPU torch stops here, as a training job does
    torch.manual_seed(seed)  # as train_cell seeds before it builds its Trainer
    # The Trainer of a run whose one engine is the probe engine, built as every cell builds it.
    tr = Trainer(cfg, model, probe_engine_sampler(), "pg", seed, model_dir)
    accuracies = tr.evaluate(0)
    stamped.write(out, identity(cfg, model, seed, model_dir), "accuracies", accuracies, as_json=True)
    log(f"θ_0 of {model}, seed {seed}: {json.dumps(accuracies)} into {out}")
    return accuracies


def load_initial_eval(path: Path, want: dict) -> dict[str, float]:
    """θ_0's accuracies from `path`, if the file was written for exactly `want` (`identity`); else
    a ConfigError naming what differs, or a DamagedFileError for a file that does not parse."""
    _, accuracies = stamped.load(path, want, "accuracies", "θ_0's evaluation", "θ_0 evaluation", as_json=True)
    return {k: float(v) for k, v in accuracies.items()}
