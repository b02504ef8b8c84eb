"""Intervals over seeds cover what they claim: the Student-t interval's coverage, simulated at 3 and 6
seeds on normal and skewed values, is within 2 points of 95 %; a percentile bootstrap over 3 seeds
(what it replaced) is the seeds' min-max and covers far less. What an interval says against a margin:
seen, contradicted or undecided, the seeds that would decide it, and ends printed on their side."""

import math

import numpy as np
import pytest

from dlcrepro.report import formats
from dlcrepro.report import intervals as I

REPS = 40_000  # the simulated coverage's own standard error: sqrt(0.95 · 0.05 / 40,000) ≈ 0.11 points


def coverage(draw, true_mean: float, n: int, seed: int = 0) -> float:
    """The share of REPS simulated experiments of n seeds whose t_interval holds the true mean."""
    rng = np.random.default_rng(seed)
    _, low, high, _, _ = I.t_interval(draw(rng, (REPS, n)))
    return float(np.mean((low <= true_mean) & (true_mean <= high)))


@pytest.mark.parametrize("n", [3, 6])
def test_t_interval_covers_the_mean_of_normal_values_95_percent_of_the_time(n):
    assert abs(coverage(lambda rng, s: rng.normal(0.5, 0.1, s), 0.5, n) - 0.95) <= 0.02


@pytest.mark.parametrize("n", [3, 6])
def test_t_interval_covers_the_mean_of_skewed_values_within_two_points_of_95(n):
    """Gamma with shape 4: skewness 1, about the spread of a cell's M over seeds in the studies
    (median sd of log M over 3 seeds 0.25 in the AMX study: a log-normal with skewness 0.8)."""
    assert abs(coverage(lambda rng, s: rng.gamma(4.0, 0.5, s), 2.0, n) - 0.95) <= 0.02


def test_coverage_falls_with_heavier_skew_as_the_docs_say():
    """Exponential values (skewness 2): about 88 % at 3 seeds, the limit docs/method.md states."""
    assert 0.86 <= coverage(lambda rng, s: rng.exponential(1.0, s), 1.0, 3) <= 0.91


def test_a_percentile_bootstrap_over_three_seeds_is_their_min_max_and_covers_about_three_quarters():
    rng = np.random.default_rng(1)
    x = rng.normal(0.0, 1.0, (4000, 3))
    boots = x[np.arange(4000)[:, None, None], rng.integers(3, size=(4000, 1000, 3))].mean(-1)
    low, high = np.percentile(boots, [2.5, 97.5], axis=1)
    at_min_max = np.isclose(low, x.min(1)) & np.isclose(high, x.max(1))
    assert at_min_max.mean() >= 0.9  # all three resamples equal the minimum with probability 1/27 = 3.7 % > 2.5 %
    assert 0.70 <= np.mean((low <= 0) & (0 <= high)) <= 0.80


def test_t_interval_by_hand_and_with_too_few_values():
    mean, low, high, sd, n = I.t_interval([1.0, 2.0, 3.0, math.nan])
    assert (mean, sd, n) == (2.0, 1.0, 3)
    assert high - mean == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6) and mean - low == pytest.approx(high - mean)
    one = I.t_interval([5.0, math.nan])
    assert one[0] == 5.0 and math.isnan(one[1]) and math.isnan(one[2]) and one[4] == 1
    assert I.t_interval([0.3, 0.3, 0.3])[1:3] == (0.3, 0.3)


def test_the_issues_f4_example_its_t_interval_reaches_both_margins():
    """F4, seeds 0-2 of the committed study: paired differences −18.2, +2.7, −0.6 points (accuracy.csv's
    per-seed finals, 3 digits); the t-interval the issue computed, [−33.3, +22.5], within rounding."""
    diff = np.array([0.408 - 0.59, 0.568 - 0.541, 0.582 - 0.588]) * 100
    _, low, high, _, _ = I.t_interval(diff)
    assert low == pytest.approx(-33.3, abs=0.3) and high == pytest.approx(22.5, abs=0.3)
    assert I.side(low, high, -10, 10) == I.UNDECIDED


