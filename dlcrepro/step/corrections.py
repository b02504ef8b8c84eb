"""The corrections (docs/method.md#corrections): one registry of pure tensor functions.

Each correction maps the per-token quantities of a batch to a scalar surrogate loss whose
gradient is the correction's update direction (mean over all N response tokens of the batch),
and to the weight it put on each token's term (for its diagnostics, `weight_diagnostics`).
Score centring works in logit space: with z the trainer logits at a prefix,
∇_θ log π(y) = Jᵀ(onehot(y) − π), so the centred score c(y) = ∇ℓ(y) − Σ_v q̃(v) ∇ℓ(v) is
Jᵀ(onehot(y) − q̃) — the surrogate ⟨sg(onehot(y) − q̃), z⟩ yields it with one backward pass.

Adding a correction: an entry in `registry.CORRECTION_INFO` (its name and flags) and a function
`fn(t: TokenTerms, p: CorrectionParams) -> CorrectionLoss` decorated with
`@register_correction("name")`; the grid, the tables and the figures take it by name. A threshold
it needs is a field of `CorrectionParams` and of `config.TrainConfig` (same name). Where it takes
exactly another correction's update under some condition (as `ppo` takes `pg`'s at one update per
batch), a rule in `grid.SAME_AS` lets the workflow copy that cell instead of training it again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Callable

import torch

from ..core.config import TrainConfig
from ..core.registry import CORRECTION_INFO, CorrectionInfo, UnknownNameError

sg = torch.Tensor.detach


@dataclass(kw_only=True)
class TokenTerms:
    """Everything a correction may use, one row per response token of a (micro-)batch.
    Same-shaped tensors, so built by keyword only: a swap cannot pass unnoticed.

    logits: `(N, V)` trainer logits at θ_t (carries the gradient).
    tokens: `(N,)` sampled token ids.
    adv: `(N,)` advantage of the token's response.
    e: `(N,)` log q(y|p; θ_s), the engine's own log-prob (the behaviour policy).
    a: `(N,)` log π(y|p; θ_s), trainer numerics at the sampler's weights.
    old: `(N,)` log π(y|p; θ_old), the trainer before this batch's SGD steps (PPO's reference).
    q: `(N, V)` the engine's next-token distribution at each prefix (rows sum to 1); None unless
      the correction is registered with `needs_q` (only then does the engine return its top-k
      log-probs and the trainer build this full-vocabulary tensor).
    logp_s_of: a function giving `(N, V)` trainer log π(·|p; θ_s) over the vocabulary (for λ_v);
      read it as `logp_s`, computed on the first read: a lagged sampler's batch in several
      micro-batches costs θ_s's forward for it, which only a correction that reads it pays.
    seq: `(N,)` the token's sequence, 0 … num_seqs − 1 (a micro-batch always holds whole sequences).
    num_seqs: the number of sequences.
    """

    logits: torch.Tensor
    tokens: torch.Tensor
    adv: torch.Tensor
    e: torch.Tensor
    a: torch.Tensor
    old: torch.Tensor
    q: torch.Tensor | None
    logp_s_of: Callable[[], torch.Tensor]
    seq: torch.Tensor
    num_seqs: int

    def logp(self) -> torch.Tensor:
        """`(N, V)` trainer log π(·|p; θ_t), float32."""
        return torch.log_softmax(self.logits.float(), dim=-1)

    @cached_property
    def logp_s(self) -> torch.Tensor:
        """`(N, V)` trainer log π(·|p; θ_s): `logp_s_of()` on the first read, then kept."""
        return self.logp_s_of()


@dataclass(frozen=True)
class TokenWeights:
    """What a correction did to each token's term A·∇ℓ(y) (or A·c(y)): for its diagnostics only.

    weight: `(N,)` the factor the term was multiplied by (0 where masked), no gradient.
    clipped: `(N,)` bool, the factor was truncated at a threshold (None: never).
    masked: `(N,)` bool, the term was dropped (None: never).
    """

    weight: torch.Tensor
    clipped: torch.Tensor | None = None
    masked: torch.Tensor | None = None


@dataclass(frozen=True)
class CorrectionLoss:
    """A correction's surrogate loss on a micro-batch and what it did to each token.

    `mean_over`: how many terms the loss is a mean over, where that is not the micro-batch's N
    tokens: the tokens a rejection keeps (it renormalizes by them, as verl's response mask does),
    or the sequences of a sequence mean (GSPO's mean over sequences of token means). The trainer
    then weights each micro-batch by its count, so that a batch in several micro-batches has the
    one-batch gradient."""

    loss: torch.Tensor
    weights: TokenWeights
    mean_over: int | None = None


@dataclass(frozen=True)
class CorrectionParams:
    """The corrections' thresholds: each a key of the config's `train` section, same name, and its
    default there (config.TrainConfig declares each once, with its range and its why)."""

    clip_c: float = TrainConfig.clip_c
    ppo_eps: float = TrainConfig.ppo_eps
    seq_clip_c: float = TrainConfig.seq_clip_c
    seq_mis_low: float = TrainConfig.seq_mis_low
    seq_mis_high: float = TrainConfig.seq_mis_high
    geo_low: float = TrainConfig.geo_low
    geo_high: float = TrainConfig.geo_high
    icepop_low: float = TrainConfig.icepop_low
    icepop_high: float = TrainConfig.icepop_high
    behav_weight_cap: float = TrainConfig.behav_weight_cap
    behav_weight_low: float = TrainConfig.behav_weight_low
    gspo_clip_low: float = TrainConfig.gspo_clip_low
    gspo_clip_high: float = TrainConfig.gspo_clip_high

    @classmethod
    def from_train(cls, tcfg) -> "CorrectionParams":
        return cls(**{f.name: getattr(tcfg, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class Correction:
    info: CorrectionInfo
    fn: Callable[[TokenTerms, CorrectionParams], CorrectionLoss]

    name = property(lambda self: self.info.name)
    resync = property(lambda self: self.info.resync)
    multi_update = property(lambda self: self.info.multi_update)
    needs_q = property(lambda self: self.info.needs_q)
    needs_sequences = property(lambda self: self.info.needs_sequences)


CORRECTIONS: dict[str, Correction] = {}


def register_correction(name: str):
    """Register `fn` under `name`, which must be listed in `registry.CORRECTION_INFO` (its flags)."""

    def deco(fn):
        if name in CORRECTIONS:
            raise ValueError(f"correction {name!r} registered twice")
        if name not in CORRECTION_INFO:
            raise ValueError(f"correction {name!r} has no entry in registry.CORRECTION_INFO (its name and flags)")
        CORRECTIONS[name] = Correction(CORRECTION_INFO[name], fn)
        return fn

    return deco


def get_correction(name: str) -> Correction:
    if name not in CORRECTIONS:
        raise UnknownNameError(f"unknown correction {name!r}; known: {sorted(CORRECTIONS)}")
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


def per_sequence_sum(x: torch.Tensor, t: TokenTerms) -> torch.Tensor:
    """`(num_seqs,)` the sum of a per-token `(N,)` quantity over each sequence's tokens."""
    return torch.zeros(t.num_seqs, dtype=x.dtype, device=x.device).index_add_(0, t.seq, x)


def per_sequence_mean(x: torch.Tensor, t: TokenTerms) -> torch.Tensor:
    counts = torch.bincount(t.seq, minlength=t.num_seqs).clamp_min(1).to(x.dtype)
    return per_sequence_sum(x, t) / counts


def weighted_pg(t: TokenTerms, b: torch.Tensor, weight: torch.Tensor, clipped=None, masked=None) -> CorrectionLoss:
    """−mean(sg(weight)·A·b), b = log π(y; θ_t) with gradient: the policy gradient with a fixed
    factor per token."""
    weight = sg(weight)
    return CorrectionLoss(-(weight * t.adv * b).mean(), TokenWeights(weight, clipped, masked))


def kept_mean_pg(t: TokenTerms, b: torch.Tensor, weight: torch.Tensor, drop: torch.Tensor,
                 clipped: torch.Tensor | None = None) -> CorrectionLoss:
    """−Σ_kept sg(weight)·A·b / (tokens kept): a rejection that leaves the mean's denominator too.
    No token kept: the loss is 0 (no update), where a mean over the kept tokens would be 0/0."""
    weight = sg(torch.where(drop, torch.zeros_like(weight), weight))
    kept = int((~drop).sum())
    clipped = clipped & ~drop if clipped is not None else None
    return CorrectionLoss(-(weight * t.adv * b).sum() / max(kept, 1), TokenWeights(weight, clipped, drop), mean_over=kept)


def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, low: float, high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`(N,)` the clipped surrogate min(r·A, clip(r, 1 − low, 1 + high)·A), and where the clipped
    side is the minimum (no gradient there)."""
    clipped = torch.clamp(ratio, 1 - low, 1 + high)
    return torch.minimum(ratio * adv, clipped * adv), sg(clipped * adv < ratio * adv)


def ppo_surrogate(t: TokenTerms, b: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(N,)` PPO's clipped surrogate min(r·A, clip(r, 1 ± ε)·A), r = π(θ)/π(θ_old) = exp(b − old);
    the ratio (no gradient); and where the clipped side is the minimum (that token has no gradient)."""
    ratio = torch.exp(b - t.old)
    surrogate, off = clipped_surrogate(ratio, t.adv, eps, eps)
    return surrogate, sg(ratio), off


def ones(t: TokenTerms) -> TokenWeights:
    return TokenWeights(torch.ones_like(t.adv))


# ----------------------------------------------------------------------------- the registry
# The paper's corrections and controls (arXiv:2610.40945; docs/method.md says each in words): no peer
# code; each is the paper's formula, untruncated where the paper does not truncate (no ±20 bound).


@register_correction("pg")
def pg(t: TokenTerms, p: CorrectionParams) -> CorrectionLoss:
    """A · ∇ℓ(y): plain policy gradient, as if the engine's samples were on-policy. The paper's; no
    peer code."""
    return weighted_pg(t, token_logp(t), torch.ones_like(t.adv))


@register_correction("center")
def center(t: TokenTerms, p: CorrectionParams) -> CorrectionLoss:
    """A · c(y), q̃ = q: per-prefix score centring under the engine's own distribution. The paper's;
    no peer code (torchtitan's `ScoreCenteringLoss` with max_ratio None is the same term, its tail
    modelled as `center_tis` says)."""
    return CorrectionLoss(-(t.adv * centred_score_surrogate(t.logits, t.tokens, t.q)).mean(), ones(t))


@register_correction("is")
def importance_sampling(t: TokenTerms, p: CorrectionParams) -> CorrectionLoss:
    """sg(exp(b − e)) · A · ∇ℓ(y): untruncated token ratio against the engine. The paper's; no peer
    code (verl's Token-IS is `tis`, truncated)."""
    b = token_logp(t)
    return weighted_pg(t, b, torch.exp(sg(b) - t.e))


@register_correction("is_center")
def is_center(t: TokenTerms, p: CorrectionParams) -> CorrectionLoss:
    """sg(exp(b − a)) · A · c(y), q̃ ∝ q · exp(λ_v): untruncated lag ratio with centring. The
    paper's; no peer code."""
    lam = lag_all(t)
    w = torch.exp(lam.gather(-1, t.tokens[:, None]).squeeze(-1))
    loss = -(w * t.adv * centred_score_surrogate(t.logits, t.tokens, reweighted(t.q, torch.exp(lam)))).mean()
    return CorrectionLoss(loss, TokenWeights(w))


@register_correction("ppo_multi")
@register_correction("ppo")
def ppo(t: TokenTerms, p: CorrectionParams) -> CorrectionLoss:
    """PPO clipped surrogate (Schulman et al. 2017), ratio π(θ)/π(θ_old), θ_old = the trainer before
    this batch; ε = `ppo_eps`. `ppo` takes train.updates_per_batch SGD steps per batch (1 by
    default: then r = 1 and it is `pg`, bit for bit); `ppo_multi` takes its own 4 (the registry's
    `updates_per_batch`), each on the whole batch with fresh logits and the same θ_old.

    The peer it is read against: verl's `compute_policy_loss_vanilla` (verl/trainer/ppo/core_algos.py
    at volcengine/verl@b178a3c), which with `ppo_epochs` 1 and a mini-batch of a quarter of the batch
    (its defaults: train_batch_size 1024, ppo_mini_batch_size 256) also takes 4 SGD steps per
    sampled batch. Deliberate differences: each of our steps sees the whole batch, not a quarter
    (train.updates_per_batch as this project defines it, docs/method.md#ppo_multi); no dual clip
    (verl bounds a negative-advantage token's loss at `clip_ratio_c` 3 · |A|, which at r < 3 never
    binds); no ±20 clamp of log r (both only matter when θ has moved far within one batch)."""
    surrogate, ratio, off = ppo_surrogate(t, token_logp(t), p.ppo_eps)
    return CorrectionLoss(-surrogate.mean(), TokenWeights(ratio * ~off, clipped=off))


@register_correction("dlc")
def dlc(t: TokenTerms, p: CorrectionParams) -> CorrectionLoss:
    """sg(min(exp(b − a), C)) · A · c(y), q̃ ∝ q · min(exp(λ_v), C); plus resync. The paper's
    (DLC); no peer code."""
    ratio = torch.exp(lag_all(t))
    clipped = torch.clamp(ratio, max=p.clip_c)
    w = clipped.gather(-1, t.tokens[:, None]).squeeze(-1)
    loss = -(w * t.adv * centred_score_surrogate(t.logits, t.tokens, reweighted(t.q, clipped))).mean()
    return CorrectionLoss(loss, TokenWeights(w, clipped=ratio.gather(-1, t.tokens[:, None]).squeeze(-1) > p.clip_c))


@register_correction("is_resync")
def is_resync(t: TokenTerms, p: CorrectionParams) -> CorrectionLoss:
    """`is` plus the same resynchronization rule as DLC. The paper's control; no peer code."""
    return importance_sampling(t, p)


# ----------------------------------------------------------------------------- the corrections practitioners run
# Each follows its peer's code, read at these commits (the docstrings say where and how ours differs):
#   verl   volcengine/verl@b178a3cd56f58b2d502255daba591e92833930a7 (2026-01-29):
#          verl/trainer/ppo/rollout_corr_helper.py, verl/trainer/config/algorithm.py (the presets),
#          verl/trainer/ppo/core_algos.py (`compute_policy_loss_vanilla`, `compute_policy_loss_gspo`)
#   AReaL  inclusionAI/AReaL@4aef98d8d818af55b43621aaadba047ae10f4e77 (2026-05-21):
#          areal/utils/functional/functional.py (`apply_rejection_sampling`, `ppo_actor_loss_fn`),
#          areal/api/cli_args.py (`RejectionSamplingConfig`)
#   slime  THUDM/slime@624b824a898ab0ec1fcb4d373004c7f3852bf515 (2026-08-21):
#          slime/backends/megatron_utils/loss.py (`icepop_function`)
# ρ_tok = exp(b − e) and ρ_seq = exp(Σ_seq (b − e)) are trainer over engine, all without gradient.
# verl's rejection statistics run the other way: its k1 is −log ρ_tok = e − b (rollout over trainer).

# verl's SAFETY_BOUND: every log ratio is clamped to ±20 before it is exponentiated (a token's for a
# token weight, a sequence's sum for a sequence weight) or enters a rejection statistic (a token's).
LOG_RATIO_BOUND = 20.0


def bounded(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.clamp(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def rollout_k1(t: TokenTerms, b: torch.Tensor) -> torch.Tensor:
    """`(N,)` verl's k1 statistic per token, −log ρ_tok = e − b with b − e first bounded to ±20."""
    return -bounded(sg(b) - t.e)


def in_ratio_band(log_stat: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """`(n,)` bool: log(low) ≤ log_stat ≤ log(high), verl's k1 band given as ratios (low 0: no lower
    bound), compared in log space as verl compares it."""
    return (log_stat >= (math.log(low) if low > 0 else -math.inf)) & (log_stat <= math.log(high))


@register_correction("tis")
def truncated_is(t: TokenTerms, p: CorrectionParams) -> CorrectionLoss:
    """sg(min(ρ_tok, C)) · A · ∇ℓ(y) (C: `clip_c`, 2), ρ_tok = exp(bounded(b − e)): the token ratio
    against the engine, truncated at C. verl's Token-TIS (volcengine/verl@b178a3c,
    `RolloutCorrectionConfig.decoupled_token_is`:
    `compute_rollout_correction_weights` with rollout_is "token", threshold 2), log ratio bounded to
    ±20 as there. verl takes the ratio at θ_old (`old_log_prob`); at our one SGD step per batch b is
    θ_old's log-prob."""
    b = token_logp(t)
    rho = torch.exp(bounded(sg(b) - t.e))
    return weighted_pg(t, b, torch.clamp(rho, max=p.clip_c), clipped=rho > p.clip_c)


@register_correction("seq_tis")
def sequence_truncated_is(t: TokenTerms, p: CorrectionParams) -> CorrectionLoss:
    """sg(min(ρ_seq, C_seq)) · A · ∇ℓ(y) on every token of the sequence (C_seq: `seq_clip_c`, 2),
    ρ_seq = exp(bounded(Σ_seq (b − e))). verl's Seq-TIS (volcengine/verl@b178a3c, `decoupled_seq_is`: rollout_is "sequence",
    threshold 2), the sequence's summed log ratio bounded to ±20 as there."""
    b = token_logp(t)
    rho = torch.exp(bounded(per_sequence_sum(sg(b) - t.e, t)))[t.seq]
    return weighted_pg(t, b, torch.clamp(rho, max=p.seq_clip_c), clipped=rho > p.seq_clip_c)


@register_correction("seq_mis")
def sequence_masked_is(t: TokenTerms, p: CorrectionParams) -> CorrectionLoss:
    """1[L ≤ exp(Σ_seq k1) ≤ H] · min(ρ_seq, C_seq) · A · ∇ℓ(y), the mean over the kept tokens, with
    k1 = e − b per token bounded to ±20 (`rollout_k1`), L = `seq_mis_low` 0.5, H = `seq_mis_high` 2,
    C_seq = `seq_clip_c` 2 and ρ_seq as in `seq_tis`. verl's Seq-MIS preset (volcengine/verl@b178a3c,
    `RolloutCorrectionConfig.decoupled_seq_is_rs`: rollout_is "sequence" at 2, rollout_rs
    "seq_sum_k1" at "0.5_2.0"), in verl's orientation and units: the band bounds the rollout-over-
    trainer ratio 1/ρ_seq, so a band written "L_H" in a verl config means the same here (kept:
    ρ_seq in [1/H, 1/L]; the default band is its own reciprocal). A rejected sequence leaves the
    token mean's denominator, as verl's response mask does. When every sequence is rejected verl's
    token mean is 0/0 (NaN); ours is 0, no update (`kept_mean_pg`). L = 0, H = C_seq = ∞ is
    sequence-level IS while |Σ_seq (b − e)| ≤ 20."""
    b = token_logp(t)
    rho = torch.exp(bounded(per_sequence_sum(sg(b) - t.e, t)))[t.seq]
    keep = in_ratio_band(per_sequence_sum(rollout_k1(t, b), t), p.seq_mis_low, p.seq_mis_high)[t.seq]
    return kept_mean_pg(t, b, torch.clamp(rho, max=p.seq_clip_c), ~keep, clipped=rho > p.seq_clip_c)


@register_correction("geo_rs")
def geometric_rejection(t: TokenTerms, p: CorrectionParams) -> CorrectionLoss:
    """1[L ≤ exp(mean_seq k1) ≤ H] · A · ∇ℓ(y), no IS weight, the mean over the kept tokens, with
    k1 = e − b per token bounded to ±20 (`rollout_k1`), L = `geo_low` 0.999, H = `geo_high` 1.001.
    verl's Geo-RS preset (volcengine/verl@b178a3c, `RolloutCorrectionConfig.decoupled_geo_rs`: rollout_is None, rollout_rs
    "seq_mean_k1" at "0.999_1.001"), in verl's orientation: the band bounds the geometric mean of
    the rollout-over-trainer ratio, so it keeps a sequence whose geometric-mean ρ lies in
    [1/H, 1/L] = [1/1.001, 1/0.999], not [L, H]. A rejected sequence leaves the token mean's
    denominator; when every sequence is rejected verl's token mean is 0/0 (NaN), ours is 0, no
    update (`kept_mean_pg`)."""
    b = token_logp(t)
    keep = in_ratio_band(per_sequence_mean(rollout_k1(t, b), t), p.geo_low, p.geo_high)[t.seq]
    return kept_mean_pg(t, b, torch.ones_like(b), ~keep)


@register_correction("icepop")
def icepop(t: TokenTerms, p: CorrectionParams) -> CorrectionLoss:
    """IcePop (Ring-1T, arXiv 2510.18855, "IcePop: discard all noisy gradient updates"):
    M(k) · min(r·A, clip(r, 1 ± ε)·A) with k = π_train(θ_old)/π_infer = exp(old − e),
    M(k) = k on [α, β] (`icepop_low` 0.5, `icepop_high` 5, the paper's recipe) and 0 outside,
    r = exp(b − old), ε = `ppo_eps`. Matches slime's `icepop_function` (THUDM/slime@624b824,
    slime/backends/megatron_utils/loss.py: k = exp(old − rollout), kept
    on [tis_clip_low, tis_clip] inclusive, no bound on log k, multiplying the PPO loss): the same
    orientation (trainer over engine) and units, so a band set in slime means the same here. A
    dropped token stays in the token mean's denominator, as slime's per-rollout denominators keep
    it. Deliberate difference: slime's own defaults are [0, 2] (its `--tis-clip-low`, `--tis-clip`);
    ours are the paper's [0.5, 5]. At one SGD step per batch r = 1:
    1[α ≤ ρ_tok ≤ β] · ρ_tok · A · ∇ℓ(y)."""
    b = token_logp(t)
    k = torch.exp(t.old - t.e)
    drop = (k < p.icepop_low) | (k > p.icepop_high)
    k = torch.where(drop, torch.zeros_like(k), k)
    surrogate, ratio, off = ppo_surrogate(t, b, p.ppo_eps)
    return CorrectionLoss(-(k * surrogate).mean(), TokenWeights(k * ratio * ~off, clipped=off, masked=drop))


@register_correction("decoupled_ppo")
def decoupled_ppo(t: TokenTerms, p: CorrectionParams) -> CorrectionLoss:
    """AReaL's decoupled PPO (inclusionAI/AReaL@4aef98d, areal/utils/functional/functional.py:
    `ppo_actor_loss_fn` with `use_decoupled_loss`): the behaviour policy
    is the engine (e); the proximal policy is the trainer recomputed at the current parameters
    before this batch's SGD steps (`old`), as AReaL's default `prox_logp_method="recompute"` does,
    not θ_s as the issue that asked for it read it. Loss: w · min(u·A, clip(u, 1 ± ε)·A),
    u = exp(b − old), ε = `ppo_eps`, w = π_prox/π_behav = exp(old − e), with AReaL's
    `rejection_sampling` {level: token, action: mask, metric: ratio, lower: `behav_weight_low`,
    upper: `behav_weight_cap`} (`apply_rejection_sampling`): a token whose w lies outside
    [lower, upper] (inclusive bounds, no bound on log w) is dropped and stays in the token mean's
    denominator (AReaL divides by the loss mask's count before rejection). The same orientation
    and units as AReaL's metric "ratio", so its bounds mean the same here; lower 0 is AReaL's
    `lower: null`. Our default upper 5 is the old `behave_imp_weight_cap` default that AReaL's
    migration note maps to this setting; AReaL's current default is no rejection
    (`rejection_sampling: null`). The other settings (sequence level, clamp, k1–k3 metrics) are
    not offered. At one SGD step per batch u = 1: the engine-ratio IS with the band as a mask."""
    behav = torch.exp(t.old - t.e)
    drop = (behav > p.behav_weight_cap) | (behav < p.behav_weight_low)
    behav = torch.where(drop, torch.zeros_like(behav), behav)
    surrogate, ratio, off = ppo_surrogate(t, token_logp(t), p.ppo_eps)
    return CorrectionLoss(-(behav * surrogate).mean(), TokenWeights(behav * ratio * ~off, clipped=off, masked=drop))


# verl's bound on GSPO's log ratio (`compute_policy_loss_gspo`: clamp(max=10) "for numerical stability")
GSPO_LOG_RATIO_CAP = 10.0


@register_correction("gspo")
def gspo(t: TokenTerms, p: CorrectionParams) -> CorrectionLoss:
    """GSPO (Zheng et al., arXiv 2507.18071), token-level gradient as verl's `compute_policy_loss_gspo`
    (volcengine/verl@b178a3c, verl/trainer/ppo/core_algos.py):
    with the length-normalised sequence ratio s_i = exp(mean_{t∈i} (b − old)) against θ_old (the
    trainer before this batch), each token's ratio is s_i,t = sg(s_i) · π(y_t)/sg(π(y_t)) (the
    value s_i, the gradient s_i·∇ℓ(y_t)), its log capped at 10 (as verl), clipped at
    [1 − `gspo_clip_low`, 1 + `gspo_clip_high`] (3e-4, 4e-4: the paper's Sec. 5.1, verl's GSPO
    examples), and the loss is a sequence mean of token means ("seq-mean-token-mean", which verl
    forces for GSPO):
        L = −(1/B) Σ_i (1/|y_i|) Σ_t min(s_i,t·A_i, clip(s_i,t)·A_i).
    Per token the gradient is A_i · s_i · ∇ℓ(y_t) / (B·|y_i|), 0 where the clip binds (a whole
    sequence at once: A > 0 and s_i > 1 + high, or A < 0 and s_i < 1 − low). It takes 4 SGD steps
    per batch (the registry's `updates_per_batch`: the paper's 4 mini-batches, verl's examples keep
    them), each on the whole batch here, as `ppo_multi`; at the first s_i = 1 and the term is a
    length-normalised `pg`, A_i·∇ℓ(y_t)/(B·|y_i|), so even on-policy its gradient differs from
    `pg`'s token mean by that weighting. θ_old is the trainer, as verl's decoupled mode; in verl's
    bypass mode (and the paper's suggestion of using the engine's likelihoods) π_old would be the
    engine, which this cell does not do. Its weight diagnostic is s_i (0 where clipped); the
    1/(B·|y_i|) is the aggregation, not the weight."""
    b = token_logp(t)
    log_s = per_sequence_mean(sg(b) - t.old, t)[t.seq]
    s = torch.exp(torch.clamp(log_s + b - sg(b), max=GSPO_LOG_RATIO_CAP))
    surrogate, off = clipped_surrogate(s, t.adv, p.gspo_clip_low, p.gspo_clip_high)
    loss = -per_sequence_mean(surrogate, t).mean()
    return CorrectionLoss(loss, TokenWeights(sg(s) * ~off, clipped=off), mean_over=t.num_seqs)


# torchtitan's bound on a token's log ratio before its weight (`_MAX_LOG_RATIO` in torchtitan/rl/losses/dapo.py)
CENTER_TIS_LOG_RATIO_BOUND = 10.0


@register_correction("center_tis")
def center_tis(t: TokenTerms, p: CorrectionParams) -> CorrectionLoss:
    """Score centring with truncated IS (SC+TIS, "Score centering stabilizes off-policy RL",
    arXiv:2609.20807, as its torchtitan `ScoreCenteringLoss` computes it): with w(v) =
    min(π(v; θ_t)/q(v), C) (C: `clip_c`, 2 there), the term is
        A · [w(y) ∇ℓ(y) − Σ_v q(v) w(v) ∇ℓ(v)],
    the truncated-IS score minus its exact expectation under the engine at the prefix: a
    control variate, zero-mean per prefix. In logit space its direction is
    w(y)·onehot(y) − m − (w(y) − Σ m)·π with m = q·w. The sampled token's w(y) has its log ratio
    bounded to ±10 first, as torchtitan bounds it (`_MAX_LOG_RATIO` of its DAPO loss); the
    expectation's m = min(π, C·q) is not bounded, as there. The issue that asked for it read it as
    `center` with q̃ ∝ q·min(exp(λ), C) times min(ρ_tok, C); this follows the publication. Its
    tail outside the engine's top-k is spread like θ_s (`engine_distribution`), where the
    publication lumps the tail into one term (q outside the top-k modelled as π rescaled to the
    engine's tail mass): the same where k covers the vocabulary, as on the tiny model.

    Peer read: felipemello1/torchtitan@55d886f68746d64c494f2cab6d21531d33ed5941,
    torchtitan/rl/losses/score_centering.py (not in pytorch/torchtitan at b5bcd76). Its w(y) reads
    the engine's log-prob of the token (e); ours reads q(y) from the top-k distribution, the same
    number where k covers the vocabulary."""
    logp = t.logp()
    pi = torch.exp(sg(logp))
    w_all = torch.clamp(pi / t.q.clamp_min(1e-30), max=p.clip_c)
    m = t.q * w_all
    ratio = (pi / t.q.clamp_min(1e-30)).gather(-1, t.tokens[:, None]).squeeze(-1)  # the weight before truncation
    bound = math.exp(CENTER_TIS_LOG_RATIO_BOUND)
    w = torch.clamp(torch.clamp(ratio, 1 / bound, bound), max=p.clip_c)
    onehot = torch.nn.functional.one_hot(t.tokens, t.logits.shape[-1]).to(pi.dtype)
    direction = w[:, None] * onehot - m - (w - m.sum(-1))[:, None] * pi
    loss = -(t.adv * (sg(direction) * t.logits.float()).sum(-1)).mean()
    return CorrectionLoss(loss, TokenWeights(w, clipped=ratio > p.clip_c))


# ----------------------------------------------------------------------------- diagnostics

def weight_diagnostics(w: TokenWeights, seq: torch.Tensor, num_seqs: int) -> dict[str, float]:
    """The correction's per-step diagnostics over a whole batch (`w` and `seq` concatenated over
    its micro-batches): mean and max token weight (over finite weights), the share of tokens whose
    weight was truncated, the share of tokens and of sequences dropped whole, and how many weights
    are not finite."""
    weight = w.weight.detach().double().cpu()
    finite = torch.isfinite(weight)
    n = max(weight.numel(), 1)
    share = lambda m: float(m.sum()) / n if m is not None else 0.0  # noqa: E731
    masked_seqs = 0.0
    if w.masked is not None and num_seqs:
        seq = seq.cpu()
        kept_tokens = torch.bincount(seq[~w.masked.cpu()], minlength=num_seqs)
        has_tokens = torch.bincount(seq, minlength=num_seqs) > 0
        masked_seqs = float(((kept_tokens == 0) & has_tokens).sum()) / max(int(has_tokens.sum()), 1)
    return {
        "corr_weight_mean": float(weight[finite].mean()) if finite.any() else float("nan"),
        "corr_weight_max": float(weight[finite].max()) if finite.any() else float("nan"),
        "corr_clipped_share": share(w.clipped.cpu() if w.clipped is not None else None),
        "corr_masked_share": share(w.masked.cpu() if w.masked is not None else None),
        "corr_masked_seq_share": masked_seqs,
        "corr_nonfinite": float((~finite).sum()),
    }


def concat_weights(parts: list[TokenWeights]) -> TokenWeights:
    """One TokenWeights for a batch from its micro-batches' (in token order)."""
    cat = lambda xs: torch.cat([x.detach().cpu() for x in xs])  # noqa: E731
    flags = {}
    for name in ("clipped", "masked"):
        got = [getattr(w, name) for w in parts]
        flags[name] = None if all(x is None for x in got) else cat(
            [x if x is not None else torch.zeros_like(w.weight, dtype=torch.bool) for x, w in zip(got, parts)])
    return TokenWeights(cat([w.weight for w in parts]), **flags)


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
