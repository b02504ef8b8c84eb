"""The paper's figures, each as .pdf and .png, from the collected per-step table."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from . import analysis as A  # noqa: E402
from .util import atomic_save  # noqa: E402

LAGGED = ("stale", "fp8_stale")


def _save(fig, out: Path, name: str) -> None:
    fig.tight_layout()
    for ext in ("pdf", "png"):
        atomic_save(out / f"{name}.{ext}", lambda tmp, e=ext: fig.savefig(tmp, format=e, dpi=130, bbox_inches="tight"))
    plt.close(fig)


def _absent(out: Path, name: str, why: str) -> None:
    """The figure `name` as a note, where the grid lacks the cells it draws."""
    fig, ax = plt.subplots(figsize=(5.5, 1.6))
    ax.axis("off")
    ax.text(0.5, 0.5, f"{name}: not in this grid\n({why})", ha="center", va="center")
    _save(fig, out, name)


def _grid(n_rows: int, n_cols: int, w=4.2, h=3.2, **kw):
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(w * n_cols, h * n_rows), squeeze=False, **kw)
    return fig, axes


def _shared_legend(fig, axes, title: str) -> None:
    """One legend right of the panels instead of one inside each (a grid of 14 corrections would
    cover every panel); entries in the order they were first drawn, each once."""
    entries = {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, h)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    if entries:
        fig.legend(list(entries.values()), list(entries), title=title, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)


def mismatch(steps: pd.DataFrame, out: Path) -> None:
    """|δ| and |λ| per step and sampler (mean over every run of the sampler): δ flat, λ growing when lagged."""
    models = sorted(steps["model"].unique())
    fig, axes = _grid(len(models), 2)
    for i, m in enumerate(models):
        d = steps.loc[steps["model"] == m]
        for j, (col, label) in enumerate((("discrepancy_mean_abs", "mean |discrepancy δ| (nats/token)"), ("lag_mean_abs", "mean |lag λ| (nats/token)"))):
            sns.lineplot(data=d, x="step", y=col, hue="sampler", ax=axes[i, j], errorbar=None)
            axes[i, j].set(title=f"{m}", xlabel="step", ylabel=label)
    _save(fig, out, "mismatch")


def ess(steps: pd.DataFrame, out: Path) -> None:
    """Lag ESS of the fresh batch (solid) and its Gaussian prediction (dashed) under lagged samplers, with the 1/2 line."""
    d = steps.loc[steps["sampler"].isin(LAGGED)].assign(ess_seen=lambda x: A.lag_ess_seen(x))
    if d.empty:
        return _absent(out, "ess", "no run under a lagged sampler (stale, fp8_stale)")
    models = sorted(steps["model"].unique())
    order = sorted(d["correction"].unique())  # the same colour for a correction in every panel
    fig, axes = _grid(len(models), len(LAGGED))
    for i, m in enumerate(models):
        for j, s in enumerate(LAGGED):
            ax = axes[i, j]
            ds = d.loc[(d["model"] == m) & (d["sampler"] == s)]
            if len(ds):
                sns.lineplot(data=ds, x="step", y="ess_seen", hue="correction", hue_order=order, ax=ax, errorbar=None)
                sns.lineplot(data=ds, x="step", y="ess_lag_gauss", hue="correction", hue_order=order, ax=ax, errorbar=None,
                             linestyle="--", legend=False)
            ax.axhline(A.ESS_HALF, color="k", lw=0.8, ls=":", label="1/2")
            ax.set(title=f"{m} / {s} (dashed: exp(−Var λ))", xlabel="step", ylabel="lag ESS (normalised)", ylim=(0, 1.05))
    _shared_legend(fig, axes, "correction")
    _save(fig, out, "ess")


def noise_floor(steps: pd.DataFrame, out: Path) -> None:
    """dev/floor per step (3-step moving average), per correction and sampler, log scale; the floor at 1.
    Drawn at the probe steps only: between sparse probes the average would only repeat the last."""
    d = steps.sort_values(A.RUN + ["step"]).copy()
    d["ratio_ma"] = d.groupby(A.RUN)["dev_ratio"].transform(lambda x: x.rolling(A.LEAVE_FLOOR_WINDOW, min_periods=1).mean())
    d = d.loc[d["dev_ratio"].notna()]
    models, samplers = sorted(d["model"].unique()), [s for s in ("bf16", "fp8", "stale", "fp8_stale") if s in set(d["sampler"])]
    order = sorted(d["correction"].unique())  # the same colour for a correction in every panel
    fig, axes = _grid(len(models), len(samplers), sharey=True)
    for i, m in enumerate(models):
        for j, s in enumerate(samplers):
            ax = axes[i, j]
            sns.lineplot(data=d.loc[(d["model"] == m) & (d["sampler"] == s)], x="step", y="ratio_ma", hue="correction", hue_order=order,
                         ax=ax, errorbar=None, marker="o")
            ax.axhline(1.0, color="k", lw=0.8, ls=":", label="noise floor")
            ax.axhline(A.LEAVE_FLOOR_RATIO, color="grey", lw=0.8, ls="--", label="2x floor")
            ax.set(yscale="log", title=f"{m} / {s}", xlabel="step", ylabel="dev / floor (3-step mean)")
    _shared_legend(fig, axes, "correction")
    _save(fig, out, "noise_floor")


def accuracy(steps: pd.DataFrame, out: Path) -> None:
    """Test accuracy (the reported measure: train.eval_on / eval_mode) at eval steps, per correction and sampler (mean over seeds)."""
    d = steps.loc[steps["test_accuracy"].notna()]
    models, samplers = sorted(d["model"].unique()), [s for s in ("bf16", "fp8", "stale", "fp8_stale") if s in set(d["sampler"])]
    order = sorted(d["correction"].unique())
    fig, axes = _grid(len(models), len(samplers), sharey=True)
    for i, m in enumerate(models):
        for j, s in enumerate(samplers):
            ax = axes[i, j]
            sns.lineplot(data=d.loc[(d["model"] == m) & (d["sampler"] == s)], x="step", y="test_accuracy", hue="correction", hue_order=order,
                         ax=ax, errorbar=None, marker="o")
            ax.set(title=f"{m} / {s}", xlabel="step", ylabel="test accuracy (reported measure)")
    _shared_legend(fig, axes, "correction")
    _save(fig, out, "accuracy")


def off_support_kl(steps: pd.DataFrame, out: Path) -> None:
    """Off-support share (trainer side) beside kl_sampler (what a sampler-side monitor sees), lagged samplers."""
    d = steps.loc[steps["sampler"].isin(LAGGED)].copy()
    if d.empty:
        return _absent(out, "off_support_kl", "no run under a lagged sampler (stale, fp8_stale)")
    d["resync"] = d["correction"].isin(A.RESYNC_CORRECTIONS).map({True: "with resync", False: "without resync"})
    models = sorted(d["model"].unique())
    order = sorted(d["correction"].unique())
    fig, axes = _grid(len(models), 2)
    for i, m in enumerate(models):
        dm = d.loc[d["model"] == m]
        sns.lineplot(data=dm, x="step", y="off_support", hue="correction", hue_order=order, style="resync", ax=axes[i, 0], errorbar=None)
        axes[i, 0].set(title=f"{m}: off-support share (P(y|θ_0) < 1e-3)", xlabel="step", ylabel="share of probe tokens")
        sns.lineplot(data=dm, x="step", y="kl_sampler", hue="correction", hue_order=order, style="resync", ax=axes[i, 1], errorbar=None)
        axes[i, 1].set(title=f"{m}: KL(π_s ‖ π_t) on sampled prefixes", xlabel="step", ylabel="nats / token")
    _save(fig, out, "off_support_kl")


def off_support_drop(steps: pd.DataFrame, out: Path, runs: pd.DataFrame | None = None) -> None:
    """Off-support share vs accuracy drop over (run, eval step) pairs, with ρ (copied cells once)."""
    drops = A.accuracy_drops(steps)
    if runs is not None:
        drops = A.distinct_runs(drops, runs)
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    if len(drops):
        sns.scatterplot(data=drops, x="off_support", y="drop", hue="correction", style="sampler", ax=ax)
        rho = A.spearman(drops["off_support"].to_numpy(float), drops["drop"].to_numpy(float))
        ax.set_title(f"Spearman ρ = {rho:.2f} over {len(drops)} (run, eval step) pairs")
    ax.set(xlabel="off-support share", ylabel="accuracy drop vs bf16/pg (same seed, step)")
    _save(fig, out, "off_support_drop")


ACCURACIES = {"accuracy_sampled": "sampled (eval set)", "accuracy_greedy": "greedy (eval set)", "heldout_accuracy_greedy": "greedy (held-out test)"}


def learning(steps: pd.DataFrame, out: Path, runs: pd.DataFrame | None = None) -> None:
    """Why the on-policy reference learns, per model: bf16/pg's accuracies per seed from θ_0 (step 0,
    from the runs table) on; the training reward (5-step mean) of `pg` under each sampler; pass@1,
    pass@k and the mixed-group share of bf16/pg's batches; the gradient SNR at probe steps."""
    is_ref = (steps["sampler"] == A.REFERENCE[0]) & (steps["correction"] == A.REFERENCE[1])
    if not is_ref.any():
        return _absent(out, "learning", "no bf16/pg run, the on-policy reference")
    models = sorted(steps["model"].unique())
    fig, axes = _grid(len(models), 4)
    for i, m in enumerate(models):
        ref = steps.loc[(steps["model"] == m) & (steps["sampler"] == A.REFERENCE[0]) & (steps["correction"] == A.REFERENCE[1])]
        ev = ref.loc[ref["test_accuracy"].notna(), ["seed", "step", *ACCURACIES]]
        if runs is not None and len(ev):
            r0 = runs.loc[(runs["model"] == m) & (runs["sampler"] == A.REFERENCE[0]) & (runs["correction"] == A.REFERENCE[1])]
            start = pd.DataFrame({"seed": r0["seed"], "step": 0, **{c: r0.get(f"initial_{c}") for c in ACCURACIES}})
            ev = pd.concat([start, ev], ignore_index=True)
        long = ev.melt(id_vars=["seed", "step"], value_vars=list(ACCURACIES), var_name="measure", value_name="accuracy").dropna()
        long["measure"] = long["measure"].map(ACCURACIES)
        if len(long):
            sns.lineplot(data=long, x="step", y="accuracy", hue="measure", units="seed", estimator=None, ax=axes[i, 0], marker="o", lw=0.9)
        axes[i, 0].set(title=f"{m}: bf16/pg accuracy, one line per seed", xlabel="step", ylabel="accuracy")
        pg = steps.loc[(steps["model"] == m) & (steps["correction"] == "pg")].sort_values(A.RUN + ["step"]).copy()
        pg["reward_ma"] = pg.groupby(A.RUN)["reward_mean"].transform(lambda x: x.rolling(5, min_periods=1).mean())
        sns.lineplot(data=pg, x="step", y="reward_ma", hue="sampler", ax=axes[i, 1], errorbar=None)
        axes[i, 1].set(title=f"{m}: pg training reward (5-step mean)", xlabel="step", ylabel="mean reward (±1)")
        rates = ref.melt(id_vars=["seed", "step"], value_vars=["pass_at_1", "pass_at_k", "mixed_groups"], var_name="share", value_name="value")
        sns.lineplot(data=rates, x="step", y="value", hue="share", ax=axes[i, 2], errorbar=None)
        axes[i, 2].set(title=f"{m}: bf16/pg batches", xlabel="step", ylabel="share", ylim=(0, 1.02))
        snr = steps.loc[(steps["model"] == m) & (steps["correction"] == "pg") & steps["grad_snr"].notna()]
        if len(snr):
            sns.lineplot(data=snr, x="step", y="grad_snr", hue="sampler", ax=axes[i, 3], errorbar=None, marker="o")
        axes[i, 3].axhline(1.0, color="k", lw=0.8, ls=":")
        axes[i, 3].set(yscale="log", title=f"{m}: on-policy gradient SNR (probe steps)", xlabel="step", ylabel="‖mean‖² / noise")
    _save(fig, out, "learning")


FIGURES = {f.__name__: f for f in (mismatch, ess, noise_floor, accuracy, off_support_kl, off_support_drop, learning)}


def write_all(steps: pd.DataFrame, out: Path, runs: pd.DataFrame | None = None) -> None:
    out = Path(out)
    sns.set_theme(style="whitegrid", context="paper")
    for f in FIGURES.values():
        f(steps, out, runs) if f in (learning, off_support_drop) else f(steps, out)
