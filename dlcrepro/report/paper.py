"""The paper's numbers, the one home of each: the tables, the figures, the findings and the batch-size
scan read them here, as numbers; formats.py prints them (the paper's values' text).

Every number comes from the public summary of the paper (2 November 2026, CITATION.cff). The paper
does not say which model F3–F7 and F10 refer to, so those stand beside every model's cell; where it
names one, `model` says which. A number the paper does not give but that a rule needs is derived
from its words where it is used (findings.FINDINGS, `derived`), from the numbers here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Multiple:
    """A noise-floor multiple M the paper reports for one (sampler, correction) cell."""

    value: float  # M, "13" for 13x
    finding: str  # the finding that reports it, "F3"
    bound: float | None = None  # the paper's headline is a bound on M ("<=2x"), `value` one model's number
    model: str = ""  # the model `value` is for, where the paper names one

    @property
    def point(self) -> float:
        """M where the paper states it for every model; NaN where its headline is a bound."""
        return float("nan") if self.bound is not None else self.value


# M by (sampler, correction). The paper's PPO is read as several SGD steps per batch
# (findings.PAPER_PPO, `ppo_multi`); with one, `ppo` is pg's copy.
MULTIPLE: dict[tuple[str, str], Multiple] = {
    ("fp8", "pg"): Multiple(13.0, "F3"),
    ("stale", "center"): Multiple(32.0, "F5"),
    ("stale", "is_center"): Multiple(2.1, "F6"),
    ("stale", "ppo_multi"): Multiple(699.0, "F7"),
    ("stale", "dlc"): Multiple(1.9, "F8", bound=2.0, model="0.6B"),
    ("stale", "is"): Multiple(115.0, "F10"),
    ("stale", "is_resync"): Multiple(2.6, "F10"),
}

# Accuracy (a share, held-out test accuracy of Qwen3) by (sampler, correction), and the finding.
ACCURACY: dict[tuple[str, str], tuple[float, str]] = {
    ("fp8", "center"): (0.465, "F4"),
    ("stale", "center"): (0.122, "F5"),
    ("stale", "is_center"): (0.320, "F6"),
}

# F2, Qwen3-1.7B, stale: the empirical lag ESS crosses 1/2 at this step, its Gaussian prediction
# exp(−Var λ) at the next; IS leaves the noise floor at the first.
F2_MODEL, F2_SAMPLER = "1.7B", "stale"
F2_ESS_CROSSING = 11
F2_GAUSSIAN_CROSSING = 14
F2_IS_LEAVES_FLOOR = 11

# F9, Qwen3-1.7B, stale/dlc: the steps of its resyncs (once per run).
F9_MODEL, F9_CELL = "1.7B", ("stale", "dlc")
F9_RESYNC_STEPS = (20, 35, 36)

# F11: the off-support share at collapse (about), its largest before collapse, and its largest with
# resync through the last step.
F11_AT_COLLAPSE = 0.90
F11_BEFORE_AT_MOST = 0.14
F11_WITH_RESYNC_AT_MOST = 0.11
F11_THROUGH_STEP = 40

# F13: Spearman ρ with the accuracy drop, of the off-support share and of the noise-floor multiple.
F13_RHO = {"off_support": 0.80, "noise_floor_multiple": 0.74}
