"""The paper's figures, each as .pdf and .png, from the collected per-step and per-run tables.

Each figure reads without the README: its title says what is plotted and over how many seeds
(a line is the mean over seeds, its band their range); one legend beside the panels, never over
the data, names every line and every reference line; a cell that is a copy of another
(`computed_as`, dlcrepro/grid.py) is drawn with hollow markers over the run it equals and named as
such in the legend; and a correction keeps one colour, line style and marker in every figure
(`correction_styles`: a family of corrections shares a hue, its members differ in line style and
marker). Each figure function returns its `Figure`; `write_all` saves those outputs.FIGURES lists
(docs/extending.md, "Adding a figure").
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from . import analysis as A  # noqa: E402
from . import outputs  # noqa: E402
from .grid import SAMPLERS  # noqa: E402
from .registry import CORRECTION_INFO  # noqa: E402
from .util import atomic_save  # noqa: E402

LAGGED = ("stale", "fp8_stale")

# ----------------------------------------------------------------------------- styles

# One hue per family (registry.CorrectionInfo.family), in the registry's order of first appearance;
# colour-blind-safe first, no grey (the reference lines are grey).
FAMILY_COLOURS = ("#0072B2", "#009E73", "#E69F00", "#D62728", "#9467BD", "#8C564B", "#E377C2", "#17BECF", "#BCBD22")
# a family's members, in registry order: solid, dashed, dotted, dash-dot, ... and a marker each
MEMBER_LINESTYLES = ("-", (0, (5, 2)), (0, (1, 1.2)), (0, (6, 2, 1, 2)), (0, (3, 1, 1, 1, 1, 1)), (0, (8, 3)))
MEMBER_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
SAMPLER_COLOURS = dict(zip(SAMPLERS, ("#0072B2", "#56B4E9", "#D55E00", "#CC79A7")))
REFERENCE_LINE = dict(color="0.35", lw=0.9, zorder=1)  # grey: no correction is drawn in grey


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


def over_seeds(d: pd.DataFrame, by=A.CELL) -> str:
    """The caption's phrase for what a line and its band are."""
    n = d.groupby(list(by))["seed"].nunique()
    if len(n) and n.max() > 1:
        return f"line: mean over {seed_count(d, by)} per cell, band: their range"
    return f"{seed_count(d, by)} per cell, no band"


# ----------------------------------------------------------------------------- drawing


def _save(fig, out: Path, name: str) -> None:
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    for ext in ("pdf", "png"):
        atomic_save(out / f"{name}.{ext}", lambda tmp, e=ext: fig.savefig(tmp, format=e, dpi=130, bbox_inches="tight"))
    plt.close(fig)


def _absent(name: str, why: str) -> Figure:
    """The figure `name` as a note, where the grid lacks the cells it draws."""
    fig, ax = plt.subplots(figsize=(5.5, 1.6))
    ax.axis("off")
    ax.text(0.5, 0.5, f"{name}: not in this grid\n({why})", ha="center", va="center")
    return fig


def _grid(n_rows: int, n_cols: int, w=4.2, h=3.2, **kw):
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(w * n_cols, h * n_rows), squeeze=False, **kw)
    return fig, axes


def _panels(n_rows: int, n_cols: int, **kw):
    """A grid of panels laid out with room for a title above and a legend beside them."""
    return _grid(n_rows, n_cols, layout="constrained", **kw)


def _tidy(axes, shared_y: bool) -> None:
    """Whole steps on every x axis; with a shared y axis, its label once per row."""
    for row in axes:
        for j, ax in enumerate(row):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if shared_y and j:
                ax.set_ylabel("")


def _mean_band(ax, d: pd.DataFrame, y: str, line: dict, x: str = "step", band: bool = True) -> None:
    """The mean of `y` over the runs in `d` per `x`, and the range over those runs as a band."""
    g = d.loc[d[y].notna()].groupby(x)[y]
    mean = g.mean()
    if mean.empty:
        return
    ax.plot(mean.index, mean.to_numpy(), **line)
    lo, hi = g.min(), g.max()
    if band and (hi > lo).any():
        ax.fill_between(mean.index, lo.to_numpy(), hi.to_numpy(), color=line["color"], alpha=0.13, lw=0, zorder=1)