def test_side_seen_contradicted_undecided():
    assert I.side(1.2, 1.9, upper=2.0) == I.SEEN
    assert I.side(1.2, 2.0, upper=2.0) == I.SEEN  # "at or below 2": the bound is inclusive
    assert I.side(2.1, 3.0, upper=2.0) == I.CONTRADICTED
    assert I.side(1.2, 2.005, upper=2.0) == I.UNDECIDED
    assert I.side(-5.0, 5.0, -10, 10) == I.SEEN and I.side(11.0, 30.0, -10, 10) == I.CONTRADICTED
    assert I.side(math.nan, 1.0, upper=2.0) == I.UNDECIDED


def test_seeds_needed_is_the_first_n_whose_half_width_is_below_the_distance():
    # mean 1.5, sd 0.5, bound 2: distance 0.5; t_{n-1}·0.5/√n < 0.5 first at n = 7 (2.447/√7 = 0.925 < 1)
    assert I.seeds_needed(1.5, 0.5, [2.0]) == 7
    assert I.half_width(0.5, 6) >= 0.5 > I.half_width(0.5, 7)
    assert I.seeds_needed(2.0, 0.5, [2.0]) is None  # a mean on the bound: no number of seeds decides
    assert I.seeds_needed(0.0, 0.5, [-10.0, 10.0, math.inf]) == 2
    assert I.seeds_needed(1.0, math.nan, [2.0]) is None


def test_combine_needs_every_part():
    assert I.combine([I.SEEN, I.SEEN]) == I.SEEN
    assert I.combine([I.SEEN, I.UNDECIDED]) == I.UNDECIDED
    assert I.combine([I.UNDECIDED, I.CONTRADICTED]) == I.CONTRADICTED


def test_ends_print_on_their_side_of_the_margin():
    assert formats.apart(2.005, [2.0]) == "2.005"
    assert formats.apart(1.9951, [1.996]) == "1.995"  # below 1.996 at 4 digits
    assert formats.apart(1.9959, [1.996]) == "1.9959"  # "2" at 3 digits (the other side), "1.996" at 4 (on it)
    assert formats.apart(0.719, [2.0]) == "0.719"
    assert formats.apart(-9.996, [-10.0, 10.0]) == "-9.996"
    assert formats.apart(math.nan, [2.0]) == "n/a"


def test_one_formatter_prints_every_value_to_three_significant_digits():
    assert [formats.number(x) for x in (0.020631, 7.912, 0.0, 11.0, 1.234e-4)] == ["0.0206", "7.91", "0", "11", "1.23e-04"]
    assert formats.number(0.7951, 2) == "0.8" and formats.number(12) == "12" and formats.number("none") == "none"
    assert formats.number(None) == formats.number(float("nan")) == "n/a"


def test_an_interval_prints_its_ends_on_their_side_of_the_margins():
    assert formats.interval_text(1.21, 0.719, 2.005, (1.0, 2.0), "x") == "1.21x [0.719, 2.005]"
    assert formats.interval_text(1.21, 0.719, 2.005) == "1.21 [0.719, 2]"
    assert formats.interval_text(float("nan"), 0.1, 0.2) == "n/a"


# ----------------------------------------------------------------------------- multiples on the log scale

LOG_SPREADS = (0.27, 1.0, 2.3, 5.2)  # sd of log M: the median cell, and the cells F6 and F7 read (issue #66)


