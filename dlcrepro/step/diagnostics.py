"""Per-step diagnostics (docs/method.md#per-step-diagnostics), as pure tensor functions, and the
one list of a step row's metric columns (`STEP_METRICS`, at the end). Each metric column is
defined here once."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from .countdown import REWARD_CORRECT


def ess(log_w: torch.Tensor) -> float:
    """Normalised effective sample size (Σw)² / (N Σw²) ∈ (0, 1] of weights w = exp(log_w), `(N,)`.

    Computed from log-weights shifted by their maximum: ESS is scale-free, so huge ratios do not overflow.
    """
    if log_w.numel() == 0:
        return float("nan")
    lw = log_w.double() - log_w.double().max()
    w = torch.exp(lw)
    return float(w.sum() ** 2 / (w.numel() * (w * w).sum()))


def ess_gauss(lag: torch.Tensor) -> float:
    """Gaussian prediction of the lag ESS: exp(−Var(λ)) (exact when λ is normal)."""
    return math.exp(-float(lag.double().var(unbiased=False))) if lag.numel() else float("nan")


def seq_sums(x: torch.Tensor, seq: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """`(B,)` per-sequence sums of a per-token quantity `(N,)`."""
    return torch.zeros(num_seqs, dtype=x.dtype).index_add_(0, seq, x)


def stats(name: str, x: torch.Tensor) -> dict[str, float]:
    """`<name>_mean`, `<name>_mean_abs`, `<name>_std` of a per-token quantity."""
    x = x.double()
    return {
        f"{name}_mean": float(x.mean()),
        f"{name}_mean_abs": float(x.abs().mean()),
        f"{name}_std": float(x.std(unbiased=False)),
    }


def kl_rows(logp_p: torch.Tensor, logp_q: torch.Tensor) -> torch.Tensor:
    """`(N,)` KL(p ‖ q) per row of full-vocabulary log-probs `(N, V)`."""
    return (torch.exp(logp_p) * (logp_p - logp_q)).sum(-1)


def mismatch_metrics(e: torch.Tensor, a: torch.Tensor, b: torch.Tensor, seq: torch.Tensor, num_seqs: int) -> dict[str, float]:
    """The mismatch columns of a batch from per-token e, a, b `(N,)` (notation: docs/method.md#notation).

    δ = a − e (numerical discrepancy), λ = b − a (policy lag), total b − e.
    """
    delta, lag = a - e, b - a
    out = {
        "ess_lag": ess(lag),
        "ess_lag_gauss": ess_gauss(lag),
        "ess_lag_seq": ess(seq_sums(lag.double(), seq, num_seqs)),
        "ess_total": ess(b - e),
    }
    out.update(stats("discrepancy", delta))
    out.update(stats("lag", lag))
    return out


# ----------------------------------------------------------------------------- the frameworks' names
#
# The mismatch as verl, slime and miles log it (docs/method.md#the-frameworks-mismatch-metrics), written
# here from their definitions as read in: verl `compute_offpolicy_metrics`
# (verl/trainer/ppo/rollout_corr_helper.py, verl-project/verl at 20c30bf8), slime's policy loss
# (`train_rollout_logprob_abs_diff`) and miles' `compute_approx_kl(..., "low_var_kl")`
# (miles/backends/training_utils/loss_hub/math_utils.py, radixark/miles at 067dc320).

LOG_RATIO_BOUND = 20.0  # verl's SAFETY_BOUND, miles' _LOG_RATIO_EXP_CLAMP: |log-ratio| clamped before an exp
K3_BOUND = 10.0  # miles clamps its per-token k3 (low_var_kl) to [-10, 10]

# Every key field_metrics returns: verl's compute_offpolicy_metrics keys, then slime's and miles'.
FIELD_METRICS = ("training_ppl", "training_log_ppl", "kl", "k3_kl", "rollout_ppl", "rollout_log_ppl", "log_ppl_diff",
                 "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio", "chi2_token", "chi2_seq",
                 "train_rollout_logprob_abs_diff", "train_rollout_kl")

# The three applications of field_metrics a step logs: (part, the "trainer" side, the "engine" side)
# in the notation of docs/method.md#notation. `total` is what the frameworks log (engine against the
# trainer at θ_t); `discrepancy` (a against e) and `lag` (b against a) are its two parts.
MISMATCH_PARTS = (("total", "b", "e"), ("discrepancy", "a", "e"), ("lag", "b", "a"))


def mismatch_column(part: str, key: str) -> str:
    """The step row's column of a framework metric `key` of a mismatch part: `mismatch_<part>_<key>`."""
    return f"mismatch_{part}_{key}"


def seq_means(x: torch.Tensor, seq: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """Per-sequence means `(B',)` of a per-token quantity `(N,)`, over the B' sequences that have tokens."""
    n = torch.bincount(seq, minlength=num_seqs)
    return seq_sums(x, seq, num_seqs)[n > 0] / n[n > 0]


def field_metrics(trainer_logp: torch.Tensor, engine_logp: torch.Tensor, seq: torch.Tensor, num_seqs: int) -> dict[str, float]:
    """The mismatch under the frameworks' own names and definitions (`FIELD_METRICS`), from per-token
    log-probs `(N,)` of the same tokens under the trainer and the engine, each token's sequence `seq`
    `(N,)` in 0 … num_seqs − 1. With δ = trainer − engine per token:

    verl (token means over the batch's tokens, or per sequence first, then the mean over sequences):
    `kl` = mean(−δ), the k1 estimate of KL(q ‖ π), may be < 0; `k3_kl` = mean(e^δ − 1 − δ), no clamp;
    `training_ppl` = mean_s exp(−mean_t log π), `training_log_ppl` = mean_s(−mean_t log π), and
    `rollout_*` of the engine's; `log_ppl_diff` = mean_s d_s with d_s = mean_t(−δ) (> 0: the trainer is
    less confident), `log_ppl_abs_diff` = mean_s |d_s|, `log_ppl_diff_max`/`_min` = max_s/min_s d_s,
    `ppl_ratio` = mean_s e^{d_s}; `chi2_token` = mean(e^{2 clamp(δ, ±20)}) − 1 and
    `chi2_seq` = mean_s e^{2 clamp(Σ_t δ, ±20)} − 1, χ²(π ‖ q).
    slime: `train_rollout_logprob_abs_diff` = mean_s mean_t |δ| (its default, per sequence first).
    miles: `train_rollout_kl` = mean_s mean_t clamp(e^c − 1 − c, ±10), c = clamp(δ, ±20).

    In float64, so where verl's float32 overflows at 88 nats an unclamped exp here overflows at 709: a
    value then +∞, which the NaN check leaves (`StepMetric.may_be_inf`). A sequence without tokens is
    in no sequence mean."""
    t, q = trainer_logp.double(), engine_logp.double()
    delta = t - q
    mean_t, mean_q = seq_means(t, seq, num_seqs), seq_means(q, seq, num_seqs)
    d = mean_q - mean_t  # verl's per-sequence log_ppl_diff
    c = delta.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    seq_log_ratio = seq_sums(delta, seq, num_seqs)[torch.bincount(seq, minlength=num_seqs) > 0]
    out = {
        "training_ppl": torch.exp(-mean_t).mean(),
        "training_log_ppl": (-mean_t).mean(),
        "kl": (-delta).mean(),
        "k3_kl": (torch.exp(delta) - 1 - delta).mean(),
        "rollout_ppl": torch.exp(-mean_q).mean(),
        "rollout_log_ppl": (-mean_q).mean(),
        "log_ppl_diff": d.mean(),
        "log_ppl_abs_diff": d.abs().mean(),
        "log_ppl_diff_max": d.max(),
        "log_ppl_diff_min": d.min(),
        "ppl_ratio": torch.exp(d).mean(),
        "chi2_token": torch.exp(2 * c).mean() - 1,
        "chi2_seq": torch.exp(2 * seq_log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)).mean() - 1,
        "train_rollout_logprob_abs_diff": seq_means(delta.abs(), seq, num_seqs).mean(),
        "train_rollout_kl": seq_means((torch.exp(c) - 1 - c).clamp(-K3_BOUND, K3_BOUND), seq, num_seqs).mean(),
    }
    return {k: float(v) for k, v in out.items()}


def mismatch_parts(e: torch.Tensor, a: torch.Tensor, b: torch.Tensor, seq: torch.Tensor, num_seqs: int) -> dict[str, float]:
    """field_metrics three times (`MISMATCH_PARTS`): the total a framework logs (b against e), and the
    split none logs, discrepancy (a against e) and lag (b against a); columns `mismatch_<part>_<key>`."""
    terms = {"e": e, "a": a, "b": b}
    return {mismatch_column(part, k): v for part, trainer, engine in MISMATCH_PARTS
            for k, v in field_metrics(terms[trainer], terms[engine], seq, num_seqs).items()}


def off_support_share(logp_0: torch.Tensor, threshold: float) -> float:
    """Share of tokens whose probability under θ_0 is below `threshold`; `logp_0` `(N,)`."""
    return float((logp_0 < math.log(threshold)).double().mean()) if logp_0.numel() else float("nan")


def squared_distance(g1: torch.Tensor, g2: torch.Tensor | None, chunk: int = 1 << 24) -> float:
    """‖g1 − g2‖² of two flat gradients (‖g1‖² when g2 is None), accumulated in float64 over slices of
    `chunk` entries (a whole float64 copy of a 1.7B-parameter gradient would be 14 GB)."""
    total = torch.zeros((), dtype=torch.float64, device=g1.device)
    for i in range(0, g1.numel(), chunk):
        d = g1[i : i + chunk].double()
        if g2 is not None:
            d = d - g2[i : i + chunk].double()
        total += (d * d).sum()
    return float(total)


def dev_ratio(dev: float, floor: float) -> float:
    """dev / floor, NaN where the floor is 0 (every advantage was 0): no division error."""
    return dev / floor if floor > 0 else float("nan")


def success_metrics(rewards: torch.Tensor, group: torch.Tensor, num_groups: int) -> dict[str, float]:
    """Of a batch of k responses per prompt: pass@1 (share of correct responses), pass@k (share of
    prompts with at least one) and the share of prompts whose rewards are mixed (only those carry a
    non-zero advantage, and with it a gradient)."""
    correct = (rewards == REWARD_CORRECT).double()
    n = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group, torch.ones_like(correct))
    hits = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group, correct)
    return {
        "pass_at_1": float(correct.mean()),
        "pass_at_k": float((hits > 0).double().mean()),
        "mixed_groups": float(((hits > 0) & (hits < n)).double().mean()),
    }


