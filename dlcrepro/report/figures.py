"""The paper's figures, each as .pdf and .png, from the collected per-step and per-run tables.

Each figure reads without the README and at a page's width: a caption of two lines, what is plotted
(in which unit) and then what a line averages (a line is the mean over the runs that finished, a thin
line each seed; where many runs are pooled, a band is the 95 % t-interval of the mean over runs, as
the tables give it: intervals.t_interval); a model's four panels in two rows of two; one legend beside
the panels, never over the data, names every line, reference line and mark; the rest is in
docs/results.md (READING). A run that diverged ends in a cross at its last step and stays out of the
means and of the axis limits, as does a run off the scale (off_scale_runs: a triangle on the top
edge); where the paper reports a value for what a panel shows, it is marked there, beside the data;
a cell that is a copy of another (`computed_as`, dlcrepro/grid.py) is drawn with hollow markers over
the run it equals and named as such in the legend; and a correction keeps one colour, line style and
marker in every figure (`correction_styles`: a family of corrections shares a hue, its members differ
in line style and marker). Each figure function, registered under its figure's name by `@draws`
(`FIGURES`), returns its `Figure`; `write_all` saves those outputs.FIGURES lists (docs/extending.md,
"Adding a figure").
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import matplotlib
import matplotlib.patches

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from . import analysis as A  # noqa: E402
from . import formats as F  # noqa: E402
from . import outputs  # noqa: E402
from . import paper as P  # noqa: E402
from .intervals import t_interval  # noqa: E402
from ..core.grid import SAMPLERS, lagged_samplers  # noqa: E402
from ..core.registry import CORRECTION_INFO  # noqa: E402
from ..core.util import atomic_save  # noqa: E402

LAGGED = lagged_samplers()

# ----------------------------------------------------------------------------- styles

# One hue per family (registry.CorrectionInfo.family), in the registry's order of first appearance;
# colour-blind-safe first, no grey (the reference lines are grey).
FAMILY_COLOURS = ("#0072B2", "#009E73", "#E69F00", "#D62728", "#9467BD", "#8C564B", "#E377C2", "#17BECF", "#BCBD22")
# a family's members, in registry order: solid, dashed, dotted, dash-dot, ... and a marker each
MEMBER_LINESTYLES = ("-", (0, (5, 2)), (0, (1, 1.2)), (0, (6, 2, 1, 2)), (0, (3, 1, 1, 1, 1, 1)), (0, (8, 3)))
MEMBER_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
SAMPLER_COLOURS = {name: s.colour for name, s in SAMPLERS.items()}
REFERENCE_LINE = dict(color="0.35", lw=0.9, zorder=1)  # grey: no correction is drawn in grey
PAPER_COLOUR = "#C00000"  # the paper's values, wherever a panel shows what it reports
# F2 (Qwen3-1.7B, stale): the empirical lag ESS crosses 1/2 at step 11, its Gaussian prediction at 14
PAPER_ESS_CROSSINGS = ((P.F2_ESS_CROSSING, "-"), (P.F2_GAUSSIAN_CROSSING, "--"))
PAPER_ESS_LABELS = ((f"paper: ESS < 1/2 at step {P.F2_ESS_CROSSING} (F2)", "-"),
                    (f"paper: Gaussian predicts {P.F2_GAUSSIAN_CROSSING} (F2)", "--"))
# the paper's noise-floor multiples by cell (paper.MULTIPLE)
PAPER_M = {cell: m.value for cell, m in P.MULTIPLE.items()}


@dataclass(frozen=True)
class Style:
    """How a correction is drawn in every figure."""

    family: str
    color: str
    linestyle: object
    marker: str

    def line(self, copy: bool = False) -> dict:
        """`ax.plot` keywords; a copied cell is its markers alone, hollow and larger, drawn over the
        run it equals, whose line and markers show through them."""
        if copy:
            return dict(color=self.color, ls="none", marker=self.marker, ms=7.0, mfc="none", mew=1.3, zorder=3)
        return dict(color=self.color, ls=self.linestyle, marker=self.marker, lw=1.4, ms=4.0, mew=1.2, zorder=2)


def correction_styles(names=()) -> dict[str, Style]:
    """A Style for every registered correction and every name in `names`: a family shares a colour,
    its members differ in line style and marker. A name outside the registry is a family of its own.
    The registry alone fixes a correction's style, so it is the same in every figure and grid."""
    families: dict[str, list[str]] = {}
    for name, info in CORRECTION_INFO.items():
        families.setdefault(info.family or name, []).append(name)
    for name in sorted(set(names) - set(CORRECTION_INFO)):
        families.setdefault(name, []).append(name)
    out = {}
    for i, (family, members) in enumerate(families.items()):
        for j, name in enumerate(members):
            out[name] = Style(family, FAMILY_COLOURS[i % len(FAMILY_COLOURS)], MEMBER_LINESTYLES[j % len(MEMBER_LINESTYLES)],
                              MEMBER_MARKERS[j % len(MEMBER_MARKERS)])
    return out


def in_legend_order(corrections, styles: dict[str, Style]) -> list[str]:
    """`corrections` grouped by family, in the order `correction_styles` gave them."""
    rank = {n: i for i, n in enumerate(styles)}
    return sorted(corrections, key=lambda n: rank.get(n, len(rank)))


def sampler_order(names) -> list[str]:
    return [s for s in SAMPLERS if s in set(names)] + sorted(set(names) - set(SAMPLERS))


# ----------------------------------------------------------------------------- what the data says


def copies(runs: pd.DataFrame | None) -> pd.DataFrame:
    """The copied runs: RUN and `source`, the correction whose run each is. A copy's `computed_as` is
    its source's cell directory, <correction>/<seed dir> in the grid's layout (celldir.same_run)."""
    if runs is None or "computed_as" not in runs:
        return pd.DataFrame(columns=A.RUN + ["source"])
    c = runs.loc[runs["computed_as"].fillna("") != "", A.RUN + ["computed_as"]].copy()
    c["source"] = [Path(p).parent.name for p in c["computed_as"]]
    return c.drop(columns="computed_as")


def copy_labels(runs: pd.DataFrame | None, samplers) -> dict[str, str]:
    """Per copied correction, what its legend entry adds: " (= pg)" where it is a copy under every one
    of `samplers` it ran under, " (= is_center under bf16, fp8)" where under some only."""
    c = copies(runs)
    out = {}
    for corr, g in c.loc[c["sampler"].isin(samplers)].groupby("correction"):
        ran = set(runs.loc[(runs["correction"] == corr) & runs["sampler"].isin(samplers), "sampler"])
        parts = []
        for src, gs in g.groupby("source"):
            where = sampler_order(gs["sampler"].unique())
            parts.append(f"= {src}" + ("" if set(where) == ran else f" under {', '.join(where)}"))
        out[corr] = f" ({'; '.join(parts)})"
    return out


def is_copy(runs: pd.DataFrame | None, model: str, sampler: str, correction: str) -> bool:
    """Whether the cell's runs are copies of another cell's (then drawn with hollow markers)."""
    c = copies(runs)
    return bool(((c["model"] == model) & (c["sampler"] == sampler) & (c["correction"] == correction)).any())


def seed_count(d: pd.DataFrame, by=A.CELL) -> str:
    """How many seeds each line averages: "3 seeds", or "1–3 seeds" where cells differ."""
    n = d.groupby(list(by))["seed"].nunique()
    lo, hi = (int(n.min()), int(n.max())) if len(n) else (0, 0)
    return f"{lo} seed{'s' if lo != 1 else ''}" if lo == hi else f"{lo}–{hi} seeds"


