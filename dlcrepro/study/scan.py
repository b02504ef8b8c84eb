"""The noise-floor multiple as a function of batch size, at a fixed θ.

dev = ‖g_c − g_on‖² and floor = ‖g_on − g_on′‖²: g_c the correction's gradient on the sampler's
batch, g_on and g_on′ the on-policy `pg` gradients of two independent BF16 batches of the same
prompts at θ_t. With a batch of T response tokens, per-token gradient variance v and a bias b (what
the correction's gradient estimates minus the on-policy gradient),

    E dev = ‖b‖² + 2v/T,   E floor = 2v/T,   so   M − 1 = Σdev/Σfloor − 1 ≈ β·T,   β = ‖b‖²/(2v):

the noise shrinks as 1/T, the bias does not. `scan` measures dev and floor over a ladder of prompts
per batch with the run's own Trainer and without updating θ; `scaling_fit` fits β; `write_report`
writes the table and the figure from the raw rows, which `run_scan` saves as parquet.

What the fit assumes: (1) g_c's own noise equals g_on's (v_c = v). Otherwise E dev = ‖b‖² +
(v_c + v)/T and M − 1 = (v_c − v)/(2v) + β·T: an intercept the fit through the origin does not
have, which shows in the residuals (when v_c > v, e.g. through an IS correction's weights: positive
at the small batches, negative at the large ones). (2) T is proportional to the number of responses
(the mean response length does not depend on the batch size at a fixed θ): the noise averages
over responses, so only then does it fall as 1/T. (3) The extrapolation to the paper's batch T*
keeps this θ's β: it says what M would be for a batch of T* tokens from this model, not the
paper's model.
"""

from __future__ import annotations

import dataclasses

import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from ..core import paths
from ..core.registry import updates_per_batch
from ..report import paper as P
from ..report import formats
from ..report.formats import interval_text, number
from ..report.tables import write_table
from ..core.util import atomic_save, atomic_write_text, log

KEY = ["model", "theta", "sampler", "correction"]  # one fit per key
RAW_FILE = "scan.parquet"
PAPER_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "paper.yaml"
# The paper's mean response length in tokens: an assumption. paper.yaml records the budget
# (engine.max_tokens: 1024), not the length, and config.py refuses keys it does not know.
ASSUMED_RESPONSE_TOKENS = 300.0
BETA_UNIT = 1000  # the table shows β per 1,000 tokens


# ----------------------------------------------------------------------------- the fit (pure)


