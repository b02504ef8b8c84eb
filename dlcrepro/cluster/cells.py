"""The grid's cells, which of them copy another cell's run, and the jobs the cells share: one
shared-rollouts job per lagged sampler and seed, one θ_0 evaluation per model and seed."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from ..core.config import Config
from ..core.grid import computed_as, get_sampler
from ..core.registry import engine_topk, updates_per_batch


@dataclass(frozen=True)
class GridCell:
    """One cell of the grid as the plan and the workflow lay it out (a training job, or a copy of
    one) and, if it copies another cell's run, that cell's correction."""

    model: str
    sampler: str
    correction: str
    seed: int
    same_as: str | None = None  # the correction of the cell whose run this one copies

    @property
    def name(self) -> str:
        return f"{self.model}/{self.sampler}/{self.correction}/seed{self.seed}"


def _excluded(cell: dict, rules: list[dict]) -> bool:
    return any(all(str(cell[k]) == str(v) for k, v in r.items()) for r in rules)


def grid_cells(cfg: Config) -> list[GridCell]:
    """The grid (models x samplers x corrections x seeds, exclusions removed), each cell with the
    cell it copies: one whose run it is bit for bit (grid.SAME_AS) and that the grid holds; a cell
    whose twin the grid leaves out trains."""
    g = cfg.grid
    cells = [
        dict(model=m, sampler=s, correction=c, seed=int(k))
        for m, s, c, k in itertools.product(g.models, g.samplers, g.corrections, g.seeds)
    ]
    cells = [c for c in cells if not _excluded(c, g.exclude)]
    keys = {(c["model"], c["sampler"], c["correction"], c["seed"]) for c in cells}
    return [GridCell(**c, same_as=copy_source(cfg, c["model"], c["sampler"], c["correction"], c["seed"], keys)) for c in cells]


def copy_source(cfg: Config, model: str, sampler: str, correction: str, seed: int, keys: set) -> str | None:
    """The correction of the grid cell (in `keys`) whose run this cell's run is, or None."""
    same, _ = computed_as(sampler, correction, cfg.train_for(model))
    return same if same != correction and (model, sampler, same, int(seed)) in keys else None


def finished(cfg: Config, cell: GridCell) -> bool:
    """A cell whose run is done: its summary.json, written last, is in its results directory."""
    return (Path(cfg.results_dir) / cell.name / "summary.json").exists()


def initial_eval_jobs(cfg: Config) -> list[tuple[str, int]]:
    """(model, seed) of every θ_0 evaluation job (dlcrepro/study/initial_eval.py): one per model and seed
    with a trained cell to read it."""
    return list(dict.fromkeys((c.model, c.seed) for c in grid_cells(cfg) if c.same_as is None))


def rollouts_jobs(cfg: Config) -> list[tuple[str, str, int]]:
    """(model, sampler, seed) of every shared-rollouts job (dlcrepro/study/rollouts.py): a lagged sampler's
    seed with a trained cell to read it."""
    jobs = {}
    for c in grid_cells(cfg):
        t = cfg.train_for(c.model)
        if c.same_as is None and get_sampler(c.sampler).shared_steps(t.steps, t.sync_every) > 0:
            jobs[(c.model, c.sampler, c.seed)] = True
    return list(jobs)


def rollouts_topk(cfg: Config, model: str, sampler: str, seed: int) -> int:
    """The top-k log-probs a rollouts job keeps per token: engine.topk if a trained cell that reads
    its file has a correction that reads the engine's next-token distribution, else 0 (the file is
    then ~k times smaller)."""
    readers = [c.correction for c in grid_cells(cfg) if (c.model, c.sampler, c.seed) == (model, sampler,
                                                                                         int(seed)) and c.same_as is None]
    return max((engine_topk(c, cfg.engine) for c in readers), default=0)


def scan_corrections(cfg: Config, model: str, sampler: str) -> list[str]:
    """The grid's corrections a batch-size scan under `sampler` measures (dlcrepro/study/scan.py): those
    that are their own computation under it (grid.computed_as: at fp8 dlc is is_center, is_resync
    is is, and ppo with one SGD step per batch is pg), less those with several SGD steps per batch
    (registry.updates_per_batch): the scan does not update θ."""
    t = cfg.train_for(model)
    return [c for c in cfg.grid.corrections if computed_as(sampler, c, t)[0] == c and updates_per_batch(c, t) == 1]