# Where each line and mark of the figures is explained in full; a figure's caption is two lines (what
# is plotted; then how), its marks are named in its legend, and the rest is there.
READING = "docs/results.md#reading-the-figures"
# The marks a legend names where its figure draws them (grey: the mark, not a correction).
MARK_COLOUR = "0.25"
DIVERGED_MARK = ("× a diverged run's last step", dict(ls="none", marker="x", ms=7, mew=1.6, color=MARK_COLOUR))
# a run that diverged before its first value of a panel (_unmeasured_divergences)
UNMEASURED_MARK = ("× on the x axis: diverged before a value", DIVERGED_MARK[1])
COPY_MARK = ("hollow: a copy, over its source", dict(ls="none", marker="o", ms=7, mfc="none", mew=1.3, color=MARK_COLOUR))
OFF_SCALE_MARK = ("▲ at the top: a run off the scale", dict(ls="none", marker="^", ms=6, color=MARK_COLOUR))
# A run whose largest value is more than this many times the panel's median run's largest is off the
# scale: a blown-up run (10^6 nats/token) would otherwise squash every other run into the bottom decade.
OFF_SCALE = 1000.0


def diverged_set(runs: pd.DataFrame | None) -> frozenset:
    """The runs (model, sampler, correction, seed) that diverged (`diverged_at_step` in the runs table)."""
    if runs is None or "diverged_at_step" not in runs:
        return frozenset()
    d = runs.loc[runs["diverged_at_step"].notna(), A.RUN]
    return frozenset(map(tuple, d.itertuples(index=False)))


def diverged_in(runs: pd.DataFrame | None, shown: pd.DataFrame) -> bool:
    """Whether a run of `shown`'s samplers and corrections diverged."""
    return any(r[1] in set(shown["sampler"]) and r[2] in set(shown["correction"]) for r in diverged_set(runs))


def over_seeds(d: pd.DataFrame, by=A.CELL, runs: pd.DataFrame | None = None, shown: pd.DataFrame | None = None) -> str:
    """The caption's phrase for what a line and its thin lines are, and "no run diverged" where no run
    of the figure's samplers and corrections (those of `shown`, default `d`) did (else the legend
    names the marks: `marks`)."""
    n = d.groupby(list(by))["seed"].nunique()
    what = (f"thick line: mean of the finished runs ({seed_count(d, by)} per cell), thin lines: each seed"
            if len(n) and n.max() > 1 else f"{seed_count(d, by)} per cell")
    return what + ("" if diverged_in(runs, d if shown is None else shown) else "; no run diverged")


def marks(runs: pd.DataFrame | None, shown: pd.DataFrame, copied: bool = False, unmeasured: bool = True,
          off_scale: bool = False) -> list[tuple[str, dict]]:
    """The legend entries for the marks a figure draws: a diverged run's cross (and, where its panels
    mark them, the cross on the x axis of a run that diverged before its first value), a copy's
    hollow markers, the triangle of a run off the scale."""
    out = [DIVERGED_MARK, *([UNMEASURED_MARK] if unmeasured else [])] if diverged_in(runs, shown) else []
    return out + ([COPY_MARK] if copied else []) + ([OFF_SCALE_MARK] if off_scale else [])


# ----------------------------------------------------------------------------- drawing


def _save(fig, out: Path, name: str) -> None:
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    for ext in ("pdf", "png"):
        atomic_save(out / f"{name}.{ext}", lambda tmp, e=ext: fig.savefig(tmp, format=e, dpi=130, bbox_inches="tight"))
    plt.close(fig)


def _absent(name: str, why: str, what: str = "not in this grid") -> Figure:
    """The figure `name` as a note, where the grid lacks the cells it draws or its runs the values."""
    fig, ax = plt.subplots(figsize=(5.5, 1.6))
    ax.axis("off")
    ax.text(0.5, 0.5, f"{name}: {what}\n({why})", ha="center", va="center")
    return fig


def _grid(n_rows: int, n_cols: int, w=4.2, h=3.2, **kw):
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(w * n_cols, h * n_rows), squeeze=False, **kw)
    return fig, axes


def _panels(n_rows: int, n_cols: int, **kw):
    """A grid of panels laid out with room for a title above and a legend beside them."""
    return _grid(n_rows, n_cols, layout="constrained", **kw)