def _correction_lines(ax, d: pd.DataFrame, y: str, styles: dict[str, Style], runs, band: bool = True, **extra) -> None:
    """Every correction of one panel (`d`: one model and sampler), copies drawn last, over their source."""
    cells = d.groupby(A.CELL, sort=False)
    flagged = [(key, is_copy(runs, *key)) for key in cells.groups]
    for (model, sampler, corr), copied in sorted(flagged, key=lambda kc: kc[1]):
        # a copy's band is its source's: drawn once
        _mean_band(ax, cells.get_group((model, sampler, corr)), y, {**styles[corr].line(copied), **extra}, band=band and not copied)


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
    # entries of 8 pt text that fit beside the panels, below the title's lines
    title_lines = len(fig.get_suptitle().splitlines())
    rows = max(8, int((fig.get_figheight() - 0.2 * title_lines) * 5), *map(len, blocks))
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


COPY_NOTE = "hollow markers, no line: a copied cell (dlcrepro/grid.py), drawn over the run it equals"


def _copy_note(notes: dict[str, str]) -> str:
    return f"; {COPY_NOTE}" if notes else ""


def _ref_handle(ls) -> dict:
    return dict(ls=ls, color=REFERENCE_LINE["color"], lw=REFERENCE_LINE["lw"])


# ----------------------------------------------------------------------------- the figures


