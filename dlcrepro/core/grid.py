"""The grid's samplers, and which of its cells compute another cell's numbers bit for bit.

Torch-free on purpose: the Snakefile imports this module (and config.py) to lay out the DAG,
also from a Snakemake environment that has neither torch nor this package installed.

Some cells of the paper's grid are the same computation as another: with one SGD step per batch
`ppo`'s reference θ_old is θ_t itself, so its ratio is exactly 1 and its gradient is `pg`'s; and a
sampler synced before every step (`bf16`, `fp8`) has θ_s = θ_t, so `dlc` is `is_center` and
`is_resync` is `is`. Such a cell is not trained again: the workflow makes it wait for the cell it
equals and copies that run's metrics (`computed_as` in its summary says from where).
tests/test_grid.py runs both cells of each pair and checks that their metrics are identical.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from .registry import UnknownNameError, updates_per_batch


# The on-policy probes and the evaluations sample from an engine of this precision, synced to θ_t.
PROBE_PRECISION = "bf16"


@dataclass(frozen=True)
class Sampler:
    """A sampler of the grid: an engine precision, a sync schedule, and its colour in the figures."""

    name: str
    precision: str
    # True: synced to θ_t before every step; False: every `sync_every` steps.
    always_synced: bool
    colour: str = ""  # in every figure that draws samplers; "" takes the next of SPARE_COLOURS when registered

    @property
    def lagged(self) -> bool:
        """Whether the trainer runs ahead of it (θ_s ≠ θ_t between syncs): the lag figures and tables are its."""
        return not self.always_synced

    @property
    def is_probe_engine(self) -> bool:
        """Whether its engine is also the run's probe engine (PROBE_PRECISION, synced before every
        step), so that a run under it starts one engine rather than two."""
        return self.precision == PROBE_PRECISION and self.always_synced

    def due(self, step: int, sync_every: int) -> bool:
        """Whether the engine is synced to θ_t before sampling step `step` (0-based)."""
        return self.always_synced or (step > 0 and step % sync_every == 0)

    def shared_steps(self, steps: int, sync_every: int) -> int:
        """How many leading steps every cell of this sampler and seed samples from θ_0, whatever its
        correction (until a resync): those before its first scheduled sync; 0 when synced before
        every step. The workflow samples them once (dlcrepro/study/rollouts.py)."""
        return 0 if self.always_synced else min(steps, sync_every)


SAMPLERS: dict[str, Sampler] = {}
# colour-blind-safe colours for a sampler registered without one, none of them black or grey
SPARE_COLOURS = ("#009E73", "#E69F00", "#F0E442", "#9467BD", "#8C564B", "#17BECF")


def register_sampler(s: Sampler) -> Sampler:
    if not s.colour:
        taken = {t.colour for t in SAMPLERS.values()}
        spare = [c for c in SPARE_COLOURS if c not in taken] or SPARE_COLOURS
        s = replace(s, colour=spare[len(SAMPLERS) % len(spare)] if spare is SPARE_COLOURS else spare[0])
    SAMPLERS[s.name] = s
    return s


for _s in (
    Sampler("bf16", "bf16", True, "#0072B2"),
    Sampler("fp8", "fp8", True, "#56B4E9"),
    Sampler("stale", "bf16", False, "#D55E00"),
    Sampler("fp8_stale", "fp8", False, "#CC79A7"),
):
    register_sampler(_s)


def probe_engine_sampler() -> str:
    """A registered sampler whose engine is the probe engine (`Sampler.is_probe_engine`): a run
    under it starts that one engine alone, as θ_0's evaluation does (initial_eval.py)."""
    return next(s.name for s in SAMPLERS.values() if s.is_probe_engine)


def lagged_samplers() -> tuple[str, ...]:
    """The registered samplers the trainer runs ahead of, in registry order."""
    return tuple(s.name for s in SAMPLERS.values() if s.lagged)


def get_sampler(name: str) -> Sampler:
    if name not in SAMPLERS:
        raise UnknownNameError(f"unknown sampler {name!r}; known: {sorted(SAMPLERS)}")
    return SAMPLERS[name]


# ----------------------------------------------------------------------------- identical cells


@dataclass(frozen=True)
class SameAs:
    """Under `when(sampler, train)` (`train` a config.TrainConfig), a run with `correction` is the run
    with `same_as`."""

    correction: str
    same_as: str
    when: Callable[[Sampler, Any], bool]
    why: str


SAME_AS: list[SameAs] = [
    SameAs(
        "ppo",
        "pg",
        lambda s, t: updates_per_batch("ppo", t) == 1,
        "one SGD step per batch: θ_old is θ_t, so the PPO ratio is exactly 1 and the clip never binds",
    ),
    SameAs(
        "dlc",
        "is_center",
        lambda s, t: s.always_synced and t.resync_ess <= 1 and t.clip_c >= 1,
        "the sampler is synced before every step: θ_s = θ_t, so the lag ratio is exactly 1 "
        "(C >= 1 never clips it) and the lag ESS exactly 1 (the resync never fires)",
    ),
    SameAs(
        "is_resync",
        "is",
        lambda s, t: s.always_synced and t.resync_ess <= 1,
        "the sampler is synced before every step: the lag ESS is exactly 1, so the resync never fires",
    ),
]


def computed_as(sampler: str, correction: str, train) -> tuple[str, str]:
    """The correction whose run a (sampler, correction) cell's run is under `train` (a
    config.TrainConfig), and why; the cell's own correction and "" when it is its own computation."""
    s, name, why = get_sampler(sampler), correction, []
    seen = {name}
    while True:
        rule = next((r for r in SAME_AS if r.correction == name and r.when(s, train)), None)
        if rule is None:
            return name, "; ".join(why)
        if rule.same_as in seen:
            raise ValueError(f"grid.SAME_AS: a cycle through {rule.same_as!r}")
        name = rule.same_as
        seen.add(name)
        why.append(f"{rule.correction} = {rule.same_as}: {rule.why}")