def _wrapped(n_models: int, n_panels: int, n_cols: int = 2, **kw):
    """Each model's `n_panels` panels in rows of `n_cols`, so that four panels read at a page's width
    (2 × 2, not a 1 × 4 strip): the figure, its grid of axes, and per model its panels in order; a
    grid cell left over is hidden."""
    cols = min(n_cols, n_panels)
    rows = -(-n_panels // cols)
    fig, axes = _panels(n_models * rows, cols, **kw)
    per_model = [[axes[i * rows + k // cols, k % cols] for k in range(n_panels)] for i in range(n_models)]
    for k in range(n_panels, rows * cols):
        for i in range(n_models):
            axes[i * rows + k // cols, k % cols].set_visible(False)
            # the panel above is the column's last: its step labels show
            axes[i * rows + k // cols - 1, k % cols].xaxis.set_tick_params(labelbottom=True)
    return fig, axes, per_model


def off_scale_runs(d: pd.DataFrame, y: str) -> frozenset:
    """The runs of `d` (one panel) whose largest `y` exceeds OFF_SCALE times the median over its runs
    of their largest (runs whose largest is 0, e.g. λ of a synced sampler, left out of the median)."""
    if not set(A.RUN) <= set(d) or d[y].notna().sum() == 0:
        return frozenset()
    top = d.groupby(A.RUN)[y].max().abs()
    positive = top.loc[top > 0]
    if positive.empty:
        return frozenset()
    return frozenset(top.index[top > OFF_SCALE * positive.median()])


def _mark_off_scale(ax, d: pd.DataFrame, y: str, off: frozenset, colour_of) -> None:
    """A triangle on the panel's top edge where each run of `off` first leaves the axis (call it
    once the panel's y limits are set), in the run's colour (`colour_of(run)`)."""
    top = ax.get_ylim()[1]
    edge = ax.get_xaxis_transform()  # x in steps, y in the axes' own 0..1
    for run, r in d.loc[d[y] > top].groupby(A.RUN):
        if run in off:
            ax.add_artist(Line2D([r["step"].min()], [1.0], transform=edge, ls="none", marker="^", ms=6, color=colour_of(run),
                                 clip_on=False, zorder=5))


def _tidy(axes, shared_y: bool) -> None:
    """Whole steps on every x axis; with a shared y axis, its label once per row."""
    for row in axes:
        for j, ax in enumerate(row):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if shared_y and j:
                ax.set_ylabel("")


def _mean_band(ax, d: pd.DataFrame, y: str, line: dict, x: str = "step", band: str | bool = "seeds",
               diverged: frozenset = frozenset(), off_scale: frozenset = frozenset()) -> None:
    """The mean of `y` per `x` over the runs in `d` that finished, and around it either each of those
    runs as a thin line (band "seeds", True) or the 95 % t-interval of the mean over runs at each x
    (band "interval": intervals.t_interval); a run in `diverged` is drawn thin, ends in a cross and
    moves neither the mean nor the axis limits; a run in `off_scale` (off_scale_runs) is drawn thin
    and moves neither either (its triangle: _mark_off_scale)."""
    d = d.loc[d[y].notna()]
    key = pd.Series(list(map(tuple, d[A.RUN].itertuples(index=False))), index=d.index) if set(A.RUN) <= set(d) else None
    gone = key.isin(diverged) if key is not None and diverged else pd.Series(False, index=d.index)
    off = key.isin(off_scale) & ~gone if key is not None and off_scale else pd.Series(False, index=d.index)
    finished = d.loc[~gone & ~off]
    mean = finished.groupby(x)[y].mean()
    thin = dict(color=line["color"], lw=0.6, alpha=0.4, zorder=1)
    if not mean.empty:
        ax.plot(mean.index, mean.to_numpy(), **line)
        per_run = finished.pivot_table(index=x, columns=A.RUN if key is not None else "seed", values=y)
        if band in ("seeds", True) and per_run.shape[1] > 1:
            for col in per_run:
                r = per_run[col].dropna()
                ax.plot(r.index, r.to_numpy(), **thin)
        elif band == "interval" and per_run.shape[1] > 1:
            values = per_run.to_numpy(float)
            _, lo, hi, _, _ = t_interval(values, axis=1)  # (x,): over the runs at each x
            if np.nanmin(values) >= 0:  # a measure that is never negative: the band drawn from 0 up
                lo = np.maximum(lo, 0.0)
            ax.fill_between(per_run.index, lo, hi, color=line["color"], alpha=0.15, lw=0, zorder=1)
    for _, r in d.loc[off].groupby(A.RUN):
        r = r.sort_values(x)
        ax.add_artist(Line2D(r[x].to_numpy(), r[y].to_numpy(), **thin))  # outside the limits, clipped at the edge
    for _, r in d.loc[gone].groupby(A.RUN):
        # add_artist, not plot: a line added so never enters the data limits the axes scale to
        r = r.sort_values(x)
        ax.add_artist(Line2D(r[x].to_numpy(), r[y].to_numpy(), **thin))
        ax.add_artist(Line2D(r[x].to_numpy()[-1:], r[y].to_numpy()[-1:], ls="none", marker="x", ms=7, mew=1.6,
                             color=line["color"], zorder=4))


def _correction_lines(ax, d: pd.DataFrame, y: str, styles: dict[str, Style], runs, band: bool = True,
                      panel: tuple[str, str] | None = None, off_scale: frozenset = frozenset(), **extra) -> None:
    """Every correction of one panel (`d`: one model and sampler), copies drawn last, over their source;
    with `panel` (model, sampler), also the panel's diverged runs that have no value of `y` at all; the
    runs in `off_scale` out of the means and the limits (mark them with _mark_off_scale)."""
    cells = d.groupby(A.CELL, sort=False)
    flagged = [(key, is_copy(runs, *key)) for key in cells.groups]
    diverged = diverged_set(runs)
    for (model, sampler, corr), copied in sorted(flagged, key=lambda kc: kc[1]):
        # a copy's thin lines are its source's: drawn once
        _mean_band(ax, cells.get_group((model, sampler, corr)), y, {**styles[corr].line(copied), **extra},
                   band="seeds" if band and not copied else False, diverged=diverged, off_scale=off_scale)
    if panel is not None:
        _unmeasured_divergences(ax, d, y, styles, runs, panel)


def _unmeasured_divergences(ax, d: pd.DataFrame, y: str, styles: dict[str, Style], runs, panel: tuple[str, str]) -> None:
    """A run that diverged before its first value of `y` (accuracy is measured every eval_every steps;
    a run can diverge before the first) would vanish from the panel: it gets its cross at the step
    it diverged, on the panel's bottom edge, where no value is implied."""
    if runs is None or "diverged_at_step" not in runs:
        return
    seen = set(map(tuple, d.loc[d[y].notna(), A.RUN].itertuples(index=False)))
    gone = runs.loc[runs["diverged_at_step"].notna() & (runs["model"] == panel[0]) & (runs["sampler"] == panel[1])]
    edge = ax.get_xaxis_transform()  # x in steps, y in the axes' own 0..1
    for r in gone.itertuples(index=False):
        if (r.model, r.sampler, r.correction, r.seed) in seen or r.correction not in styles:
            continue
        ax.add_artist(Line2D([r.diverged_at_step], [0.0], transform=edge, ls="none", marker="x", ms=7, mew=1.6,
                             color=styles[r.correction].color, clip_on=False, zorder=4))
        ax.dataLim.update_from_data_x(np.array([r.diverged_at_step], float), ignore=False)  # its step inside the x range


def _reference(ax, y: float, label: str, ls) -> None:
    ax.axhline(y, ls=ls, label=label, **REFERENCE_LINE)


def _legend(fig, corrections, styles: dict[str, Style], notes: dict[str, str] | None = None, refs=(), title="correction",
            extra=()) -> None:
    """One legend beside the panels: the corrections by family (the family's name above its members),
    a copied correction named with the run it equals, then `extra` entries and the reference lines.
    Where they are more than fit beside the panels, in columns that never split a family."""
    notes = notes or {}
    blocks, family = [], None  # [(handle, label)] per family, then one for the other entries
    for c in in_legend_order(corrections, styles):
        s = styles[c]
        if s.family != family:
            blocks.append([(_HEADER, f"{s.family}:")] if s.family != c else [])
        family = s.family
        blocks[-1].append((Line2D([], [], **{k: v for k, v in s.line().items() if k != "zorder"}), f"{c}{notes.get(c, '')}"))
    blocks.append([(Line2D([], [], **kw), label) for label, kw in list(extra) + list(refs)])
    # entries of 8 pt text (~0.2 in each) that fit beside the panels, below the title's lines and the
    # legend's own title: a taller legend is centred on the figure and its title rises into the caption
    title_lines = len(fig.get_suptitle().splitlines())
    rows = max(6, int((fig.get_figheight() - 0.2 * title_lines - 0.3) * 5) - 1, *map(len, blocks))
    columns = [[]]
    for b in filter(None, blocks):
        if columns[-1] and len(columns[-1]) + len(b) > rows:
            columns.append([])
        columns[-1].extend(b)
    height = max(map(len, columns))
    entries = [e for col in columns for e in col + [(_HEADER, "")] * (height - len(col))]  # a legend fills column by column
    if any(label for _, label in entries):
        leg = fig.legend(*zip(*entries), title=title, loc="outside right center", frameon=False, fontsize=8, title_fontsize=9,
                         handlelength=3.2, ncols=len(columns))  # handles long enough to tell line styles apart
        for text, (h, _) in zip(leg.get_texts(), entries):
            if h is _HEADER:
                text.set_fontweight("bold")


_HEADER = Line2D([], [], ls="none")  # a legend entry without a line: a family's name, or a blank


def _title(fig, what: str, how: str) -> None:
    """Above the panels: what is plotted; then how (seeds, bands, copies), each wrapped to the panels' width."""
    width = max(60, int(fig.get_figwidth() * 13))  # characters of 10 pt text across the panels
    fig.suptitle("\n".join(textwrap.fill(line, width) for line in (what, how)), fontsize=10)


def _panel_samplers(d: pd.DataFrame) -> list[str]:
    return sampler_order(d["sampler"].unique())


PAPER_ZONE = 0.7  # the strip right of the data where the paper's values stand, as a share of the steps drawn
LABEL_GAP_PT = 10.5  # between the centres of two labels of 7-pt text (a box ~9.5 pt tall)


def _paper_zone(axes_by_sampler: dict[str, object], corrections: dict[str, set[str]], last_step: float) -> None:
    """The paper's M for each panel's cells (`axes_by_sampler`: sampler -> its panel) in a shaded strip
    right of the data, where no line runs: a hollow diamond at each value, its label to its right,
    labels of nearby values (1.9, 2.1, 2.6) spread apart, a thin leader to any moved; the step ticks
    stop at the last step. Call it once the panels' y limits are final (a log axis) and after _tidy;
    the diamonds enter the limits first."""
    x0, x_mark = last_step + 0.02 * last_step, last_step + 0.045 * last_step
    placed = {}
    for s, ax in axes_by_sampler.items():
        values = sorted((m, c) for (ps, c), m in PAPER_M.items() if ps == s and c in corrections.get(s, set()))
        for m, _ in values:
            ax.plot([x_mark], [m], ls="none", marker="D", ms=6, mfc="none", mew=1.4, color=PAPER_COLOUR, zorder=4)
        placed[s] = values
    for s, ax in axes_by_sampler.items():
        ax.set_xlim(right=last_step + PAPER_ZONE * last_step)
        ax.set_xticks([t for t in MaxNLocator(nbins=5, integer=True).tick_values(0, last_step) if 0 <= t <= last_step])
        ax.axvspan(x0, ax.get_xlim()[1], color="0.95", lw=0, zorder=0)
        if not placed[s]:
            continue
        lo, hi = np.log10(ax.get_ylim())
        height_pt = ax.get_position().height * ax.figure.get_figheight() * 72 * 0.8  # the layout shrinks it: by ~15 % here
        gap = LABEL_GAP_PT / max(height_pt, 1.0)
        want = [(np.log10(m) - lo) / (hi - lo) for m, _ in placed[s]]
        at = []
        for w in want:  # upwards, each at least a gap above the one below
            at.append(max(w, at[-1] + gap) if at else w)
        for k in range(len(at) - 1, -1, -1):  # and below the top, pushing the ones below down
            at[k] = min(at[k], (at[k + 1] - gap) if k + 1 < len(at) else 0.97)
        for (m, c), w, a in zip(placed[s], want, at):
            moved = abs(a - w) > 1e-6
            leader = dict(arrowstyle="-", lw=0.5, color=PAPER_COLOUR, shrinkA=0, shrinkB=3) if moved else None
            label = ax.annotate(f"{c} {m:g}×", (x_mark, m), xytext=(x_mark + 0.065 * last_step, a),
                                textcoords=ax.get_xaxis_transform(), fontsize=6.5, ha="left", va="center", color=PAPER_COLOUR,
                                arrowprops=leader)
            label.set_in_layout(False)  # the strip holds it: the layout need not make room, which would move the panels


def _ref_handle(ls) -> dict:
    return dict(ls=ls, color=REFERENCE_LINE["color"], lw=REFERENCE_LINE["lw"])


# ----------------------------------------------------------------------------- the figures

# Figure name (outputs.FIGURES) -> the function that draws it, filled by `@draws`.
FIGURES: dict[str, Callable[..., Figure]] = {}


def draws(name: str):
    """Register `fn` as the function that draws the figure `name`, which outputs.FIGURES must list
    (its caption and what it reads): `fn(steps, runs)`, or `fn(findings)` for one that reads the
    findings table."""

    def register(fn):
        if name in FIGURES:
            raise ValueError(f"figure {name!r} registered twice")
        if name not in {o.name for o in outputs.FIGURES}:
            raise ValueError(f"figure {name!r} has no entry in outputs.FIGURES (its caption and what it reads)")
        FIGURES[name] = fn
        return fn

    return register


def _sampler_means(steps: pd.DataFrame, runs: pd.DataFrame | None, cols, title: str, symlog: dict[str, float]) -> Figure:
    """A panel per model and column `cols` [(column, axis label)]: a line per sampler, its mean over
    the sampler's distinct finished runs with the 95 % t-interval of that mean (a column in `symlog`
    linear below its threshold, log above: a synced sampler's 0 beside a lagged one's tens)."""
    d = A.distinct_runs(steps, runs) if runs is not None else steps
    models, samplers = sorted(d["model"].unique()), _panel_samplers(d)
    fig, axes = _panels(len(models), len(cols))
    any_off = False
    for i, m in enumerate(models):
        for j, (col, label) in enumerate(cols):
            ax, dm = axes[i, j], d.loc[d["model"] == m]
            off = off_scale_runs(dm, col)  # a run blown up to 10^6 nats/token would set the axis
            any_off |= bool(off)
            for s in samplers:
                _mean_band(ax, dm.loc[dm["sampler"] == s], col, dict(color=SAMPLER_COLOURS.get(s, "k"), lw=1.4),
                           band="interval", diverged=diverged_set(runs), off_scale=off)
            ax.set(title=f"{m}: {label.split(' (')[0].removeprefix('mean ')}", xlabel="step", ylabel=label)
            if col in symlog:
                ax.set_yscale("symlog", linthresh=symlog[col])
            _mark_off_scale(ax, dm, col, off, lambda run: SAMPLER_COLOURS.get(run[1], "k"))
    _tidy(axes, shared_y=False)
    runs_per = d.groupby(["model", "sampler"])[["correction", "seed"]].apply(lambda g: len(g.drop_duplicates()))
    n = f"{runs_per.min()}" if runs_per.min() == runs_per.max() else f"{runs_per.min()}–{runs_per.max()}"
    _title(fig, title,
           f"line: mean over a sampler's {n} distinct finished runs ({seed_count(d)} a cell), band: its 95 % t-interval"
           + ("" if diverged_in(runs, d) or any_off else "; no run diverged"))
    _legend(fig, [], {}, title="sampler", extra=[(s, dict(color=SAMPLER_COLOURS.get(s, "k"), lw=1.4)) for s in samplers]
            + marks(runs, d, unmeasured=False, off_scale=any_off))
    return fig


@draws("mismatch")
def mismatch(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> Figure:
    """|δ| and |λ| per step and sampler (mean over every distinct run of the sampler): δ flat, λ growing when lagged."""
    cols = (("discrepancy_mean_abs", "mean |discrepancy δ| (nats/token)"), ("lag_mean_abs", "mean |lag λ| (nats/token)"))
    return _sampler_means(steps, runs, cols, "Numerical discrepancy δ (engine vs trainer, same weights) and policy lag λ "
                          "(sampler's weights vs trainer's)", symlog={"lag_mean_abs": 0.01})


@draws("mismatch_split")
def mismatch_split(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> Figure:
    """The frameworks' k3 KL (verl's `k3_kl`) of the discrepancy and of the lag per step and sampler:
    the split of the number a framework logs, which none of them can make."""
    cols = (("mismatch_discrepancy_k3_kl", "k3 KL of the discrepancy (nats/token)"),
            ("mismatch_lag_k3_kl", "k3 KL of the lag (nats/token)"))
    if not {c for c, _ in cols} <= set(steps):
        return _absent("mismatch_split", "its columns came with issue #68: rerun the cells", "not in these runs")
    return _sampler_means(steps, runs, cols, "verl's k3_kl of the mismatch, split: discrepancy (engine vs trainer at θ_s) "
                          "and lag (trainer at θ_s vs θ_t)", symlog={c: 1e-6 for c, _ in cols})  # a bf16 engine's k3 is ~1e-5


@draws("ess")
def ess(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> Figure:
    """Lag ESS of the fresh batch (thick) and its Gaussian prediction (thin) under lagged samplers, with the 1/2 line."""
    d = steps.loc[steps["sampler"].isin(LAGGED)].assign(ess_seen=lambda x: A.lag_ess_seen(x))
    if d.empty:
        return _absent("ess", f"no run under a lagged sampler ({', '.join(LAGGED)})")
    styles = correction_styles(d["correction"].unique())
    models, samplers = sorted(d["model"].unique()), [s for s in LAGGED if s in set(d["sampler"])]
    every = max(1, d["step"].nunique() // 10)
    # two panels beside a legend of up to 16 corrections in 3 columns: wider panels than the default
    fig, axes = _panels(len(models), len(samplers), w=6.0, sharey=True)
    for i, m in enumerate(models):
        for j, s in enumerate(samplers):
            ax = axes[i, j]
            ds = d.loc[(d["model"] == m) & (d["sampler"] == s)]
            _correction_lines(ax, ds, "ess_seen", styles, runs, panel=(m, s), markevery=every)
            for corr, g in ds.groupby("correction"):
                _mean_band(ax, g, "ess_lag_gauss", dict(color=styles[corr].color, ls=styles[corr].linestyle, lw=0.7, alpha=0.6),
                           band=False, diverged=diverged_set(runs))
            _reference(ax, A.ESS_HALF, "ESS 1/2", ":")
            if s == P.F2_SAMPLER:  # F2, Qwen3-1.7B: the empirical ESS crosses 1/2 at step 11, the Gaussian at 14
                for step, ls in PAPER_ESS_CROSSINGS:
                    ax.axvline(step, ls=ls, color=PAPER_COLOUR, lw=1.0, zorder=1)
            ax.set(title=f"{m} / {s}", xlabel="step", ylabel="lag ESS (normalised, no unit)", ylim=(0, 1.05))
    _tidy(axes, shared_y=True)
    notes = copy_labels(runs, samplers)
    _title(fig, "Lag ESS of each fresh batch under the lagged samplers (thick) and its Gaussian prediction "
                "exp(−Var λ) (faint)",
           over_seeds(d, runs=runs))
    _legend(fig, d["correction"].unique(), styles, notes,
            refs=[("ESS 1/2: IS weights fail below", _ref_handle(":")),
                  *[(lab, dict(ls=ls, color=PAPER_COLOUR, lw=1.0)) for lab, ls in PAPER_ESS_LABELS]],
            extra=[("thin: exp(−Var λ)", dict(color="0.2", lw=0.7, alpha=0.6)), *marks(runs, d, copied=bool(notes))])
    return fig


@draws("noise_floor")
def noise_floor(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> Figure:
    """dev/floor per step (3-step moving average), per correction and sampler, log scale; the floor at 1.
    Drawn at the probe steps only: between sparse probes the average would only repeat the last."""
    d = steps.sort_values(A.RUN + ["step"]).copy()
    d["ratio_ma"] = d.groupby(A.RUN)["dev_ratio"].transform(lambda x: x.rolling(A.LEAVE_FLOOR_WINDOW, min_periods=1).mean())
    d = d.loc[d["dev_ratio"].notna()]
    if d.empty:  # e.g. a short study from a weak model: every group's rewards equal, no update moved
        return _absent("noise_floor", "no probe step had a nonzero noise floor", what="nothing to draw")
    styles = correction_styles(d["correction"].unique())
    models, samplers = sorted(d["model"].unique()), _panel_samplers(d)
    fig, axes, panels = _wrapped(len(models), len(samplers), w=4.0, sharex=True, sharey=True)
    for i, m in enumerate(models):
        for ax, s in zip(panels[i], samplers):
            _correction_lines(ax, d.loc[(d["model"] == m) & (d["sampler"] == s)], "ratio_ma", styles, runs, panel=(m, s))
            _reference(ax, 1.0, "1× floor", ":")
            _reference(ax, A.LEAVE_FLOOR_RATIO, "2× floor", "--")
            ax.set(yscale="log", title=f"{m} / {s}", xlabel="step", ylabel="dev / floor (× floor)")
    _tidy(axes, shared_y=True)
    for model_panels in panels:  # once every panel's data is drawn: the y limits are shared
        _paper_zone(dict(zip(samplers, model_panels)), {s: set(d.loc[d["sampler"] == s, "correction"]) for s in samplers},
                    float(steps["step"].max()))
    notes = copy_labels(runs, samplers)
    _title(fig, "Deviation from on-policy training: dev / floor at the probe steps (3-step moving average, log scale)",
           over_seeds(d, runs=runs))
    _legend(fig, d["correction"].unique(), styles, notes,
            refs=[("1× floor: on-policy noise", _ref_handle(":")),
                  (f"{A.LEAVE_FLOOR_RATIO:g}× floor: left the floor", _ref_handle("--"))],
            extra=[("◇ shaded: the paper's M for the cell", dict(ls="none", marker="D", mfc="none", color=PAPER_COLOUR, ms=6)),
                   *marks(runs, d, copied=bool(notes))])
    return fig


def with_start(steps: pd.DataFrame, runs: pd.DataFrame | None, columns: dict[str, str]) -> pd.DataFrame:
    """`steps`' rows with a value of any of `columns` (column -> the runs table's θ_0 column), and
    before them a step-0 row per run from the runs table: θ_0's value, which every curve starts from.
    A run with no value of its own (it diverged before its first eval) gets no step 0: its cross
    stays on the x axis at the step it diverged."""
    d = steps.loc[steps[list(columns)].notna().any(axis=1)]
    if runs is None or not set(columns.values()) & set(runs):
        return d
    measured = runs.merge(d[A.RUN].drop_duplicates(), on=A.RUN)
    start = measured[A.RUN].assign(step=0, **{c: measured.get(r) for c, r in columns.items()})
    return pd.concat([start, d], ignore_index=True)


@draws("accuracy")
def accuracy(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> Figure:
    """Test accuracy (the reported measure: train.eval_on / eval_mode) at eval steps from θ_0's (step 0) on,
    per correction and sampler, every panel over the same steps."""
    d = with_start(steps, runs, {"test_accuracy": "initial_test_accuracy"})
    if d.empty:
        return _absent("accuracy", "no run reached an eval step", what="nothing to draw")
    # every correction of the grid, also one whose runs all diverged before the first eval
    styles = correction_styles(steps["correction"].unique())
    models, samplers = sorted(d["model"].unique()), _panel_samplers(d)
    measure, name = A.eval_measure(steps, runs), A.accuracy_names(steps, runs)
    fig, axes, panels = _wrapped(len(models), len(samplers), w=4.0, sharex=True, sharey=True)
    for i, m in enumerate(models):
        for ax, s in zip(panels[i], samplers):
            _correction_lines(ax, d.loc[(d["model"] == m) & (d["sampler"] == s)], "test_accuracy", styles, runs, panel=(m, s))
            ax.set(title=f"{m} / {s}", xlabel="step", ylabel=f"{name}\n(share of answers correct)")
    last = float(steps["step"].max())
    axes[0, 0].set_xlim(-0.03 * last, 1.03 * last)  # shared: every panel from θ_0 to the last step, whatever its evals
    _tidy(axes, shared_y=True)
    notes = copy_labels(runs, samplers)
    # the paper's accuracies are held-out test accuracies of Qwen3: beside another measure, not drawn
    paper = [] if name.startswith("held-out") else [("the paper's (held-out): not drawn", dict(ls="none"))]
    _title(fig, f"{measure}, from θ_0 (step 0) on", over_seeds(d, runs=runs, shown=steps))
    _legend(fig, steps["correction"].unique(), styles, notes, extra=marks(runs, steps, copied=bool(notes)) + paper)
    return fig


@draws("off_support_kl")
def off_support_kl(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> Figure:
    """Off-support share (trainer side) beside kl_sampler (what a sampler-side monitor sees), lagged samplers."""
    d = steps.loc[steps["sampler"].isin(LAGGED)].copy()
    if d.empty:
        return _absent("off_support_kl", f"no run under a lagged sampler ({', '.join(LAGGED)})")
    styles = correction_styles(d["correction"].unique())
    models, samplers = sorted(d["model"].unique()), [s for s in LAGGED if s in set(d["sampler"])]
    # a row per measure, a column per sampler: the off-support shares above the KLs
    fig, axes, panels = _wrapped(len(models), 2 * len(samplers), n_cols=len(samplers), w=4.0, sharex=True)
    cols = (("off_support", "off-support share", "share of tokens with P(y|θ_0) < 1e-3"),
            ("kl_sampler", "KL(π_s ‖ π_t)", "nats/token, sampled prefixes"))
    any_off = False
    for i, m in enumerate(models):
        for j, (col, what, ylabel) in enumerate(cols):
            for k, s in enumerate(samplers):
                ax = panels[i][j * len(samplers) + k]
                ds = d.loc[(d["model"] == m) & (d["sampler"] == s)]
                off = off_scale_runs(ds, col) if col == "kl_sampler" else frozenset()  # a blown-up run's 10^8 would set the axis
                any_off |= bool(off)
                _correction_lines(ax, ds, col, styles, runs, panel=(m, s), off_scale=off)
                ax.set(title=f"{m} / {s}: {what}", xlabel="step", ylabel=ylabel)
                if col == "kl_sampler":  # 0 while synced, tens in a collapsed run: linear below 0.01, log above
                    ax.set_yscale("symlog", linthresh=0.01)
                _mark_off_scale(ax, ds, col, off, lambda run: styles[run[2]].color)
    _tidy(axes, shared_y=False)
    notes = copy_labels(runs, samplers)
    resync = {c: f"{notes.get(c, '')} · resyncs" for c in d["correction"].unique() if c in A.RESYNC_CORRECTIONS}
    _title(fig, "The invisible collapse: off-support share on the trainer's side (top), sampler-side KL (bottom)",
           over_seeds(d, runs=runs))
    _legend(fig, d["correction"].unique(), styles, {**notes, **resync},
            extra=marks(runs, d, copied=bool(notes), off_scale=any_off))
    return fig


@draws("off_support_drop")
def off_support_drop(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> Figure:
    """Off-support share vs accuracy drop over (run, eval step) pairs, a panel per sampler, with ρ over all (copied cells
    once)."""
    drops = A.accuracy_drops(steps)
    if runs is not None:
        drops = A.distinct_runs(drops, runs)
    samplers = _panel_samplers(drops) or ["—"]
    styles = correction_styles(drops["correction"].unique())
    fig, axes, panels = _wrapped(1, len(samplers), w=4.0, h=3.2, sharex=True, sharey=True)
    for ax, s in zip(panels[0], samplers):
        ds = drops.loc[drops["sampler"] == s]
        for c, g in ds.groupby("correction"):
            st = styles[c]
            ax.scatter(g["off_support"], g["drop"], color=st.color, marker=st.marker, s=22, alpha=0.8, lw=0)
        ax.axhline(0.0, ls="-", label="no drop", **REFERENCE_LINE)
        ax.set(title=s, xlabel="off-support share (of tokens)", ylabel="accuracy drop vs bf16/pg (share)")
    _tidy(axes, shared_y=True)
    copied = copy_labels(runs, samplers)
    left_out = "copied cells left out" if copied else "no copied cells"
    rho = A.spearman(drops["off_support"].to_numpy(float), drops["drop"].to_numpy(float)) if len(drops) else float("nan")
    n_runs = drops.groupby(A.RUN).ngroups if len(drops) else 0
    _title(fig, f"Off-support share against the accuracy drop from bf16/pg (same seed and step): Spearman ρ = {rho:.2f}",
           f"a point per (run, eval step): {len(drops)} from {n_runs} distinct runs, "
           f"{seed_count(drops) if len(drops) else '0 seeds'} per cell; {left_out}")
    styled = {c: Style(s.family, s.color, "none", s.marker) for c, s in styles.items()}
    _legend(fig, drops["correction"].unique(), styled, refs=[("no drop", _ref_handle("-"))])
    return fig


def accuracies(steps: pd.DataFrame, runs: pd.DataFrame | None) -> dict[str, str]:
    """What each accuracy column measures, by the runs' `train.eval_on` (the runs table's `eval_on`;
    where it does not record it: the pool where a held-out accuracy was measured beside, else the
    test set): {"accuracy_sampled": "RL-pool accuracy (sampled)", ...} (analysis.accuracy_name)."""
    recorded = set(runs["eval_on"].dropna()) if runs is not None and "eval_on" in runs else set()
    if len(recorded) == 1:
        on = recorded.pop()
    else:
        heldout = "heldout_accuracy_greedy" in steps and steps["heldout_accuracy_greedy"].notna().any()
        on = "pool" if heldout else "test"
    return {"accuracy_sampled": A.accuracy_name(on, "sampled"), "accuracy_greedy": A.accuracy_name(on, "greedy"),
            "heldout_accuracy_greedy": A.HELDOUT_GREEDY}


@draws("learning")
def learning(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> Figure:
    """Why the on-policy reference learns, per model: bf16/pg's accuracies per seed from θ_0 (step 0,
    from the runs table) on, each named by what it measures (`accuracies`); the training reward
    (5-step mean) of `pg` under each sampler; pass@1, pass@k and the mixed-group share of bf16/pg's
    batches; the gradient SNR at probe steps."""
    is_ref = (steps["sampler"] == A.REFERENCE[0]) & (steps["correction"] == A.REFERENCE[1])
    if not is_ref.any():
        return _absent("learning", "no bf16/pg run, the on-policy reference")
    models = sorted(steps["model"].unique())
    names = accuracies(steps, runs)
    fig, axes, panels = _wrapped(len(models), 4, w=4.4, h=3.4)
    measure_colours = dict(zip(names.values(), ("#0072B2", "#009E73", "#E69F00")))
    share_colours = {"pass_at_1": "#0072B2", "pass_at_k": "#009E73", "mixed_groups": "#E69F00"}
    for i, m in enumerate(models):
        acc, reward, batches, snr_ax = panels[i]
        ref = steps.loc[(steps["model"] == m) & is_ref]
        ref_runs = None if runs is None else runs.loc[(runs["model"] == m) & (runs["sampler"] == A.REFERENCE[0])
                                                       & (runs["correction"] == A.REFERENCE[1])]
        ev = with_start(ref.loc[ref["test_accuracy"].notna()], ref_runs, {c: f"initial_{c}" for c in names})
        drawn_names = []
        for col, label in names.items():
            if col not in ev or ev[col].isna().all():
                continue  # e.g. no held-out accuracy beside a test-set accuracy
            drawn_names.append(label)
            for _, g in ev.loc[ev[col].notna()].groupby("seed"):
                g = g.sort_values("step")
                acc.plot(g["step"], g[col], color=measure_colours[label], marker="o", ms=3, lw=0.9)
        acc.set(title=f"{m}: bf16/pg accuracies, a line per seed", xlabel="step", ylabel="share of answers correct")
        acc.legend([Line2D([], [], color=measure_colours[n], marker="o", ms=3, lw=0.9) for n in drawn_names], drawn_names,
                   loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False, fontsize=8)
        pg = steps.loc[(steps["model"] == m) & (steps["correction"] == "pg")].sort_values(A.RUN + ["step"]).copy()
        pg["reward_ma"] = pg.groupby(A.RUN)["reward_mean"].transform(lambda x: x.rolling(5, min_periods=1).mean())
        samplers = _panel_samplers(pg)
        for s in samplers:
            _mean_band(reward, pg.loc[pg["sampler"] == s], "reward_ma", dict(color=SAMPLER_COLOURS.get(s, "k"), lw=1.3))
        reward.set(title=f"{m}: pg training reward (5-step mean)", xlabel="step", ylabel="mean reward (±1)")
        reward.legend([Line2D([], [], color=SAMPLER_COLOURS.get(s, "k"), lw=1.3) for s in samplers], samplers, title="sampler",
                      loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False, fontsize=8, ncols=2)
        for share, c in share_colours.items():
            _mean_band(batches, ref, share, dict(color=c, lw=1.3))
        batches.set(title=f"{m}: bf16/pg batches", xlabel="step", ylabel="share of prompts", ylim=(0, 1.02))
        batches.legend([Line2D([], [], color=c, lw=1.3) for c in share_colours.values()],
                       ["pass@1", "pass@k", "mixed-reward groups"],
                       loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False, fontsize=8)
        snr = steps.loc[(steps["model"] == m) & (steps["correction"] == "pg") & steps["grad_snr"].notna()]
        for s in _panel_samplers(snr):
            _mean_band(snr_ax, snr.loc[snr["sampler"] == s], "grad_snr",
                       dict(color=SAMPLER_COLOURS.get(s, "k"), lw=1.3, marker="o", ms=3, label=f"pg / {s}"))
        _reference(snr_ax, 1.0, "SNR 1: signal = noise", ":")
        snr_ax.set(yscale="log", title=f"{m}: on-policy gradient SNR (probe steps)", xlabel="step",
                   ylabel="‖mean‖² / noise (no unit)")
        snr_ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False, fontsize=8, ncols=2)
    _tidy(axes, shared_y=False)
    ref_all = steps.loc[is_ref]
    _title(fig, "Why the on-policy reference (bf16/pg) learns: its accuracy, the training reward, its batches, "
                "its gradient's SNR",
           f"accuracy: a line per seed ({seed_count(ref_all)}); other panels: thick line the mean over seeds, "
           "thin lines each seed")
    return fig


def drawn(name: str):
    """The function that draws the figure `name` of outputs.FIGURES (`FIGURES`)."""
    if name not in FIGURES:
        raise LookupError(f"dlcrepro/report/outputs.py lists the figure {name!r}, but no function of dlcrepro/report/figures.py "
                          f'is registered to draw it (@draws("{name}"))')
    return FIGURES[name]


def write_all(steps: pd.DataFrame, out: Path, runs: pd.DataFrame | None = None, findings: pd.DataFrame | None = None) -> None:
    """Every figure outputs.FIGURES lists into `out`: those that read the runs from `steps` and
    `runs`, and, given the findings table, the one that reads it (the summary)."""
    out = Path(out)
    sns.set_theme(style="whitegrid", context="paper")
    for o in outputs.FIGURES:
        if o.reads == "runs":
            _save(drawn(o.name)(steps, runs), out, o.name)
        elif findings is not None:
            _save(drawn(o.name)(findings), out, o.name)


# ----------------------------------------------------------------------------- the summary of the findings
# Drawn from the findings table (tables.write_all's findings.csv), not from the runs: the verdicts and
# headline numbers are the table's (outputs.FIGURES lists it with reads="findings").

# seen, contradicted, undecided, cannot tell
VERDICT_COLOURS = {"✓": "#CDEBD4", "✗": "#F6D2D2", "?": "#F3E7C4", "–": "#E6E6E6"}


# A findings unit (findings.Finding.unit) -> how its numbers print in the summary figure: the number's
# format and the words after it, so that no number stands without its unit.
HEADLINE_UNITS = (
    ("x floor", lambda x: F.significant(x) + "×", ""),
    ("points", lambda x: F.fixed(x, 1, sign=True), " points"),
    ("share of", lambda x: F.pct(x, 0), " of runs"),
    ("steps", lambda x: F.fixed(x, 1, sign=True), " steps"),
    ("resyncs", F.significant, " resyncs a run"),
    ("stale mean |λ|", lambda x: F.significant(x) + "×", " (|λ|, last / first 5 steps)"),
    ("off-support share at collapse minus", lambda x: F.fixed(100 * x, 1, sign=True), " points of off-support share"),
    ("off-support share", lambda x: F.pct(x, 1), " of tokens off-support"),
    ("kl_sampler", lambda x: F.significant(x) + "×", " the healthy runs' largest KL"),
    ("ρ(", lambda x: F.significant(x, sign=True), " in ρ, off-support minus M"),
)
RANGE_UNITS = ("smallest and largest", "fewest, most")  # low and high are the extreme runs, not an interval


def _headline(row: pd.Series, label: str) -> str:
    """A replicate's headline number as text in its unit (HEADLINE_UNITS): with its interval in
    brackets ("1.21× [1.01, 1.48×]", "+2.7 [-1.2, +6.4] points"), or with the range of its runs in
    parentheses where low and high are the smallest and largest run, not an interval ("+31.4 points
    (runs +30.7 to +32.0)"); else its text (a findings table written before the numbers were recorded)."""
    v, lo, hi = (row.get(_number_column(label, k), np.nan) for k in ("value", "low", "high"))
    if pd.isna(v):
        return str(row[label])[2:]
    unit = str(row.get("unit", ""))
    fmt, suffix = next(((f, s) for start, f, s in HEADLINE_UNITS if unit.startswith(start)), (F.significant, f" ({unit})"))
    if pd.isna(lo):
        return fmt(v) + suffix
    if any(r in unit for r in RANGE_UNITS):
        return f"{fmt(v)}{suffix} (runs {fmt(lo)} to {fmt(hi)})"
    return fmt(v) + f" [{fmt(lo).rstrip('×')}, {fmt(hi)}]" + suffix


def _number_column(label: str, k: str) -> str:
    """The findings table's column of a headline number: "value" for the pooled `result`, else
    "<group> value"."""
    return k if label == "result" else f"{label} {k}"


def interval_kind(findings: pd.DataFrame) -> tuple[str, bool]:
    """What the findings table's brackets are, and whether they are the t-intervals of the current
    rules (a table with "seeds to decide") or the percentile bootstrap of the rules before them
    (at 3 seeds the seeds' smallest and largest: docs/method.md#intervals-over-seeds)."""
    from .findings_docs import DECIDE

    if "level" in findings and len(findings):
        level = 100 * float(findings["level"].iloc[0])
        return (f"[a, b]: {level:.2f} % t-interval over seeds, the sequential design's level; multiples on the log scale "
                "(F13: bootstrap over runs)", True)
    if DECIDE in findings:
        return "[a, b]: 95 % t-interval over seeds (F13: bootstrap over runs)", True
    rules = ", ".join(sorted(set(findings["rules"].astype(str)))) if "rules" in findings else "before the t-intervals"
    return f"[a, b]: percentile bootstrap over seeds (rules {rules}; at 3 seeds about the seeds' min and max)", False


def _wrapped_text(text: str, width: int) -> str:
    """`text` in lines of at most `width` characters: never cut, however long."""
    return "\n".join(textwrap.wrap(str(text), width, break_on_hyphens=False)) or str(text)


@draws("findings")
def findings(findings: pd.DataFrame) -> Figure:
    """The paper's findings against this study at a glance: per finding the paper's value, each
    replicate's headline number in its unit on a green (seen), red (contradicted), yellow (undecided)
    or grey (cannot tell) ground, the verdict; beside it the noise-floor multiples on one log axis,
    each replicate's mean and interval against the paper's value (a red diamond). Brackets are
    intervals, parentheses the range of the runs (the legend says which interval: `interval_kind`);
    no text is cut, a long one wraps."""
    from .findings_docs import category, replicate_columns, verdict_of

    reps = (["result"] if "result" in findings else []) + replicate_columns(findings)
    verdicts = list(verdict_of(findings))
    n = len(findings)
    fig = plt.figure(figsize=(15.5, 0.52 * n + 2.1), layout="constrained")
    grid, forest = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3.3, 1.2]})
    # (name, x, width in units of the grid's axis, characters a line of 8-pt text holds in it)
    cols = [("finding", 0.0, 3.6, 44), ("paper", 3.6, 2.0, 23)] + [(r, 5.6 + 2.6 * i, 2.6, 30) for i, r in enumerate(reps)]
    cols.append(("verdict", 5.6 + 2.6 * len(reps), 2.2, 25))
    width = cols[-1][1] + cols[-1][2]
    grid.set(xlim=(0, width), ylim=(n - 0.4, -1.1))
    grid.axis("off")
    for name, x, _, _ in cols:
        grid.text(x + 0.08, -0.75, {"result": "every seed"}.get(name, name), fontweight="bold", fontsize=9, va="center")
    for i, (_, r) in enumerate(findings.iterrows()):
        grid.text(0.08, i, _wrapped_text(f"{r['finding']}: {r['what']}", cols[0][3]), fontsize=8, va="center")
        grid.text(3.68, i, _wrapped_text(r["paper"], cols[1][3]), fontsize=8, va="center")
        for label, x, w, chars in cols[2:-1]:
            mark = str(r[label])[:1] if str(r[label])[:1] in VERDICT_COLOURS else "?"
            grid.add_patch(matplotlib.patches.Rectangle((x + 0.03, i - 0.45), w - 0.06, 0.9, color=VERDICT_COLOURS[mark], lw=0))
            text = "not run" if str(r[label]) == "not run" else f"{mark} {_headline(r, label)}"
            grid.text(x + 0.1, i, _wrapped_text(text, chars), fontsize=8, va="center")
        seen = category(verdicts[i]) == "seen"
        grid.text(cols[-1][1] + 0.08, i, _wrapped_text(verdicts[i], cols[-1][3]), fontsize=8, va="center",
                  fontweight="bold" if seen else "normal", color="#1B7837" if seen else "0.2")
    rows = [(i, r) for i, (_, r) in enumerate(findings.iterrows()) if str(r.get("unit", "")) == "x floor"]
    offsets = np.linspace(-0.18, 0.18, max(len(reps), 1))
    colours = ("#0072B2", "#E69F00", "#009E73", "#CC79A7")
    brackets, t_intervals = interval_kind(findings)
    bar_style = "-" if t_intervals else (0, (2, 1.5))  # dashed: not the interval the current rules compute
    open_below = []  # (y, mean, colour) of the intervals that reach 0 or below: no left end on a log axis
    for i, r in rows:
        for k, label in enumerate(reps):
            v, lo, hi = (r.get(_number_column(label, q), np.nan) for q in ("value", "low", "high"))
            if pd.notna(v) and v > 0:
                # a group of seeds beside the pooled result: its mean alone (its interval over a few seeds,
                # at the design's level, spans decades and would hide the pooled one)
                alone = reps[0] == "result" and label != "result"
                err = None if pd.isna(lo) or alone else [[v - lo if lo > 0 else 0.0], [hi - v]]
                if pd.notna(lo) and lo <= 0 and not alone:
                    open_below.append((i + offsets[k], v, colours[k % 4]))
                bars = forest.errorbar([v], [i + offsets[k]], xerr=err, fmt="o", ms=4, color=colours[k % 4], lw=1.2, capsize=2)
                for line in bars[2]:
                    line.set_linestyle(bar_style)
        if pd.notna(r.get("paper value", np.nan)):
            forest.plot([r["paper value"]], [i], ls="none", marker="D", ms=7, mfc="none", mew=1.5, color=PAPER_COLOUR)
    if not any(pd.notna(r.get(_number_column(label, "value"), np.nan)) for _, r in rows for label in reps):
        forest.set_xlim(0.5, 2000)
        forest.text(0.5, 0.5, "no headline numbers in this findings table\n(written before the rules recorded them)",
                    transform=forest.transAxes, ha="center", va="center", fontsize=9, color="0.3")
    forest.axvline(1.0, **REFERENCE_LINE, ls=":")
    forest.axvline(A.LEAVE_FLOOR_RATIO, **REFERENCE_LINE, ls="--")
    forest.set(xscale="log", ylim=(n - 0.4, -1.1), yticks=[i for i, _ in rows], yticklabels=[r["finding"] for _, r in rows],
               xlabel="noise-floor multiple M (× floor, log scale)", title="M: this study against the paper")
    left = forest.get_xlim()[0]
    for y, v, colour in open_below:  # the bar runs on to the left edge and ends in a triangle there
        forest.add_artist(Line2D([left, v], [y, y], ls=bar_style, lw=1.2, color=colour))
        forest.add_artist(Line2D([left], [y], ls="none", marker="<", ms=5, color=colour, clip_on=False))
    bar = "t-interval" if t_intervals else "percentile bootstrap (dashed)"
    handles = [Line2D([], [], ls=bar_style, marker="o", color=colours[k % 4],
                      label=f"every seed: mean and {bar}" if lab == "result" else
                      f"{lab}: mean" + ("" if reps[0] == "result" else f" and {bar}")) for k, lab in enumerate(reps)]
    handles += [Line2D([], [], ls="none", marker="D", mfc="none", color=PAPER_COLOUR, label="the paper's M"),
                Line2D([], [], **_ref_handle(":"), label="1× floor"), Line2D([], [], **_ref_handle("--"), label="2× floor")]
    notes = [Line2D([], [], ls="none", label=brackets),
             Line2D([], [], ls="none", label="(runs a to b): the smallest and the largest run, not an interval")]
    if open_below:
        notes.append(Line2D([], [], ls="none", label="◁ at the left edge of M: an interval that reaches 0 or below"))
    fig.legend(handles=notes, loc="outside lower left", frameon=False, fontsize=8, handlelength=0, handletextpad=0)
    fig.legend(handles=handles, loc="outside lower right", ncols=3, frameon=False, fontsize=8)
    rules = sorted(set(findings["rules"].astype(str))) if "rules" in findings else ["not recorded"]
    machine = sorted(set(findings["machine"].astype(str))) if "machine" in findings else ["not recorded"]
    _title(fig, "The paper's findings against this study: the number over every seed, then each group of seeds alone; green: "
                "seen, red: contradicted, yellow: undecided; the verdict pools every seed",
           f"rules of commit {', '.join(rules)}, computed on {', '.join(machine)}; the numbers, rules and margins: "
           "paper_tables/findings.md, docs/method.md#findings-and-replicates")
    return fig


# ----------------------------------------------------------------------------- the run against the committed study
# Drawn from reproduce.Reproduction (the `reproduce` rule), not from the runs: one mark per cell,
# and each finding's verdict beside the committed one where they were computed.

REPRODUCTION_COLOURS = {"equal": "#7BC47F", "differs": "#E06666", "not in the committed study": "#D9D9D9"}


def reproduction_figure(r) -> Figure:
    """Left: a mark per cell (a row per sampler/correction, a column per seed), green where every number
    equals the committed study's, red where one differs, grey where the committed study lacks it. Right,
    where computed: each finding's verdict in this run and in the committed study, red where they
    differ. The headline is the title."""
    cells = r.cells
    if not len(cells):
        return _absent("reproduce", textwrap.fill(r.headline, 70), "nothing compared")
    rows = list(dict.fromkeys(f"{c.model} {c.sampler}/{c.correction}" for c in cells.itertuples()))
    seeds = sorted(cells["seed"].unique())
    colour = {(f"{c.model} {c.sampler}/{c.correction}", c.seed): REPRODUCTION_COLOURS[c.status] for c in cells.itertuples()}
    n_find = 0 if r.verdicts is None else len(r.verdicts)
    size = (4 + 0.5 * len(seeds) + (6 if n_find else 0), 1.5 + 0.22 * max(len(rows), n_find))
    fig, axes = plt.subplots(1, 2 if n_find else 1, figsize=size,
                             squeeze=False, gridspec_kw={"width_ratios": [1, 2.2] if n_find else [1]})
    ax = axes[0][0]
    for i, row in enumerate(rows):
        for j, seed in enumerate(seeds):
            ax.add_patch(plt.Rectangle((j, i), 0.9, 0.9, color=colour.get((row, seed), "white")))
    ax.set_xlim(0, len(seeds)), ax.set_ylim(len(rows), 0)
    ax.set_xticks([j + 0.45 for j in range(len(seeds))], [f"seed {s}" for s in seeds])
    ax.set_yticks([i + 0.45 for i in range(len(rows))], rows, fontsize=7)
    ax.grid(False)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c, label=s) for s, c in REPRODUCTION_COLOURS.items()],
              loc="upper center", bbox_to_anchor=(0.5, -0.04), fontsize=7, frameon=False)
    if n_find:
        vx = axes[0][1]
        vx.axis("off")
        text = [[v["finding"], v["verdict"], v["verdict committed"]] for v in r.verdicts.to_dict("records")]
        t = vx.table(cellText=text, colLabels=["finding", "this run", "committed"], loc="upper center", cellLoc="left",
                     colWidths=[0.1, 0.45, 0.45])
        t.auto_set_font_size(False)
        t.set_fontsize(7)
        for k, v in enumerate(r.verdicts.to_dict("records"), start=1):
            if not v["same"]:
                for col in (1, 2):
                    t[k, col].set_facecolor(REPRODUCTION_COLOURS["differs"])
    fig.suptitle(r.headline, fontsize=9, wrap=True)
    return fig


def save_reproduction(r, out: Path) -> Path:
    """reproduction_figure into `out` as reproduce.{pdf,png}; the png's path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _save(reproduction_figure(r), out, outputs.REPRODUCTION.name)
    return out / f"{outputs.REPRODUCTION.name}.png"