def gradient_snr(g_on: torch.Tensor, g_on2: torch.Tensor, floor: float | None = None) -> dict[str, float]:
    """The on-policy gradient's signal against its noise, from the two probe gradients: signal
    ‖(g_on + g_on′)/2‖², noise ‖g_on − g_on′‖²/4 = floor/4 (the variance of their mean, in
    expectation) and grad_snr = signal / noise (NaN when the noise is 0). The signal is
    (‖g_on‖² + ‖g_on′‖²)/2 − floor/4: no gradient-sized temporary (a 1.7B model's is 7 GB)."""
    floor = squared_distance(g_on, g_on2) if floor is None else floor
    signal = (squared_distance(g_on, None) + squared_distance(g_on2, None)) / 2 - floor / 4
    noise = floor / 4
    return {"grad_signal": signal, "grad_snr": signal / noise if noise > 0 else math.nan}


# ----------------------------------------------------------------------------- the step row's metrics
#
# Every metric column of a step's row (metrics.parquet) is one function below, registered with the
# columns it returns and when a step has them: "batch" (every step, from the sampled batch) or
# "probe" (probe steps, from the on-policy probes and the update direction; NaN on the other steps).
# The training step (train.Trainer.step) and the batch-size scan (scan.py) build their rows from
# this one list, and the NaN check (divergence.check_finite) reads from it which columns may be NaN.
# Adding a metric: docs/extending.md#adding-a-metric.


