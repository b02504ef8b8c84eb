"""The corrections (docs/method.md#corrections): one registry of pure tensor functions.

Each correction maps the per-token quantities of a batch to a scalar surrogate loss whose
gradient is the correction's update direction (mean over all N response tokens of the batch).
Score centring works in logit space: with z the trainer logits at a prefix,
∇_θ log π(y) = Jᵀ(onehot(y) − π), so the centred score c(y) = ∇ℓ(y) − Σ_v q̃(v) ∇ℓ(v) is
Jᵀ(onehot(y) − q̃) — the surrogate ⟨sg(onehot(y) − q̃), z⟩ yields it with one backward pass.

Adding a correction: write `fn(t: TokenTerms, p: CorrectionParams) -> loss` and decorate it with
`@register_correction("name")`; the grid picks it up by name. A loss that reads `t.q` (the engine's
distribution) registers with `needs_q=True`: the other corrections' runs skip that work. Where it
takes exactly another correction's update under some condition (as `ppo` takes `pg`'s at one
update per batch), a rule in `grid.SAME_AS` lets the workflow copy that cell instead of training
it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

sg = torch.Tensor.detach


@dataclass
class TokenTerms:
    """Everything a correction may use, one row per response token of the batch.

    logits: `(N, V)` trainer logits at θ_t (carries the gradient).
    tokens: `(N,)` sampled token ids.
    adv: `(N,)` advantage of the token's response.
    e: `(N,)` log q(y|p; θ_s), the engine's own log-prob.
    a: `(N,)` log π(y|p; θ_s), trainer numerics at the sampler's weights.
    old: `(N,)` log π(y|p; θ_old), the trainer before this batch (PPO's reference).
    q: `(N, V)` the engine's next-token distribution at each prefix (rows sum to 1); None unless
      the correction is registered with `needs_q=True` (only then does the engine return its
      top-k log-probs and the trainer build this full-vocabulary tensor).
    logp_s: `(N, V)` trainer log π(·|p; θ_s) over the vocabulary (for λ_v).
    """

    logits: torch.Tensor
    tokens: torch.Tensor
    adv: torch.Tensor
    e: torch.Tensor
    a: torch.Tensor
    old: torch.Tensor
    q: torch.Tensor | None
    logp_s: torch.Tensor

    def logp(self) -> torch.Tensor:
        """`(N, V)` trainer log π(·|p; θ_t), float32."""
        return torch.log_softmax(self.logits.float(), dim=-1)


@dataclass(frozen=True)
class CorrectionParams:
    clip_c: float = 2.0
    ppo_eps: float = 0.2


@dataclass(frozen=True)
class Correction:
    name: str
    fn: Callable[[TokenTerms, CorrectionParams], torch.Tensor]
    # resynchronize the sampler when the lag ESS of a fresh batch falls below `resync_ess`.
    resync: bool = False
    # the loss depends on θ_old (PPO): several SGD steps per batch are meaningful.
    multi_update: bool = False
    # the loss reads `t.q`, the engine's next-token distribution (its top-k log-probs).
    needs_q: bool = False


CORRECTIONS: dict[str, Correction] = {}


def register_correction(name: str, *, resync: bool = False, multi_update: bool = False, needs_q: bool = False):
    def deco(fn):
        if name in CORRECTIONS:
            raise ValueError(f"correction {name!r} registered twice")
        CORRECTIONS[name] = Correction(name, fn, resync, multi_update, needs_q)
        return fn

    return deco


def get_correction(name: str) -> Correction:
    if name not in CORRECTIONS:
        raise KeyError(f"unknown correction {name!r}; known: {sorted(CORRECTIONS)}")
    return CORRECTIONS[name]


# ----------------------------------------------------------------------------- shared pieces


def centred_score_surrogate(logits: torch.Tensor, tokens: torch.Tensor, q_tilde: torch.Tensor) -> torch.Tensor:
    """`(N,)` ⟨sg(onehot(y) − q̃), z⟩: its gradient is the centred score Jᵀ(onehot(y) − q̃)."""
    direction = torch.nn.functional.one_hot(tokens, logits.shape[-1]).to(logits.dtype) - q_tilde.to(logits.dtype)
    return (sg(direction) * logits).sum(-1)


def reweighted(q: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`(N, V)` q̃ ∝ q · weight, normalised per row."""
    w = q * weight
    return w / w.sum(-1, keepdim=True)


def lag_all(t: TokenTerms) -> torch.Tensor:
    """`(N, V)` λ_v = log π(v|p; θ_t) − log π(v|p; θ_s), no gradient."""
    return sg(t.logp()) - t.logp_s


def token_logp(t: TokenTerms) -> torch.Tensor:
    """`(N,)` b = log π(y|p; θ_t) with gradient."""
    return t.logp().gather(-1, t.tokens[:, None]).squeeze(-1)


# ----------------------------------------------------------------------------- the registry


@register_correction("pg")
def pg(t: TokenTerms, p: CorrectionParams) -> torch.Tensor:
    """A · ∇ℓ(y): plain policy gradient, as if the engine's samples were on-policy."""
    return -(t.adv * token_logp(t)).mean()


@register_correction("center", needs_q=True)
def center(t: TokenTerms, p: CorrectionParams) -> torch.Tensor:
    """A · c(y), q̃ = q: per-prefix score centring under the engine's own distribution."""
    return -(t.adv * centred_score_surrogate(t.logits, t.tokens, t.q)).mean()


@register_correction("is")
def importance_sampling(t: TokenTerms, p: CorrectionParams) -> torch.Tensor:
    """sg(exp(b − e)) · A · ∇ℓ(y): untruncated token ratio against the engine."""
    b = token_logp(t)
    return -(torch.exp(sg(b) - t.e) * t.adv * b).mean()


@register_correction("is_center", needs_q=True)
def is_center(t: TokenTerms, p: CorrectionParams) -> torch.Tensor:
    """sg(exp(b − a)) · A · c(y), q̃ ∝ q · exp(λ_v): untruncated lag ratio with centring."""
    lam = lag_all(t)
    w = torch.exp(lam.gather(-1, t.tokens[:, None]).squeeze(-1))
    return -(w * t.adv * centred_score_surrogate(t.logits, t.tokens, reweighted(t.q, torch.exp(lam)))).mean()


@register_correction("ppo", multi_update=True)
def ppo(t: TokenTerms, p: CorrectionParams) -> torch.Tensor:
    """PPO clipped surrogate, ratio π(θ)/π(θ_old), θ_old = the trainer before this batch."""
    ratio = torch.exp(token_logp(t) - t.old)
    unclipped = ratio * t.adv
    clipped = torch.clamp(ratio, 1 - p.ppo_eps, 1 + p.ppo_eps) * t.adv
    return -torch.minimum(unclipped, clipped).mean()


@register_correction("dlc", resync=True, needs_q=True)
def dlc(t: TokenTerms, p: CorrectionParams) -> torch.Tensor:
    """sg(min(exp(b − a), C)) · A · c(y), q̃ ∝ q · min(exp(λ_v), C); plus resync."""
    clipped = torch.clamp(torch.exp(lag_all(t)), max=p.clip_c)
    w = clipped.gather(-1, t.tokens[:, None]).squeeze(-1)
    return -(w * t.adv * centred_score_surrogate(t.logits, t.tokens, reweighted(t.q, clipped))).mean()


@register_correction("is_resync", resync=True)
def is_resync(t: TokenTerms, p: CorrectionParams) -> torch.Tensor:
    """`is` plus the same resynchronization rule as DLC."""
    return importance_sampling(t, p)


@register_correction("tis")
def truncated_is(t: TokenTerms, p: CorrectionParams) -> torch.Tensor:
    """sg(min(exp(b − e), C)) · A · ∇ℓ(y): token ratio against the engine, truncated at C."""
    b = token_logp(t)
    return -(torch.clamp(torch.exp(sg(b) - t.e), max=p.clip_c) * t.adv * b).mean()


# ----------------------------------------------------------------------------- the engine's distribution


def engine_distribution(topk_ids: torch.Tensor, topk_logp: torch.Tensor, logp_s: torch.Tensor) -> torch.Tensor:
    """`(N, V)` q from the engine's top-k log-probs `(N, k)`.

    Mass outside the top k is spread in proportion to the trainer's distribution at θ_s
    (`logp_s`, `(N, V)`); with k = V the top-k is the whole distribution and nothing is spread.
    """
    p_s = torch.exp(logp_s)
    q = torch.zeros_like(p_s)
    q.scatter_(-1, topk_ids, torch.exp(topk_logp))
    in_topk = torch.zeros_like(p_s, dtype=torch.bool).scatter_(-1, topk_ids, True)
    rest = torch.clamp(1 - q.sum(-1, keepdim=True), min=0.0)
    outside = torch.where(in_topk, torch.zeros_like(p_s), p_s)
    norm = outside.sum(-1, keepdim=True)
    q = q + torch.where(norm > 0, rest * outside / norm.clamp_min(1e-30), torch.zeros_like(p_s))
    return q / q.sum(-1, keepdim=True)
