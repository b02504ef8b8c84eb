"""When a run has diverged, in one place (docs/method.md#diverged-runs).

A run diverges when its weights blow up: an update direction or a weight turns NaN or infinite after
θ has moved, or an engine, correctly loaded, no longer computes a policy whose weights grew
BLOWUP-fold since the last version it matched. A diverged run ends at that step as a recorded
outcome (`Diverged`: `ended` names the first step without a row, and its final test accuracy counts
as 0); a non-finite metric or a non-finite direction at θ_0 is a fault (`NonFiniteError`: the run
stops with an error, its last checkpoint kept). The trainer calls the checks where a step computes
what they look at (train.Trainer.step, Trainer.push_weights); the loop (train.train_steps) and
the summary (celldir.summarize) ask `ended` and `final_test_accuracy`.
"""

from __future__ import annotations

import math

import torch

from .diagnostics import may_be_inf, may_be_nan
from ..core.util import Diverged, NonFiniteError

__all__ = ["BLOWUP", "Diverged", "NonFiniteError", "blown_up", "check_direction_finite", "check_finite",
           "check_weights_finite", "ended", "final_test_accuracy", "largest_abs_weight"]

# A sync check that fails after the weights' largest |weight| grew this many times since the engine's
# last matched version is a diverged run, not a broken load. Measured in the zoo (stale/gspo seed 0):
# from step 20 to 23 the largest |weight| moved 1.29 -> 1.386 (at most 7 % a step); step 24's update
# took it to 221.6 (160x), and the bf16 engine then gave 88.7 nats/token against the trainer.
BLOWUP = 10.0


def check_finite(step: int, row: dict) -> None:
    """Raise NonFiniteError naming the step and the column if a value is infinite (but +∞ where the
    column may overflow, `diagnostics.may_be_inf`), or NaN where the column is always defined
    (`diagnostics.may_be_nan`). Called on the step's batch metrics and
    the correction's diagnostics before the update (an overflowed ratio would turn θ into NaN), and
    on the whole row after it, before the row or a checkpoint is written: the run stops at that step,
    its last checkpoint intact. A fault, not an outcome: a diverged θ shows first in the update
    direction or the weights (check_direction_finite, check_weights_finite)."""
    for col, v in row.items():
        if isinstance(v, float) and ((math.isinf(v) and not (v > 0 and may_be_inf(col)))
                                     or (math.isnan(v) and not may_be_nan(col))):
            raise NonFiniteError(f"step {step}: {col} is {v}; the run stops here (its last checkpoint is kept)")


def check_direction_finite(step: int, g: torch.Tensor) -> None:
    """Before the update: a NaN or infinite update direction at a moved θ (step > 1) means the run
    diverged (Diverged: its outcome, recorded); at θ_0, which no update has moved, it is a fault
    (NonFiniteError: the run stops with an error)."""
    top = float(g.abs().max())
    if math.isfinite(top):
        return
    if step == 1:
        raise NonFiniteError(f"step 1: the update direction is {top} at θ_0, before any update; the run stops here")
    raise Diverged(step, f"step {step}: the update direction is {top}: the run diverged")


def largest_abs_weight(params) -> float:
    """max |w| over the weights, NaN or ∞ if any weight is: each tensor's max and min (no temporary
    of its size), then one device sync for all of them."""
    with torch.no_grad():
        return float(torch.stack([torch.maximum(p.amax(), -p.amin()).float() for p in params]).amax())


def check_weights_finite(step: int, params: list[torch.Tensor], updates: int) -> None:
    """Raise Diverged if any trained weight is NaN or infinite after the step's update
    (`largest_abs_weight`: one pass, one device sync)."""
    if not math.isfinite(largest_abs_weight(params)):
        raise Diverged(step, f"step {step}: the policy's weights are not finite after its update ({updates} SGD step(s)): "
                             "the run diverged")


def blown_up(version: int, top: float, matched: float | None, kind: str, failure: Exception) -> Diverged | None:
    """What a failed sync check of a correct load means: the run's divergence (a Diverged to raise)
    if θ_`version`'s largest |weight| `top` is BLOWUP-fold or more that of the last version the
    `kind` engine matched (`matched`); None, a fault (the failure stands), if it has not grown so
    or the engine never matched a version."""
    if matched is None or top < BLOWUP * matched:
        return None
    return Diverged(version, f"θ_{version}'s largest |weight| is {top:.4g}, {top / matched:.0f}x that of the last version the "
                             f"{kind} engine matched, and the engine no longer computes its policy "
                             f"({str(failure).split('; ')[0]}): the run diverged")


def ended(rows: list[dict]) -> int:
    """The step at which a run that diverged ended: the first step without a row."""
    return rows[-1]["step"] + 1 if rows else 1


def final_test_accuracy(accuracies, diverged_at_step: int | None) -> float:
    """A run's final test accuracy from its measured ones (in step order): the last, or 0 for a
    diverged policy (weights NaN or blown up), which counts as answering no problem."""
    if diverged_at_step:
        return 0.0
    return float(accuracies.iloc[-1]) if len(accuracies) else math.nan
