"""The sequential design the findings are judged under: seeds added in batches, a look after each,
every look's interval paid for by Bonferroni over the planned looks.

A study starts with `first` seeds (the tiny study's 0–5), looks at the findings, and may add `batch`
seeds at a time to the cells an undecided finding reads, up to `cap` seeds: looks at 6, 9, …, 24
seeds by default, 7 in all. A finding is judged at every look, so a 95 % interval at each would call
a finding with no effect "seen" at some look far more often than 2.5 % of the time. Bonferroni over
the planned looks keeps the whole procedure's error at the single interval's: each look's interval
is at level 1 − 0.05/looks (99.29 % over 7 looks), so P(any look wrongly seen) ≤ 7 · 0.05/7/2 =
2.5 % one-sided, however the looks are correlated. `simulate` checks it and states the power
(tests/test_sequential.py; docs/method.md#the-sequential-design). Pocock's or O'Brien–Fleming's
boundaries would spend less at the end; Bonferroni needs no joint distribution of the looks (the
t-statistics of a growing sample with an estimated spread) and never errs on the wrong side.
Torch- and pandas-free.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ERROR = 0.05  # two-sided over the whole procedure: 2.5 % on each side


@dataclass(frozen=True)
class Design:
    """Looks at `first`, `first + batch`, … seeds up to `cap`; each look's interval at `level`."""

    first: int = 6
    batch: int = 3
    cap: int = 24

    def __post_init__(self):
        if not (1 <= self.first <= self.cap and self.batch >= 1):
            raise ValueError(f"a sequential design needs 1 <= first <= cap and batch >= 1; got first={self.first}, "
                             f"batch={self.batch}, cap={self.cap} (config key decide)")

    @property
    def looks(self) -> tuple[int, ...]:
        """The seed counts at which the findings are judged: first, first + batch, …, cap (the cap a
        look of its own where the batches do not reach it exactly)."""
        n = list(range(self.first, self.cap + 1, self.batch))
        return tuple(n if n[-1] == self.cap else n + [self.cap])

    @property
    def level(self) -> float:
        """Each look's two-sided interval level: 1 − ERROR / looks."""
        return 1 - ERROR / len(self.looks)

    def text(self) -> str:
        """"looks at 6, 9, …, 24 seeds (7), each interval at 99.29 %"."""
        looks = self.looks
        shown = ", ".join(map(str, looks)) if len(looks) <= 4 else f"{looks[0]}, {looks[1]}, …, {looks[-1]}"
        return f"looks at {shown} seeds ({len(looks)}), each interval at {100 * self.level:.2f} %"


DESIGN = Design()  # the rules' design: every verdict's interval is at DESIGN.level


def simulate(design: Design, effect: float, sims: int = 20_000, seed: int = 0) -> dict:
    """The whole procedure on simulated seeds: values normal with mean `effect` and sd 1, a claim
    "above 0" judged at each look by the t-interval at design.level (seen: the interval above 0;
    contradicted: below); a finding stops at its first decision. Returns the probability of seen and
    of contradicted by the cap, the probability of each by every look, and the expected seeds used."""
    from .intervals import t_interval

    rng = np.random.default_rng(seed)
    x = rng.normal(effect, 1.0, (sims, design.cap))
    open_ = np.ones(sims, bool)
    seen, contra = np.zeros(sims, bool), np.zeros(sims, bool)
    used = np.full(sims, design.cap, float)
    by_look = []
    for n in design.looks:
        _, low, high, _, _ = t_interval(x[:, :n], design.level)
        s, c = open_ & (low > 0), open_ & (high < 0)
        seen |= s
        contra |= c
        used[s | c] = n
        open_ &= ~(s | c)
        by_look.append({"seeds": n, "seen": float(seen.mean()), "contradicted": float(contra.mean())})
    return {"seen": float(seen.mean()), "contradicted": float(contra.mean()), "by_look": by_look,
            "expected_seeds": float(used.mean()), "sims": sims}


def per_look_error(design: Design) -> float:
    """The one-sided error each look spends: ERROR / 2 / looks."""
    return ERROR / 2 / len(design.looks)


def bonferroni_bound(design: Design) -> float:
    """The one-sided error of the whole procedure, at most: ERROR / 2."""
    return per_look_error(design) * len(design.looks)