@dataclass
class BatchTerms:
    """What a step knows of its sampled batch (CPU tensors): rewards `(B,)` and the prompt of each
    response `(B,)` of `num_groups` prompts, response lengths `(B,)`, per-token log-probs `(N,)` of
    the engine (e), the trainer at θ_s (a) and at θ_t (b), each token's sequence `(N,)`, and the mean
    full-vocabulary KL(π_θs ‖ π_θt) over the batch's prefixes."""

    rewards: torch.Tensor
    group: torch.Tensor
    num_groups: int
    lengths: torch.Tensor
    e: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    seq: torch.Tensor
    num_seqs: int
    kl_sampler: float


@dataclass
class ProbeTerms:
    """What a probe step adds: the update direction g_c (over all of the step's SGD steps), the
    on-policy gradients g_on, g_on′ of the two probe batches, the first probe batch's tokens'
    log-probs `(N,)` under θ_0, and train.off_support_threshold."""

    g_c: torch.Tensor
    g_on: torch.Tensor
    g_on2: torch.Tensor
    logp_0: torch.Tensor
    off_support_threshold: float


@dataclass(frozen=True)
class StepMetric:
    when: str  # "batch" or "probe"
    columns: tuple[str, ...]
    fn: Callable  # (BatchTerms or ProbeTerms, the row so far) -> {column: value}
    may_be_nan: bool  # NaN is a value, not a fault (a ratio whose denominator can be 0); probe columns always may
    may_be_inf: bool = False  # +∞ is a value, not a fault (a framework's unclamped exp overflowed: field_metrics)


STEP_METRICS: list[StepMetric] = []
WHEN = ("batch", "probe")

# The columns of the evaluation (train.Trainer.evaluate) on eval steps, NaN on the others; and the
# ESS before a resync, NaN where none happened.
EVAL_COLUMNS = ("accuracy_greedy", "accuracy_sampled", "heldout_accuracy_greedy", "test_accuracy")
NOT_ALWAYS = ("ess_lag_presync", *EVAL_COLUMNS)