def mismatch(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> Figure:
    """|δ| and |λ| per step and sampler (mean over every distinct run of the sampler): δ flat, λ growing when lagged."""
    d = A.distinct_runs(steps, runs) if runs is not None else steps
    models, samplers = sorted(d["model"].unique()), _panel_samplers(d)
    fig, axes = _panels(len(models), 2)
    cols = (("discrepancy_mean_abs", "mean |discrepancy δ| (nats/token)"), ("lag_mean_abs", "mean |lag λ| (nats/token)"))
    for i, m in enumerate(models):
        for j, (col, label) in enumerate(cols):
            for s in samplers:
                _mean_band(axes[i, j], d.loc[(d["model"] == m) & (d["sampler"] == s)], col, dict(color=SAMPLER_COLOURS.get(s, "k"), lw=1.4))
            axes[i, j].set(title=f"{m}: {label.split(' (')[0].removeprefix('mean ')}", xlabel="step", ylabel=label)
        # λ spans 0 (synced) to ~10^7 (a diverging run's last steps): linear below 0.01, log above
        axes[i, 1].set_yscale("symlog", linthresh=0.01)
    _tidy(axes, shared_y=False)
    runs_per = d.groupby(["model", "sampler"])[["correction", "seed"]].apply(lambda g: len(g.drop_duplicates()))
    n = f"{runs_per.min()}" if runs_per.min() == runs_per.max() else f"{runs_per.min()}–{runs_per.max()}"
    _title(fig, "Numerical discrepancy δ (engine vs trainer at the same weights) and policy lag λ (sampler's weights vs trainer's)",
           f"line: mean over the {n} distinct runs of each sampler ({seed_count(d)} per correction, copied cells once), band: their range")
    _legend(fig, [], {}, title="sampler", extra=[(s, dict(color=SAMPLER_COLOURS.get(s, "k"), lw=1.4)) for s in samplers])
    return fig


def ess(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> Figure:
    """Lag ESS of the fresh batch (thick) and its Gaussian prediction (thin) under lagged samplers, with the 1/2 line."""
    d = steps.loc[steps["sampler"].isin(LAGGED)].assign(ess_seen=lambda x: A.lag_ess_seen(x))
    if d.empty:
        return _absent("ess", "no run under a lagged sampler (stale, fp8_stale)")
    styles = correction_styles(d["correction"].unique())
    models, samplers = sorted(d["model"].unique()), [s for s in LAGGED if s in set(d["sampler"])]
    every = max(1, d["step"].nunique() // 10)
    # two panels beside a legend of up to 16 corrections in 3 columns: wider panels than the default
    fig, axes = _panels(len(models), len(samplers), w=6.0, sharey=True)
    for i, m in enumerate(models):
        for j, s in enumerate(samplers):
            ax = axes[i, j]
            ds = d.loc[(d["model"] == m) & (d["sampler"] == s)]
            _correction_lines(ax, ds, "ess_seen", styles, runs, markevery=every)
            for corr, g in ds.groupby("correction"):
                _mean_band(ax, g, "ess_lag_gauss", dict(color=styles[corr].color, ls=styles[corr].linestyle, lw=0.7, alpha=0.6), band=False)
            _reference(ax, A.ESS_HALF, "ESS 1/2", ":")
            ax.set(title=f"{m} / {s}", xlabel="step", ylabel="lag ESS (normalised)", ylim=(0, 1.05))
    _tidy(axes, shared_y=True)
    notes = copy_labels(runs, samplers)
    _title(fig, "Lag ESS of each fresh batch, lagged samplers (thick, markers), and its Gaussian prediction exp(−Var λ) (thin)",
           f"{over_seeds(d)}{_copy_note(notes)}")
    _legend(fig, d["correction"].unique(), styles, notes, refs=[("ESS 1/2: IS weights fail below", _ref_handle(":"))],
            extra=[("thin: exp(−Var λ)", dict(color="0.2", lw=0.7, alpha=0.6))])
    return fig


def noise_floor(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> Figure:
    """dev/floor per step (3-step moving average), per correction and sampler, log scale; the floor at 1.
    Drawn at the probe steps only: between sparse probes the average would only repeat the last."""
    d = steps.sort_values(A.RUN + ["step"]).copy()
    d["ratio_ma"] = d.groupby(A.RUN)["dev_ratio"].transform(lambda x: x.rolling(A.LEAVE_FLOOR_WINDOW, min_periods=1).mean())
    d = d.loc[d["dev_ratio"].notna()]
    styles = correction_styles(d["correction"].unique())
    models, samplers = sorted(d["model"].unique()), _panel_samplers(d)
    fig, axes = _panels(len(models), len(samplers), sharey=True)
    for i, m in enumerate(models):
        for j, s in enumerate(samplers):
            ax = axes[i, j]
            _correction_lines(ax, d.loc[(d["model"] == m) & (d["sampler"] == s)], "ratio_ma", styles, runs)
            _reference(ax, 1.0, "1× floor", ":")
            _reference(ax, A.LEAVE_FLOOR_RATIO, "2× floor", "--")
            ax.set(yscale="log", title=f"{m} / {s}", xlabel="step", ylabel="dev / floor (3-step mean)")
    _tidy(axes, shared_y=True)
    notes = copy_labels(runs, samplers)
    _title(fig, "Deviation from on-policy training, dev / floor at the probe steps (3-step moving average, log scale)",
           f"{over_seeds(d)}{_copy_note(notes)}")
    _legend(fig, d["correction"].unique(), styles, notes,
            refs=[("1× floor: on-policy noise", _ref_handle(":")), (f"{A.LEAVE_FLOOR_RATIO:g}× floor: left the floor", _ref_handle("--"))])
    return fig


def accuracy(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> Figure:
    """Test accuracy (the reported measure: train.eval_on / eval_mode) at eval steps, per correction and sampler."""
    d = steps.loc[steps["test_accuracy"].notna()]
    styles = correction_styles(d["correction"].unique())
    models, samplers = sorted(d["model"].unique()), _panel_samplers(d)
    measure = A.eval_measure(steps, runs)
    fig, axes = _panels(len(models), len(samplers), sharey=True)
    for i, m in enumerate(models):
        for j, s in enumerate(samplers):
            ax = axes[i, j]
            _correction_lines(ax, d.loc[(d["model"] == m) & (d["sampler"] == s)], "test_accuracy", styles, runs)
            ax.set(title=f"{m} / {s}", xlabel="step", ylabel=measure.replace(" (", "\n("))
    _tidy(axes, shared_y=True)
    notes = copy_labels(runs, samplers)
    _title(fig, f"Test accuracy at the eval steps: {measure}", f"{over_seeds(d)}{_copy_note(notes)}")
    _legend(fig, d["correction"].unique(), styles, notes)
    return fig


def off_support_kl(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> Figure:
    """Off-support share (trainer side) beside kl_sampler (what a sampler-side monitor sees), lagged samplers."""
    d = steps.loc[steps["sampler"].isin(LAGGED)].copy()
    if d.empty:
        return _absent("off_support_kl", "no run under a lagged sampler (stale, fp8_stale)")
    styles = correction_styles(d["correction"].unique())
    models, samplers = sorted(d["model"].unique()), [s for s in LAGGED if s in set(d["sampler"])]
    fig, axes = _panels(len(models), 2 * len(samplers))
    cols = (("off_support", "off-support share", "share with P(y|θ_0) < 1e-3"),
            ("kl_sampler", "KL(π_s ‖ π_t)", "nats/token, sampled prefixes"))
    for i, m in enumerate(models):
        for j, (col, what, ylabel) in enumerate(cols):
            for k, s in enumerate(samplers):
                ax = axes[i, j * len(samplers) + k]
                _correction_lines(ax, d.loc[(d["model"] == m) & (d["sampler"] == s)], col, styles, runs)
                ax.set(title=f"{m} / {s}: {what}", xlabel="step", ylabel=ylabel)
                if col == "kl_sampler":  # 0 while synced, ~10^6 in a diverging run: linear below 0.01, log above
                    ax.set_yscale("symlog", linthresh=0.01)
    _tidy(axes, shared_y=False)
    notes = copy_labels(runs, samplers)
    resync = {c: f"{notes.get(c, '')} · resyncs" for c in d["correction"].unique() if c in A.RESYNC_CORRECTIONS}
    _title(fig, "The invisible collapse: trainer-side off-support share (left) beside the sampler-side KL a monitor sees (right)",
           f"{over_seeds(d)}{_copy_note(notes)}")
    _legend(fig, d["correction"].unique(), styles, {**notes, **resync})
    return fig


def off_support_drop(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> Figure:
    """Off-support share vs accuracy drop over (run, eval step) pairs, a panel per sampler, with ρ over all (copied cells once)."""
    drops = A.accuracy_drops(steps)
    if runs is not None:
        drops = A.distinct_runs(drops, runs)
    samplers = _panel_samplers(drops) or ["—"]
    styles = correction_styles(drops["correction"].unique())
    fig, axes = _panels(1, len(samplers), w=3.6, h=3.4, sharex=True, sharey=True)
    for ax, s in zip(axes[0], samplers):
        ds = drops.loc[drops["sampler"] == s]
        for c, g in ds.groupby("correction"):
            st = styles[c]
            ax.scatter(g["off_support"], g["drop"], color=st.color, marker=st.marker, s=22, alpha=0.8, lw=0)
        ax.axhline(0.0, ls="-", label="no drop", **REFERENCE_LINE)
        ax.set(title=s, xlabel="off-support share", ylabel="accuracy drop vs bf16/pg" if ax is axes[0, 0] else "")
    copied = copy_labels(runs, samplers)
    left_out = "copied cells left out: " + "; ".join(f"{c}{n}" for c, n in copied.items()) if copied else "no copied cells"
    rho = A.spearman(drops["off_support"].to_numpy(float), drops["drop"].to_numpy(float)) if len(drops) else float("nan")
    n_runs = drops.groupby(A.RUN).ngroups if len(drops) else 0
    _title(fig, f"Off-support share against accuracy drop (bf16/pg of the same seed and step minus the run's): Spearman ρ = {rho:.2f}",
           f"one point per (run, eval step): {len(drops)} pairs from {n_runs} distinct runs, "
           f"{seed_count(drops) if len(drops) else '0 seeds'} per cell; {left_out}")
    styled = {c: Style(s.family, s.color, "none", s.marker) for c, s in styles.items()}
    _legend(fig, drops["correction"].unique(), styled, refs=[("no drop", _ref_handle("-"))])
    return fig


ACCURACIES = {"accuracy_sampled": "sampled (eval set)", "accuracy_greedy": "greedy (eval set)", "heldout_accuracy_greedy": "greedy (held-out test)"}


def learning(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> Figure:
    """Why the on-policy reference learns, per model: bf16/pg's accuracies per seed from θ_0 (step 0,
    from the runs table) on; the training reward (5-step mean) of `pg` under each sampler; pass@1,
    pass@k and the mixed-group share of bf16/pg's batches; the gradient SNR at probe steps."""
    is_ref = (steps["sampler"] == A.REFERENCE[0]) & (steps["correction"] == A.REFERENCE[1])
    if not is_ref.any():
        return _absent("learning", "no bf16/pg run, the on-policy reference")
    models = sorted(steps["model"].unique())
    fig, axes = _panels(len(models), 4, w=4.0, h=3.4)
    measure_colours = dict(zip(ACCURACIES.values(), ("#0072B2", "#009E73", "#E69F00")))
    share_colours = {"pass_at_1": "#0072B2", "pass_at_k": "#009E73", "mixed_groups": "#E69F00"}
    for i, m in enumerate(models):
        ref = steps.loc[(steps["model"] == m) & is_ref]
        ev = ref.loc[ref["test_accuracy"].notna(), ["seed", "step", *ACCURACIES]]
        if runs is not None and len(ev):
            r0 = runs.loc[(runs["model"] == m) & (runs["sampler"] == A.REFERENCE[0]) & (runs["correction"] == A.REFERENCE[1])]
            start = pd.DataFrame({"seed": r0["seed"], "step": 0, **{c: r0.get(f"initial_{c}") for c in ACCURACIES}})
            ev = pd.concat([start, ev], ignore_index=True)
        ax = axes[i, 0]
        for col, label in ACCURACIES.items():
            for _, g in ev.loc[ev[col].notna()].groupby("seed"):
                g = g.sort_values("step")
                ax.plot(g["step"], g[col], color=measure_colours[label], marker="o", ms=3, lw=0.9)
        ax.set(title=f"{m}: bf16/pg accuracy, a line per seed", xlabel="step", ylabel="accuracy")
        ax.legend([Line2D([], [], color=c, marker="o", ms=3, lw=0.9) for c in measure_colours.values()], list(measure_colours),
                  loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False, fontsize=8)
        pg = steps.loc[(steps["model"] == m) & (steps["correction"] == "pg")].sort_values(A.RUN + ["step"]).copy()
        pg["reward_ma"] = pg.groupby(A.RUN)["reward_mean"].transform(lambda x: x.rolling(5, min_periods=1).mean())
        samplers = _panel_samplers(pg)
        for s in samplers:
            _mean_band(axes[i, 1], pg.loc[pg["sampler"] == s], "reward_ma", dict(color=SAMPLER_COLOURS.get(s, "k"), lw=1.3))
        axes[i, 1].set(title=f"{m}: pg training reward (5-step mean)", xlabel="step", ylabel="mean reward (±1)")
        axes[i, 1].legend([Line2D([], [], color=SAMPLER_COLOURS.get(s, "k"), lw=1.3) for s in samplers], samplers, title="sampler",
                          loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False, fontsize=8, ncols=2)
        for share, c in share_colours.items():
            _mean_band(axes[i, 2], ref, share, dict(color=c, lw=1.3))
        axes[i, 2].set(title=f"{m}: bf16/pg batches", xlabel="step", ylabel="share", ylim=(0, 1.02))
        axes[i, 2].legend([Line2D([], [], color=c, lw=1.3) for c in share_colours.values()], ["pass@1", "pass@k", "mixed-reward groups"],
                          loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False, fontsize=8)
        snr = steps.loc[(steps["model"] == m) & (steps["correction"] == "pg") & steps["grad_snr"].notna()]
        for s in _panel_samplers(snr):
            _mean_band(axes[i, 3], snr.loc[snr["sampler"] == s], "grad_snr",
                       dict(color=SAMPLER_COLOURS.get(s, "k"), lw=1.3, marker="o", ms=3, label=f"pg / {s}"))
        _reference(axes[i, 3], 1.0, "SNR 1: signal = noise", ":")
        axes[i, 3].set(yscale="log", title=f"{m}: on-policy gradient SNR (probe steps)", xlabel="step", ylabel="‖mean‖² / noise")
        axes[i, 3].legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False, fontsize=8, ncols=2)
    _tidy(axes, shared_y=False)
    ref_all = steps.loc[is_ref]
    _title(fig, "Why the on-policy reference (bf16/pg) learns: its accuracy, the training reward, its batches, its gradient's signal-to-noise",
           f"accuracy: a line per seed ({seed_count(ref_all)}); other panels: mean over seeds, band: their range (same colour: same sampler)")
    return fig


def drawn(name: str):
    """The function of this module that draws the figure `name` of outputs.FIGURES."""
    f = globals().get(name)
    if not callable(f):
        raise LookupError(f"dlcrepro/outputs.py lists the figure {name!r}, but dlcrepro/figures.py has no function {name}(steps, runs)")
    return f


def __getattr__(attr: str):
    """FIGURES: name -> drawing function of each figure outputs.FIGURES lists (the one list), in its
    order; looked up when asked, so a figure's function may stand anywhere in this module."""
    if attr == "FIGURES":
        return {o.name: drawn(o.name) for o in outputs.FIGURES}
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def write_all(steps: pd.DataFrame, out: Path, runs: pd.DataFrame | None = None) -> None:
    out = Path(out)
    sns.set_theme(style="whitegrid", context="paper")
    for o in outputs.FIGURES:
        _save(drawn(o.name)(steps, runs), out, o.name)
