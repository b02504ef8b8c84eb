"""Intervals over seeds, and what an interval says against a margin: the one home of both.

Every interval over seeds in the tables, the findings and the figures (a cell's mean accuracy, a
paired difference by seed, a cell's noise-floor multiple M) is `t_interval`: the Student-t interval
on the per-seed values,

    mean ± t_{(1+level)/2, n−1} · sd / √n,   sd the sample standard deviation (ddof 1),

computed exactly (no resampling, so no Monte-Carlo error). At 3 seeds t_{0.975, 2} = 4.30: the
interval is wide, as 3 seeds are. Its coverage, simulated by tests/test_intervals.py
(docs/method.md#intervals-over-seeds): 95.0 % for normal values at n = 3 and n = 6, 93–94 % for a
skewness near 1 (gamma with shape 4), less for heavier skew (about 88 % for exponential values).
A percentile bootstrap over 3 seeds, which this replaced, returns the seeds' minimum and maximum
(all three resamples equal the minimum with probability 1/27 > 2.5 %): about 75 % coverage.

`side` reads an interval against a margin as the findings do (seen, contradicted, undecided),
and `seeds_needed` says how many seeds would decide it at the observed spread. How an interval
prints is formats.py's. Torch- and pandas-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95  # every interval over seeds is a 95 % one
SEEN, CONTRADICTED, UNDECIDED = "seen", "contradicted", "undecided"
MOST_SEEDS = 10_000  # seeds_needed looks no further


def t_quantile(n, level: float = LEVEL):
    """t_{(1+level)/2, n−1}, the Student-t quantile a `level` interval over n values uses (NaN for n < 2)."""
    from scipy import stats  # imported here: training jobs import the analysis and never need scipy

    n = np.asarray(n, float)
    with np.errstate(invalid="ignore"):
        q = stats.t.ppf((1 + level) / 2, np.where(n >= 2, n - 1, np.nan))
    return float(q) if q.ndim == 0 else q


def t_interval(values, level: float = LEVEL, axis: int = -1):
    """(mean, low, high, sd, n) of the Student-t `level` interval of the mean over `values` along
    `axis`, NaN values left out: mean ± t_{(1+level)/2, n−1} · sd/√n. Floats for a 1-D input, else
    arrays of the other axes' shape. low and high are NaN with fewer than 2 values (one seed tells
    no spread); an interval of equal values is the point."""
    x = np.asarray(values, float)
    n = np.sum(~np.isnan(x), axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        total = np.nansum(x, axis=axis)
        mean = np.where(n > 0, total / np.maximum(n, 1), np.nan)
        dev = x - np.expand_dims(mean, axis)
        sd = np.sqrt(np.where(n > 1, np.nansum(dev * dev, axis=axis) / np.maximum(n - 1, 1), np.nan))
        half = t_quantile(n, level) * sd / np.sqrt(n)
    out = (mean, mean - half, mean + half, sd, n)
    return tuple(float(v) if np.ndim(v) == 0 else v for v in out[:4]) + (int(n) if np.ndim(n) == 0 else n,)


def half_width(sd: float, n: int, level: float = LEVEL) -> float:
    """The t-interval's half-width t_{(1+level)/2, n−1} · sd/√n for n values of standard deviation sd."""
    return t_quantile(n, level) * sd / math.sqrt(n) if n >= 2 else math.nan


def side(low: float, high: float, lower: float = -math.inf, upper: float = math.inf) -> str:
    """An interval against the region [lower, upper] the paper's side of a rule allows: `seen` when the
    whole interval lies inside it, `contradicted` when the whole interval lies outside it (all on one
    side), `undecided` when it straddles a bound; NaN ends: undecided. Bounds are inclusive ("at or
    below 2": upper = 2)."""
    if math.isnan(low) or math.isnan(high):
        return UNDECIDED
    if lower <= low and high <= upper:
        return SEEN
    if high < lower or low > upper:
        return CONTRADICTED
    return UNDECIDED


def seeds_needed(mean: float, sd: float, bounds, level: float = LEVEL) -> int | None:
    """The fewest seeds whose t-interval, at this mean and spread sd, would no longer straddle any
    of `bounds`: the smallest n with t_{(1+level)/2, n−1} · sd/√n < min |mean − bound| (a finite
    bound only). None where no number of seeds would (the mean on a bound, no spread measured, or more
    than MOST_SEEDS)."""
    distance = min((abs(mean - b) for b in bounds if math.isfinite(b)), default=math.inf)
    if not math.isfinite(distance) or distance == 0 or not (sd == sd) or math.isnan(mean):
        return None
    if sd == 0:
        return 2
    n = np.arange(2, MOST_SEEDS + 1)
    ok = np.nonzero(t_quantile(n, level) * sd / np.sqrt(n) < distance)[0]
    return int(n[ok[0]]) if len(ok) else None