def step_metric(when: str, *columns: str, may_be_nan: bool = False, may_be_inf: bool = False):
    """Register `fn(terms, row) -> {column: value}` as the metric columns `columns` of a step's row,
    computed `when` ("batch": every step, from BatchTerms; "probe": probe steps, from ProbeTerms)."""
    if when not in WHEN:
        raise ValueError(f"step_metric: when={when!r}, one of {WHEN}")

    def register(fn):
        taken = set(columns) & {c for m in STEP_METRICS for c in m.columns}
        if taken:
            raise ValueError(f"step_metric {fn.__name__}: columns {sorted(taken)} are another metric's")
        STEP_METRICS.append(StepMetric(when, tuple(columns), fn, may_be_nan, may_be_inf))
        return fn

    return register


def step_metrics(when: str, terms) -> dict[str, float]:
    """The row's columns of every metric registered for `when`, in the order they were registered
    (a metric may read the columns before it from the row so far)."""
    row: dict[str, float] = {}
    for m in STEP_METRICS:
        if m.when == when:
            out = m.fn(terms, row)
            if tuple(out) != m.columns:
                raise ValueError(f"step metric {m.fn.__name__} returned {list(out)}, registered as {list(m.columns)}")
            row.update(out)
    return row


def missing(when: str) -> dict[str, float]:
    """NaN in every column of the metrics registered for `when`: a step that does not compute them."""
    return {c: math.nan for m in STEP_METRICS if m.when == when for c in m.columns}


def metric_columns(when: str | None = None) -> list[str]:
    """The row's metric columns (of `when`, or all), in order."""
    return [c for m in STEP_METRICS if when in (None, m.when) for c in m.columns]


def may_be_nan(column: str) -> bool:
    """Whether NaN in `column` is a value, not a fault: a probe or eval column off its steps, the
    pre-resync ESS, a ratio whose denominator can be 0."""
    return column in NOT_ALWAYS or any(column in m.columns and (m.when == "probe" or m.may_be_nan) for m in STEP_METRICS)


def may_be_inf(column: str) -> bool:
    """Whether +∞ in `column` is a value, not a fault: a framework's definition whose exp overflowed."""
    return any(column in m.columns and m.may_be_inf for m in STEP_METRICS)


@step_metric("batch", "reward_mean")
def _reward(t: BatchTerms, row: dict) -> dict[str, float]:
    return {"reward_mean": float(t.rewards.mean())}


@step_metric("batch", "pass_at_1", "pass_at_k", "mixed_groups")
def _success(t: BatchTerms, row: dict) -> dict[str, float]:
    return success_metrics(t.rewards, t.group, t.num_groups)


@step_metric("batch", "response_len_mean")
def _length(t: BatchTerms, row: dict) -> dict[str, float]:
    return {"response_len_mean": float(t.lengths.double().mean())}


@step_metric("batch", "ess_lag", "ess_lag_gauss", "ess_lag_seq", "ess_total", "discrepancy_mean", "discrepancy_mean_abs",
             "discrepancy_std", "lag_mean", "lag_mean_abs", "lag_std")
def _mismatch(t: BatchTerms, row: dict) -> dict[str, float]:
    return mismatch_metrics(t.e, t.a, t.b, t.seq, t.num_seqs)


@step_metric("batch", *(mismatch_column(p, k) for p, _, _ in MISMATCH_PARTS for k in FIELD_METRICS), may_be_inf=True)
def _mismatch_parts(t: BatchTerms, row: dict) -> dict[str, float]:
    return mismatch_parts(t.e, t.a, t.b, t.seq, t.num_seqs)


@step_metric("batch", "kl_sampler")
def _kl_sampler(t: BatchTerms, row: dict) -> dict[str, float]:
    return {"kl_sampler": t.kl_sampler}


@step_metric("probe", "off_support")
def _off_support(t: ProbeTerms, row: dict) -> dict[str, float]:
    return {"off_support": off_support_share(t.logp_0, t.off_support_threshold)}


@step_metric("probe", "dev", "floor", "dev_ratio")
def _deviation(t: ProbeTerms, row: dict) -> dict[str, float]:
    dev, floor = squared_distance(t.g_c, t.g_on), squared_distance(t.g_on, t.g_on2)
    return {"dev": dev, "floor": floor, "dev_ratio": dev_ratio(dev, floor)}


@step_metric("probe", "grad_signal", "grad_snr")
def _snr(t: ProbeTerms, row: dict) -> dict[str, float]:
    return gradient_snr(t.g_on, t.g_on2, row["floor"])