@pytest.mark.parametrize("sd", LOG_SPREADS)
def test_the_log_interval_covers_the_geometric_mean_at_every_spread_the_cells_have(sd):
    """Log-normal M over 6 seeds: the t-interval on log M holds the geometric mean 95 % of the time
    at each spread; the arithmetic interval of M covers its mean 94 / 82 / 45 / 2 % of the time
    (docs/method.md#intervals-over-seeds)."""
    rng = np.random.default_rng(3)
    logs = rng.normal(0.0, sd, (REPS, 6))
    _, low, high, _, _ = I.log_t_interval(np.exp(logs).reshape(-1, 6)[0])  # the function itself, one row
    assert 0 < low < high
    _, lo, hi, _, _ = I.t_interval(logs)
    assert abs(np.mean((lo <= 0) & (0 <= hi)) - 0.95) <= 0.01
    m = math.exp(sd * sd / 2)
    _, alo, ahi, _, _ = I.t_interval(np.exp(logs))
    arithmetic = np.mean((alo <= m) & (m <= ahi))
    assert arithmetic == pytest.approx({0.27: 0.94, 1.0: 0.82, 2.3: 0.45, 5.2: 0.02}[sd], abs=0.02)


def test_the_log_interval_covers_at_least_90_percent_on_the_committed_cells_own_shapes():
    """The study's own per-run M of the cells the findings read (stale center, is_center, ppo_multi,
    dlc, is; fp8 pg), each taken as the population and 6 seeds drawn from it: the log interval holds
    the population's mean log M at least 80 % of the time, at the design's level and at 95 % (measured
    on the committed AMX study with the decide run's seeds: 82-98 % and 82-92 %; the lowest are
    stale/ppo_multi, whose 12 runs diverge by step 5-37 with M over 1-2 probe steps, and stale/dlc's six
    values at 95 %). A resample of a handful of values has ties the t-interval does not expect."""
    from conftest import ROOT

    from dlcrepro.report import analysis as A
    from dlcrepro.report.sequential import DESIGN
    from dlcrepro.report.tables import read_findings_input

    steps, runs = read_findings_input(ROOT / "paper_tables")
    runs = runs.drop(columns=["machine", "replicates", "design"], errors="ignore")
    runs = runs.assign(computed_as=runs["computed_as"].fillna(""))
    pr = A.per_run(steps.assign(dev_ratio=steps["dev"] / steps["floor"]), runs)
    rng = np.random.default_rng(0)
    cells = [("stale", "center"), ("stale", "is_center"), ("stale", PAPER_PPO), ("stale", "dlc"), ("fp8", "pg"), ("stale", "is")]
    for sampler, correction in cells:
        cell = (sampler, correction)
        m = pr.loc[(pr["sampler"] == sampler) & (pr["correction"] == correction), "noise_floor_multiple"]
        logs = np.log(m.to_numpy(float))
        for level, at_least in ((DESIGN.level, 0.80), (0.95, 0.80)):
            _, lo, hi, _, _ = I.t_interval(rng.choice(logs, (REPS, 6)), level)
            assert np.mean((lo <= logs.mean()) & (logs.mean() <= hi)) >= at_least, (cell, level)


PAPER_PPO = "ppo_multi"


def test_a_projection_is_the_power_calculation_towards_the_side_the_mean_lies_on():
    from scipy import stats

    # mean 1.5, sd 0.5, bound 2 above: towards seen; at the returned n the noncentral t reaches 80 %
    p = I.projection(1.5, 0.5, 6, upper=2.0)
    n = p.seeds
    power = lambda k: stats.nct.sf(I.t_quantile(k), k - 1, 0.5 * math.sqrt(k) / 0.5)  # noqa: E731
    assert p.towards == I.SEEN and power(n) >= 0.8 > power(n - 1)
    assert p.fewest < n < p.most  # the spread's own 95 % interval from 5 degrees of freedom
    # the same mean past the bound: towards contradicted
    assert I.projection(2.5, 0.5, 6, upper=2.0).towards == I.CONTRADICTED
    # an equivalence region: towards seen by the nearer bound
    assert I.projection(0.5, 1.0, 6, -10.0, 2.0).seeds == I.seeds_for_power(1.5, 1.0)
    assert I.projection(2.0, 0.5, 6, upper=2.0) is None  # on the bound: no number of seeds