def multiple(dev_sum, floor_sum) -> np.ndarray:
    """M = Σdev / Σfloor, elementwise; NaN where Σfloor ≤ 0 (every advantage of the probes was 0)."""
    dev_sum, floor_sum = np.asarray(dev_sum, float), np.asarray(floor_sum, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(floor_sum > 0, dev_sum / floor_sum, np.nan)


def fit_slope(tokens, dev_sums, floor_sums) -> tuple[np.ndarray, np.ndarray]:
    """β̂ and the residuals of M_k − 1 = β·T_k over the rungs k (the last axis), M_k = dev_k / floor_k.

    Least squares through the origin, unweighted: β̂ = Σ_k T_k y_k / Σ_k T_k², y_k = M_k − 1;
    residuals y_k − β̂·T_k. Unweighted because weights 1/Var(M_k) would come from a handful of
    repetitions per rung (a rung whose few repetitions happen to agree would take all the weight);
    the bootstrap interval of `scaling_fit` holds whatever the weights, and the unweighted fit leans
    on the largest batches, where the bias stands furthest above the noise. A rung without a
    multiple (floor sum 0) is left out (NaN residual); β̂ is NaN when none is left. Leading axes
    are kept: a stack `(n_boot, K)` of resamples is fitted at once."""
    t = np.asarray(tokens, float)
    y = multiple(dev_sums, floor_sums) - 1.0
    ok = ~np.isnan(y)
    num = np.where(ok, t * y, 0.0).sum(-1)
    den = np.where(ok, t * t, 0.0).sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        beta = np.where(den > 0, num / den, np.nan)
    return beta, y - beta[..., None] * t


def resample_rungs(rungs: list[np.ndarray], n_boot: int, seed: int = 0) -> np.ndarray:
    """`(n_boot, K, C)`: the repetitions `(R_k, C)` of each rung k resampled with replacement,
    independently per rung, and summed. A repetition's columns (dev, floor, tokens) stay together."""
    rng = np.random.default_rng(seed)
    out = np.empty((n_boot, len(rungs), rungs[0].shape[1]))
    for k, r in enumerate(rungs):
        out[:, k] = r[rng.integers(len(r), size=(n_boot, len(r)))].sum(1)
    return out


def _interval(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """2.5 and 97.5 percentiles over the first axis (the resamples) of `(n_boot, K)`, NaNs skipped;
    NaN where no resample has a value."""
    x = np.asarray(x, float)
    lo, hi = np.full(x.shape[1:], np.nan), np.full(x.shape[1:], np.nan)
    ok = (~np.isnan(x)).any(0)
    if ok.any():
        lo[ok], hi[ok] = np.nanpercentile(x[:, ok], [2.5, 97.5], axis=0)
    return lo, hi


def scaling_fit(tokens, devs, floors, t_star: float, n_boot: int = 2000, seed: int = 0) -> dict:
    """The scaling of one (sampler, correction): rung k has one entry per repetition in `tokens[k]`
    (response tokens of the correction's batch), `devs[k]` and `floors[k]`.

    Per rung: T_k = mean tokens per batch, M_k = Σdev/Σfloor, the residual M_k − 1 − β̂·T_k. Over
    the rungs: β̂ (`fit_slope`) and the extrapolated multiple 1 + β̂·T*. 95 % intervals: percentile
    bootstrap, resampling the repetitions within each rung (T_k resampled with them) and refitting
    each resample; the interval of 1 + β·T* is 1 + [β_lo, β_hi]·T*. With few repetitions the
    percentile interval is narrower than nominal (synthetic scans of 5 rungs x 16 repetitions: β
    inside its interval in ~90 % of them)."""
    rungs = [np.column_stack([d, f, t]).astype(float) for t, d, f in zip(tokens, devs, floors)]
    reps = np.array([len(r) for r in rungs])
    sums = np.stack([r.sum(0) for r in rungs])  # (K, 3): Σdev, Σfloor, Σtokens
    t_k = sums[:, 2] / reps
    beta, resid = fit_slope(t_k, sums[:, 0], sums[:, 1])
    boot = resample_rungs(rungs, n_boot, seed)
    m_lo, m_hi = _interval(multiple(boot[..., 0], boot[..., 1]))
    b_boot, _ = fit_slope(boot[..., 2] / reps, boot[..., 0], boot[..., 1])
    b_lo, b_hi = (float(v[0]) for v in _interval(b_boot[:, None]))
    return {
        "reps": reps,
        "tokens": t_k,
        "multiple": multiple(sums[:, 0], sums[:, 1]),
        "multiple_low": m_lo,
        "multiple_high": m_hi,
        "residual": resid,
        "beta": float(beta),
        "beta_low": b_lo,
        "beta_high": b_hi,
        "t_star": float(t_star),
        "multiple_at_t_star": 1 + float(beta) * t_star,
        "multiple_at_t_star_low": 1 + b_lo * t_star,
        "multiple_at_t_star_high": 1 + b_hi * t_star,
    }


def paper_batch_tokens(response_tokens: float | None = None, config: Path = PAPER_CONFIG) -> tuple[float, str]:
    """T* = prompts × responses × mean response tokens of the paper's batch, and a sentence saying
    how it was set. Prompts and responses per prompt are `train` of configs/paper.yaml (64 × 8; the
    same when the file is absent); the mean response length is `response_tokens`, else
    ASSUMED_RESPONSE_TOKENS (300): an assumption, not a number the paper or paper.yaml gives."""
    train = (yaml.safe_load(Path(config).read_text()) or {}).get("train", {}) if Path(config).exists() else {}
    p, r = int(train.get("prompts_per_step", 64)), int(train.get("responses_per_prompt", 8))
    assumed = response_tokens is None
    length = ASSUMED_RESPONSE_TOKENS if assumed else float(response_tokens)
    t_star = p * r * length
    how = "assumed: the paper's mean response length is not known here" if assumed else "given"
    return t_star, (f"T* = {p} prompts x {r} responses x {number(length)} tokens = {t_star:,.0f} tokens "
                    f"({number(length)} tokens per response {how})")


def fit_cells(raw: pd.DataFrame, t_star: float, n_boot: int = 2000, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rungs, cells) from the raw per-repetition rows: one row per rung with T, M, its interval and
    residual; one row per KEY with β̂, its interval, the extrapolated multiple and the paper's."""
    rung_rows, cell_rows = [], []
    for key, g in raw.groupby(KEY, sort=False):
        ident = dict(zip(KEY, key))
        by = [h for _, h in g.groupby("prompts")]
        f = scaling_fit([h["tokens"].to_numpy() for h in by], [h["dev"].to_numpy() for h in by],
                        [h["floor"].to_numpy() for h in by], t_star, n_boot, seed)
        for i, h in enumerate(by):
            rung_rows.append(ident | {
                "prompts": int(h["prompts"].iloc[0]), "responses": int(h["responses"].iloc[0]), "reps": int(f["reps"][i]),
                "tokens": float(f["tokens"][i]), "multiple": float(f["multiple"][i]), "multiple_low": float(f["multiple_low"][i]),
                "multiple_high": float(f["multiple_high"][i]), "residual": float(f["residual"][i]),
            })
        cell = (ident["sampler"], ident["correction"])
        paper = formats.paper_multiple(cell)
        cell_rows.append(ident | {k: f[k] for k in ("beta", "beta_low", "beta_high", "t_star", "multiple_at_t_star",
                                                    "multiple_at_t_star_low", "multiple_at_t_star_high")}
                         | {"rungs": len(by), "n_boot": n_boot, "paper": paper,
                            "paper_value": P.MULTIPLE[cell].point if cell in P.MULTIPLE else math.nan})
    return pd.DataFrame(rung_rows), pd.DataFrame(cell_rows)


def scaling_table(rungs: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """The table: per KEY its rungs (T, M [95 % CI], residual), then a row at T* with β̂ and the
    extrapolated multiple beside the paper's. `mean`/`ci_low`/`ci_high` (csv only) are M's."""
    rows = []
    for _, c in cells.iterrows():
        ident = {k: c[k] for k in KEY}
        mine = rungs.loc[(rungs[KEY] == pd.Series(ident)).all(axis=1)]
        for _, r in mine.iterrows():
            rows.append(ident | {
                "batch": f"{r['prompts']} x {r['responses']}", "reps": r["reps"], "tokens T": round(r["tokens"]),
                "M [95 % CI]": interval_text(r["multiple"], r["multiple_low"], r["multiple_high"]),
                "residual M-1-bT": r["residual"], f"b per {BETA_UNIT} tokens [95 % CI]": "", "paper": "",
                "mean": r["multiple"], "ci_low": r["multiple_low"], "ci_high": r["multiple_high"],
            })
        rows.append(ident | {
            "batch": "T* (extrapolated)", "reps": "", "tokens T": round(c["t_star"]),
            "M [95 % CI]": interval_text(c["multiple_at_t_star"], c["multiple_at_t_star_low"], c["multiple_at_t_star_high"]),
            "residual M-1-bT": "",
            f"b per {BETA_UNIT} tokens [95 % CI]": interval_text(c["beta"] * BETA_UNIT, c["beta_low"] * BETA_UNIT,
                                                            c["beta_high"] * BETA_UNIT),
            "paper": c["paper"],
            "mean": c["multiple_at_t_star"], "ci_low": c["multiple_at_t_star_low"], "ci_high": c["multiple_at_t_star_high"],
        })
    return pd.DataFrame(rows)


def caption(t_text: str, n_boot: int) -> str:
    return (
        "Noise-floor multiple M = sum dev / sum floor against the response tokens T of the correction's batch, at a fixed "
        "policy (no update), each rung's repetitions with fresh prompts and seeds; 95 % intervals: percentile bootstrap "
        f"({n_boot} resamples) of the repetitions within each rung. Fit: M - 1 = b T, least squares through the origin, "
        "unweighted; residual = M - 1 - bT. Row T*: the extrapolation 1 + bT* to the paper's batch, "
        f"{t_text}, beside the paper's multiple (measured on its own model, not this one)."
    )


# ----------------------------------------------------------------------------- the figure


def plot_scaling(rungs: pd.DataFrame, cells: pd.DataFrame, out: Path, name: str) -> None:
    """M − 1 against tokens per batch, log–log, a panel per (model, θ, sampler), each correction in
    its figures.py style: the rungs with their 95 % intervals, the fit β̂·T (solid over the rungs,
    dashed out to T*) in its band β_lo·T … β_hi·T, the paper's multiple − 1 as a star at T*. A rung
    with M − 1 ≤ 0 (at or below the floor) is a triangle on the lower edge; band edges ≤ 0 are
    clipped there. A title says what is plotted; one legend beside the panels."""
    from ..report.figures import _legend, _panels, _ref_handle, _save, _title, correction_styles

    panels = list(cells.groupby(["model", "theta", "sampler"], sort=False))
    fig, axes = _panels(1, max(len(panels), 1), w=4.6, h=3.9)
    # a family's members by their markers: the fit is solid over the rungs and dashed beyond for all
    styles = {c: dataclasses.replace(st, linestyle="-") for c, st in correction_styles(cells["correction"].unique()).items()}
    for ax, ((model, theta, sampler), cg) in zip(axes[0], panels):
        rg = rungs.loc[(rungs["model"] == model) & (rungs["theta"] == theta) & (rungs["sampler"] == sampler)]
        t_star = float(cg["t_star"].iloc[0])
        t_min = float(rg["tokens"].min())
        positive = np.concatenate([
            (rg[["multiple", "multiple_low", "multiple_high"]].to_numpy(float) - 1).ravel(),
            (cg[["beta", "beta_low", "beta_high"]].to_numpy(float) * t_min).ravel(),
            cg["paper_value"].to_numpy(float) - 1,
        ])
        positive = positive[np.isfinite(positive) & (positive > 0)]
        edge = positive.min() / 3 if len(positive) else 1e-3
        clip = lambda v: np.maximum(np.asarray(v, float), edge)  # noqa: E731
        for i, (_, c) in enumerate(cg.iterrows()):
            st = styles[c["correction"]]
            r = rg.loc[rg["correction"] == c["correction"]]
            t, y = r["tokens"].to_numpy(float), r["multiple"].to_numpy(float) - 1
            dodge = 1 + 0.06 * (i - (len(cg) - 1) / 2)  # the corrections' points of one rung side by side, not on top
            lo, hi = r["multiple_low"].to_numpy(float) - 1, r["multiple_high"].to_numpy(float) - 1
            up = y > 0
            ax.errorbar(t[up] * dodge, y[up], yerr=[y[up] - clip(lo[up]), clip(hi[up]) - y[up]], fmt=st.marker, color=st.color,
                        ms=4, capsize=2, ls="none")
            ax.scatter(t[~up & ~np.isnan(y)] * dodge, np.full((~up & ~np.isnan(y)).sum(), edge), marker="v", color=st.color)
            if np.isfinite(c["beta"]):
                xs, xe, xa = (np.geomspace(t.min(), t.max(), 40), np.geomspace(t.max(), max(t_star, t.max()), 40),
                              np.geomspace(t.min(), max(t_star, t.max()), 80))
                if c["beta"] > 0:  # a fit at or below 0 has no line on a log axis: its band shows it
                    ax.plot(xs, c["beta"] * xs, color=st.color, lw=1.4)
                    ax.plot(xe, c["beta"] * xe, color=st.color, lw=1.0, ls="--")
                if np.isfinite(c["beta_low"]):
                    ax.fill_between(xa, clip(c["beta_low"] * xa), clip(c["beta_high"] * xa), color=st.color, alpha=0.12, lw=0)
            if np.isfinite(c["paper_value"]):
                ax.scatter([t_star], [c["paper_value"] - 1], marker="*", s=150, color=st.color, edgecolor="k", zorder=5)
                ax.annotate(f"paper {c['paper']}", (t_star, c["paper_value"] - 1), textcoords="offset points", xytext=(-6, 6),
                            ha="right", fontsize=7)
        ax.axvline(t_star, color="grey", lw=0.8, ls=":")
        ax.set(xscale="log", yscale="log", xlabel="response tokens per batch T", ylabel="M − 1",
               title=f"{model}: {sampler} at {theta}")
        ax.set_ylim(bottom=edge * 0.7)
    reps = sorted(set(rungs["reps"].astype(int))) if "reps" in rungs else []
    _title(fig, "Noise-floor multiple M − 1 against the batch's response tokens T at a fixed θ (no update); "
                "the fit M − 1 = b·T through the origin, extrapolated to the paper's batch T*",
           f"points: each rung's M over {'/'.join(map(str, reps)) or 'its'} repetitions, 95 % bootstrap interval; "
           "line: the fit over the rungs (dashed beyond), band: its 95 % interval")  # the marks: the legend, docs/results.md
    _legend(fig, list(dict.fromkeys(cells["correction"])), styles,
            extra=[("fit over the rungs", dict(color="k", lw=1.4)), ("fit extrapolated", dict(color="k", lw=1.0, ls="--")),
                   ("paper's multiple − 1", dict(ls="none", marker="*", ms=10, color="grey", mec="k")),
                   ("at or below the floor", dict(ls="none", marker="v", color="grey"))],
           refs=[("T*: the paper's batch", _ref_handle(":"))])
    _save(fig, Path(out), name)


# ----------------------------------------------------------------------------- measuring (the run's own Trainer)


def _place(tr, checkpoint: str | Path | None):
    """Put the trainer at θ_t and the run's engine at θ_s as the run stands before its next step:
    both at the model directory's weights, or the checkpoint's `policy` (θ_t) and `sampler` (θ_s; a
    sampler synced before every step takes θ_t, as the run's next step would). The probe engine
    holds θ_t. Returns the run's Cell (step, sampler_version)."""
    from ..step.train import Cell

    cell = tr.load_checkpoint(Path(checkpoint)) if checkpoint else Cell()
    if tr.sampler.always_synced:
        tr.sampler_model.load_state_dict(tr.policy.state_dict())
        cell.sampler_version = cell.step
    tr.start_engines(cell)  # as a run does on (re)start: the engine gets θ_s through its precision's transform
    tr.sync_probe(cell.step)
    return cell


def _draw_prompts(tr, n: int, seed: int) -> tuple[list[int], list[list[int]]]:
    """`n` distinct problems of the run's RL pool and their prompt ids, as Trainer.prompts_for draws them."""
    from ..step import data

    rng = np.random.default_rng(seed)
    idx = rng.choice(len(tr.rl_problems), size=n, replace=False).tolist()
    return idx, data.encode_prompts(tr.tokenizer, [tr.train_problems[i] for i in idx], tr.cfg.task.prompt)


def _repetition(tr, synced: bool, corrections: list[str], n: int, rep: int, seed: int) -> list[dict]:
    """One repetition of rung `n`: a sampler batch and two probe batches of the same fresh prompts,
    the probe gradients, and each correction's gradient on the one sampler batch (the step's
    sample → score → log-probs → probe → correction, without the update). One row per correction,
    with the step row's metrics (diagnostics.STEP_METRICS: the batch's, and the probe step's with
    that correction's direction)."""
    from ..step.diagnostics import step_metrics
    from ..core.seeds import derive_seed

    t0 = time.perf_counter()
    tag, k = f"scan/{n}", tr.tcfg.responses_per_prompt
    idx, prompts = _draw_prompts(tr, n, derive_seed(seed, rep, f"{tag}/prompts"))
    rollout = tr.engine.generate(prompts, k, derive_seed(seed, rep, f"{tag}/sample"), tr.topk)
    s = tr.score(rollout, idx)
    batch = tr.measure(rollout, s, n, synced)
    # a kept graph is freed by the first correction's backward: each correction recomputes θ_t's logits
    batch.release_sampler_distribution()
    both = tr.probe_engine.generate(prompts + prompts, k, derive_seed(seed, rep, f"{tag}/probes"), logprobs=False)
    probe_batches = [tr.score(r, idx) for r in both.split(len(prompts))]
    probes = tr.probe(probe_batches)
    base = {
        "prompts": n, "responses": k, "rep": rep, "tokens": int(s.tb.tokens.numel()),
        "probe_tokens": float(np.mean([p.tb.tokens.numel() for p in probe_batches])), **batch.metrics,
    }
    rows = []
    for c in corrections:
        with tr.correcting_as(c):
            g_c, diagnostics = tr.correction_grad(batch)
        rows.append({"correction": c, **base, **step_metrics("probe", tr.probe_terms(g_c, probes)), **diagnostics})
    sec = time.perf_counter() - t0
    return [r | {"seconds": sec} for r in rows]


def scan(cfg, model: str, sampler: str, corrections: list[str], prompts: list[int], reps: int, seed: int = 0,
         model_dir: str | Path | None = None, checkpoint: str | Path | None = None) -> pd.DataFrame:
    """dev and floor of each correction at a fixed θ over a ladder of prompts per batch (responses
    per prompt: the config's), `reps` repetitions per rung with fresh prompts and seeds
    (derive_seed(seed, rep, "scan/<prompts>/<purpose>")). One row per (rung, repetition, correction);
    the corrections of a repetition share its sampler batch and its probes (so its floor).

    θ_t: the model directory, or the checkpoint's `policy`; θ_s: the same, or for a lagged sampler
    the checkpoint's `sampler`. θ never moves: no `Learner.sgd_step`. A resync correction (dlc, is_resync) is
    measured at this θ_s without its resync (the rows' `ess_lag` says where it would have fired); a
    correction with several SGD steps per batch (`registry.updates_per_batch` > 1: ppo_multi, or ppo
    with train.updates_per_batch > 1) needs updates and is refused."""
    import torch

    from ..core.config import ConfigError
    from ..step.corrections import get_correction
    from ..core.registry import UnknownNameError
    from ..step.train import Trainer

    if model not in cfg.models:
        raise UnknownNameError(f"unknown model {model!r}; known: {sorted(cfg.models)}")
    mdir = paths.model_dir(cfg, model, model_dir)
    if not (mdir / "config.json").exists():
        raise FileNotFoundError(f"model directory {mdir} has no config.json")
    if checkpoint and not Path(checkpoint).exists():
        raise FileNotFoundError(f"checkpoint {checkpoint} does not exist")
    tcfg = cfg.train_for(model)
    fns = {c: get_correction(c) for c in corrections}
    for c, f in fns.items():
        if updates_per_batch(c, tcfg) > 1:
            raise ConfigError(f"correction {c!r} takes {updates_per_batch(c, tcfg)} SGD steps per batch (train.updates_per_batch "
                              f"or its own in the registry); the scan does not update θ")
    pool = tcfg.pool_size or cfg.task.n_train
    if max(prompts) > pool:
        raise ConfigError(f"train.pool_size={tcfg.pool_size}: a rung of {max(prompts)} prompts needs a pool of as many (e.g. "
                          "--set train.pool_size=0)")
    torch.manual_seed(seed)
    # built with a correction that reads the engine's distribution if any does, so the sampler
    # batch carries its top-k log-probs (Trainer.topk)
    tr = Trainer(cfg, model, sampler, next((c for c in corrections if fns[c].needs_q), corrections[0]), seed, mdir)
    cell = _place(tr, checkpoint)
    synced = cell.sampler_version == cell.step  # θ_s is θ_t
    ident = {"model": model, "theta": f"step {cell.step}" if checkpoint else "warm start", "sampler": sampler, "seed": seed,
             "model_dir": str(mdir), "checkpoint": str(checkpoint or ""), "step": cell.step,
             "sampler_version": cell.sampler_version}
    rows = []
    for n in prompts:
        t0 = time.perf_counter()
        for rep in range(reps):
            rows += [ident | r for r in _repetition(tr, synced, list(corrections), n, rep, seed)]
        log(f"scan {model}/{sampler} at {ident['theta']}: {n} prompts x {tcfg.responses_per_prompt}, {reps} reps, "
            f"{time.perf_counter() - t0:.1f} s")
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- I/O


def read_raw(paths: list[str | Path]) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True)


def write_report(raw: pd.DataFrame, tables_out: Path, figures_out: Path, name: str = "scaling", n_boot: int = 2000,
                 response_tokens: float | None = None, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The table (`<name>.{csv,md,tex}` and the fits' numbers in `<name>_fit.csv`) and the figure
    (`<name>.{png,pdf}`) from raw scan rows. Returns (rungs, cells)."""
    t_star, t_text = paper_batch_tokens(response_tokens)
    rungs, cells = fit_cells(raw, t_star, n_boot, seed)
    tables_out, figures_out = Path(tables_out), Path(figures_out)
    write_table(scaling_table(rungs, cells), tables_out, name, caption(t_text, n_boot))
    atomic_write_text(tables_out / f"{name}_fit.csv", cells.assign(t_star_assumption=t_text).to_csv(index=False))
    plot_scaling(rungs, cells, figures_out, name)
    return rungs, cells


def run_scan(cfg, model: str, sampler: str, corrections: list[str], prompts: list[int], reps: int, out: Path, seed: int = 0,
             model_dir=None, checkpoint=None, n_boot: int = 2000, response_tokens: float | None = None,
             name: str = "scaling") -> pd.DataFrame:
    """`scan`, then its raw rows to `<out>/scan.parquet` and its table and figure into `out`."""
    out = Path(out)
    raw = scan(cfg, model, sampler, corrections, prompts, reps, seed, model_dir, checkpoint)
    atomic_save(out / RAW_FILE, lambda tmp: raw.to_parquet(tmp, index=False))
    write_report(raw, out, out, name, n_boot, response_tokens)
    return raw