def combine(verdicts: list[str]) -> str:
    """The verdict of a rule that needs every part: contradicted where a part is, seen where every
    part is, else undecided."""
    if CONTRADICTED in verdicts:
        return CONTRADICTED
    return SEEN if verdicts and all(v == SEEN for v in verdicts) else UNDECIDED


# ----------------------------------------------------------------------------- multiplicative quantities


def log_t_interval(values, level: float = LEVEL) -> tuple[float, float, float, float, int]:
    """(geometric mean, low, high, sd of log, n): the Student-t `level` interval on the logs of
    positive `values` (NaN and values <= 0 left out), taken back by exp. For a noise-floor multiple M
    or a ratio of two cells' M: positive quantities spanning decades, whose arithmetic interval
    reaches below 0 and covers far less than it claims (docs/method.md#intervals-over-seeds). Its
    ends are always > 0; it covers the geometric mean (the median of a log-normal)."""
    x = np.asarray(values, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.where(x > 0, np.log(np.where(x > 0, x, 1.0)), np.nan)
    mean, low, high, sd, n = t_interval(logs, level)
    return math.exp(mean) if n else math.nan, math.exp(low) if low == low else math.nan, \
        math.exp(high) if high == high else math.nan, sd, n


# ----------------------------------------------------------------------------- seeds to decide

POWER = 0.80  # "seeds to decide": the seeds at which an interval decides the rule with this probability


@dataclass(frozen=True)
class Projection:
    """How many seeds would decide an undecided rule, and towards which verdict: `seeds` at the
    observed spread, `fewest`/`most` at the ends of the spread's own 95 % interval (chi-square with
    n − 1 degrees of freedom), None where more than MOST_SEEDS would be needed (or none could)."""

    towards: str
    seeds: int | None
    fewest: int | None
    most: int | None
    basis: str = ""  # where the projection is not the power calculation: how it was made

    def text(self) -> str:
        """"18 towards seen (7 to 160 over the spread's 95 % interval)"."""
        def n(x):
            return f"> {MOST_SEEDS:,}" if x is None else f"{x:,}"
        if self.basis:
            return f"{n(self.seeds)} towards {self.towards} ({self.basis})"
        return f"{n(self.seeds)} towards {self.towards} ({n(self.fewest)} to {n(self.most)} over the spread's 95 % interval)"


def seeds_for_power(distance: float, sd: float, level: float = LEVEL, power: float = POWER) -> int | None:
    """The fewest seeds n at which the t-interval at `level` excludes a bound `distance` away from the
    true mean with probability `power`, the spread being `sd`: the noncentral t's
    P(T_{n−1}(δ√n/σ) > t_{(1+level)/2, n−1}) >= power. None beyond MOST_SEEDS."""
    from scipy import stats

    if not (distance > 0 and sd == sd):
        return None
    if sd == 0:
        return 2
    n = np.arange(2, MOST_SEEDS + 1)
    p = stats.nct.sf(t_quantile(n, level), n - 1, distance * np.sqrt(n) / sd)
    ok = np.nonzero(p >= power)[0]
    return int(n[ok[0]]) if len(ok) else None


def projection(mean: float, sd: float, n: int, lower: float = -math.inf, upper: float = math.inf,
               level: float = LEVEL, power: float = POWER) -> Projection | None:
    """The seeds that would decide a rule on the region [lower, upper] (the paper's side) if the true
    mean and spread were the observed ones, with `power`: towards seen where the mean lies inside the
    region (its distance to the nearer finite bound), towards contradicted where outside (its
    distance to the bound it lies beyond); and the same at the ends of the spread's 95 % interval
    from n − 1 degrees of freedom (the true spread of 6 seeds may be 0.6–2.4 times the observed).
    None without a mean, a spread or a finite bound, or with the mean on a bound."""
    from scipy import stats

    finite = [b for b in (lower, upper) if math.isfinite(b)]
    if not finite or n < 2 or not (mean == mean and sd == sd):
        return None
    inside = lower <= mean <= upper
    distance = min(abs(mean - b) for b in finite) if inside else (lower - mean if mean < lower else mean - upper)
    if distance <= 0:
        return None
    df = n - 1
    sd_low, sd_high = sd * math.sqrt(df / stats.chi2.ppf(0.975, df)), sd * math.sqrt(df / stats.chi2.ppf(0.025, df))
    return Projection(SEEN if inside else CONTRADICTED, seeds_for_power(distance, sd, level, power),
                      seeds_for_power(distance, sd_low, level, power), seeds_for_power(distance, sd_high, level, power))
