"""Per-step diagnostics (docs/method.md#per-step-diagnostics), as pure tensor functions.
Each metric column is defined here once."""

from __future__ import annotations

import math

import torch


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
