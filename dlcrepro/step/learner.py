"""The learner's maths: θ_t, θ_s and θ_0 in the trainer's numerics, and what a step computes with
them, micro-batched: the batch's advantages, the trainer's log-probs at θ_s and θ_t, the probe
gradients, the correction's update direction and the SGD update. No engine, no data, no files:
`train.Trainer` adds those; `gpu_check` and `bench/` drive a Learner alone at the paper's sizes.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import torch

from .corrections import CorrectionParams, TokenTerms, concat_weights, engine_distribution, get_correction, weight_diagnostics
from .diagnostics import kl_rows
from .engine import Rollout
from .model import TokenBatch, make_token_batch, response_logits, token_logprobs


@dataclass
class Scored:
    """A rollout laid out for the trainer, with rewards and per-token advantages."""

    tb: TokenBatch
    rewards: torch.Tensor  # (B,)
    adv_tok: torch.Tensor  # (N,)

    @classmethod
    def of(cls, rollout: Rollout, rewards: list[float], num_groups: int, pad_id: int, device: torch.device) -> "Scored":
        """A rollout and its responses' rewards (one per response), laid out on `device`."""
        rewards = torch.tensor(rewards, dtype=torch.float32)
        adv = advantages(rewards, rollout.group, num_groups)
        tb = make_token_batch(rollout.prompt_ids, rollout.response_ids, pad_id)
        return cls(tb.to(device), rewards, adv.to(device)[tb.seq])


def advantages(rewards: torch.Tensor, group: torch.Tensor, num_groups: int) -> torch.Tensor:
    """`(B,)` A_i = r_i − mean(r over the responses of the same prompt) (no std scaling)."""
    sums = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group, rewards.double())
    counts = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group, torch.ones_like(rewards, dtype=torch.float64))
    return (rewards.double() - (sums / counts)[group]).float()


def flat_grad(loss: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])


def flat_params(params: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params]).clone()


@dataclass
class Probes:
    """What a probe step measures on-policy: the `pg` gradients of two independent batches at θ_t
    (their squared distance is the noise floor) and the first batch's `(N,)` log-probs under θ_0."""

    g_on: torch.Tensor
    g_on2: torch.Tensor
    logp_0: torch.Tensor


@dataclass
class KeptLogits:
    """θ_t's logits of a one-micro-batch batch, with their graph, and θ_s's log-distribution:
    computed for the log-probs, reused by the correction."""

    logits_t: torch.Tensor | None
    logp_s: torch.Tensor


@dataclass
class BatchLogProbs:
    """The trainer's view of a sampled batch: `a` `(N,)` log π(y; θ_s) and `b` `(N,)` log π(y; θ_t)
    (no gradient) and the mean KL(π_θs ‖ π_θt) per prefix."""

    a: torch.Tensor
    b: torch.Tensor
    kl_sampler: float


@dataclass
class Batch:
    """A sampled batch as the learner uses it, with what its log-probs' pass kept for the correction.

    `kept`: θ_t's logits (with their graph) and θ_s's `(N, V)` log-distribution of a batch that fits
    in one micro-batch (None: each pass computes them chunk by chunk). The first correction pass
    spends the logits (its backward frees their graph); θ_s's distribution serves every pass at
    this θ_s (PPO's later epochs) until `release_sampler_distribution`."""

    rollout: Rollout
    scored: Scored  # the rollout laid out for the trainer, with rewards and advantages
    trainer_logp: BatchLogProbs  # the trainer's `(N,)` log-probs at θ_s and θ_t, the sampler KL
    engine_logp: torch.Tensor  # the engine's `(N,)` log-probs of the sampled tokens, on the trainer's device
    synced: bool  # θ_s was θ_t
    metrics: dict[str, float] = field(default_factory=dict)  # the batch's metrics (diagnostics.step_metrics "batch")
    kept: KeptLogits | None = None

    def spend_logits(self) -> torch.Tensor | None:
        """θ_t's kept logits, once: a backward through them frees their graph."""
        if self.kept is None:
            return None
        logits, self.kept.logits_t = self.kept.logits_t, None
        return logits

    @property
    def sampler_distribution(self) -> torch.Tensor | None:
        """θ_s's kept `(N, V)` log-distribution of the batch, or None."""
        return self.kept.logp_s if self.kept is not None else None

    def release_sampler_distribution(self) -> None:
        """Free what the batch kept (θ_t's logits and θ_s's distribution): no later pass reads them."""
        self.kept = None


class Learner:
    """The trainer's models and their micro-batched math, with no engine and no data: θ_t
    (`policy`, updated by SGD), θ_s (`sampler_model`, the copy the sampler holds) and θ_0
    (`initial_model`), all the same module class in the same numerics.

    `train.Trainer` adds the engines and the task; `gpu_check` drives a Learner alone at the
    paper's model sizes to measure a step's trainer time and memory."""

    def __init__(self, policy: torch.nn.Module, tcfg, correction: str, trainer_dtype: str, device: torch.device):
        self.tcfg, self.device = tcfg, device
        self.correction = get_correction(correction)
        self.cparams = CorrectionParams.from_train(tcfg)
        self.autocast = torch.bfloat16 if trainer_dtype == "bfloat16" else None
        self.policy = policy.to(device)
        self.policy.train()
        self.sampler_model = copy.deepcopy(self.policy).eval().requires_grad_(False)
        self.initial_model = copy.deepcopy(self.policy).eval().requires_grad_(False)
        self.params = [p for p in self.policy.parameters() if p.requires_grad]
        self.opt = torch.optim.SGD(self.params, lr=tcfg.lr)

    @contextmanager
    def correcting_as(self, name: str):
        """Inside the block, `correction_grad` computes correction `name`'s direction (the batch-size
        scan measures several corrections on one batch); the Learner's own again after it."""
        own = self.correction
        self.correction = get_correction(name)
        try:
            yield
        finally:
            self.correction = own

    def micro_batches(self, tb: TokenBatch) -> list[tuple[TokenBatch, slice]]:
        """`tb` in the trainer's forwards: at most `micro_batch` sequences and `micro_batch_tokens`
        padded tokens each, each cut to its own longest sequence (`TokenBatch.chunks`)."""
        return tb.chunks(self.tcfg.micro_batch, self.tcfg.micro_batch_tokens)

    def logits(self, model, tb: TokenBatch) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=self.autocast, enabled=self.autocast is not None):
            return response_logits(model, tb, self.tcfg.micro_batch, self.tcfg.micro_batch_tokens)

    def pg_grad(self, s: Scored) -> torch.Tensor:
        """The on-policy `pg` gradient of a probe batch (mean over its tokens), micro-batched."""
        n, g = s.tb.tokens.numel(), None
        for sub, sl in self.micro_batches(s.tb):
            logp = token_logprobs(self.logits(self.policy, sub), sub.tokens)
            gi = flat_grad(-(s.adv_tok[sl] * logp).sum() / n, self.params)
            g = gi if g is None else g.add_(gi)
            del gi  # else the summed gradient's size again stays alive through the next forward
        return g

    def probe(self, probes: list[Scored]) -> "Probes":
        """The on-policy gradients g_on, g_on′ of two probe batches, and the first batch's tokens'
        log-probs under θ_0 (its off-support share)."""
        g_on, g_on2 = (self.pg_grad(p) for p in probes)
        return Probes(g_on, g_on2, self.token_logp(self.initial_model, probes[0].tb).cpu())

    def token_logp(self, model, tb: TokenBatch) -> torch.Tensor:
        """`(N,)` log π(y|p) of each response token under `model`, no gradient, micro-batched."""
        with torch.no_grad():
            return torch.cat([token_logprobs(self.logits(model, sub), sub.tokens) for sub, _ in self.micro_batches(tb)])

    def sampler_logp(self, sub: TokenBatch, synced: bool, logp_t: torch.Tensor | None) -> torch.Tensor:
        """`(n, V)` trainer log π(·|p; θ_s) of a micro-batch (θ_t's own when the sampler is synced)."""
        if synced:  # θ_s is θ_t: the same numbers
            return logp_t
        with torch.no_grad():
            return torch.log_softmax(self.logits(self.sampler_model, sub), -1)

    def sampler_logp_of_logits(self, sub: TokenBatch, synced: bool, logits_t: torch.Tensor) -> torch.Tensor:
        """`sampler_logp` from θ_t's logits of the micro-batch (their log-softmax only where synced)."""
        return self.sampler_logp(sub, synced, torch.log_softmax(logits_t.detach(), -1) if synced else None)

    def batch(self, rollout: Rollout, s: Scored, synced: bool) -> Batch:
        """The scored rollout with the trainer's log-probs (`log_probs`), the engine's on the
        trainer's device and what the log-probs' pass kept for the correction."""
        lp, kept = self.log_probs(s, synced)
        return Batch(rollout, s, lp, rollout.engine_logp.to(self.device), synced, kept=kept)

    def log_probs(self, s: Scored, synced: bool) -> tuple[BatchLogProbs, KeptLogits | None]:
        """Trainer log-probs of the sampled tokens at θ_s (a) and θ_t (b), and the mean
        full-vocabulary KL(π_θs ‖ π_θt) over the batch's prefixes.

        A batch that fits in one micro-batch keeps θ_t's logits with their graph (and θ_s's
        distribution) for the correction; a larger one is recomputed there chunk by chunk, so
        that no `(N, V)` tensor of the whole batch is ever held (Qwen3's V is 151,936)."""
        chunks = self.micro_batches(s.tb)
        keep = len(chunks) == 1
        a, b, kl = [], [], 0.0
        kept = None
        for sub, _ in chunks:
            with torch.set_grad_enabled(keep):
                logits_t = self.logits(self.policy, sub)
            logp_t = torch.log_softmax(logits_t.detach(), -1)
            logp_s = self.sampler_logp(sub, synced, logp_t)
            tok = sub.tokens[:, None]
            a.append(logp_s.gather(-1, tok).squeeze(-1))
            b.append(logp_t.gather(-1, tok).squeeze(-1))
            kl += float(kl_rows(logp_s, logp_t).sum())
            if keep:
                kept = KeptLogits(logits_t, logp_s)
            del logits_t, logp_t, logp_s  # else three (n, V) tensors stay alive through the next forward
        return BatchLogProbs(a=torch.cat(a), b=torch.cat(b), kl_sampler=kl / max(s.tb.tokens.numel(), 1)), kept

    def correction_grad(self, batch: Batch, *, epoch: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
        """The correction's update direction (the gradient of its token-mean loss, summed over
        micro-batches, each chunk's loss weighted by its share of the batch's tokens, or of the
        terms its mean is over: `CorrectionLoss.mean_over`) and its diagnostics over the batch
        (`corrections.weight_diagnostics`), at θ_t as it is now: `epoch` is the SGD step on this
        batch it is for (0 the first; PPO's later epochs, `update`, see the moved θ). θ_old is
        `trainer_logp.b`, the trainer before this batch. θ_s's `(N, V)` log-distribution is the
        batch's kept one (`Batch.sampler_distribution`) where its log-probs' pass kept one; else θ_s's
        forward per micro-batch, run only where the correction (or its q) reads the distribution."""
        s, rollout, e, lp = batch.scored, batch.rollout, batch.engine_logp, batch.trainer_logp
        synced = batch.synced and epoch == 0  # θ_t is still θ_s: its distribution is θ_s's
        logp_s = batch.sampler_distribution
        n, g, weights, terms_total = s.tb.tokens.numel(), None, [], 0
        for sub, sl in self.micro_batches(s.tb):
            # θ_s's distribution is given as a function: its forward (a lagged sampler's batch in
            # several micro-batches) runs only where it is read, by q below or by the correction
            logits_t = batch.spend_logits()  # the log-probs' pass's (one micro-batch), for the first pass only
            if logits_t is None:  # θ at this moment (PPO's later epochs see the updated θ)
                logits_t = self.logits(self.policy, sub)
            logp_s_of = (partial(logp_s.__getitem__, sl) if logp_s is not None
                         else partial(self.sampler_logp_of_logits, sub, synced, logits_t))
            terms = TokenTerms(logits=logits_t, tokens=sub.tokens, adv=s.adv_tok[sl], e=e[sl], a=lp.a[sl], old=lp.b[sl],
                               q=None, logp_s_of=logp_s_of, seq=sub.seq, num_seqs=sub.num_seqs)
            if self.correction.needs_q:
                terms.q = engine_distribution(rollout.topk_ids[sl].to(self.device), rollout.topk_logp[sl].to(self.device),
                                              terms.logp_s)
            out = self.correction.fn(terms, self.cparams)
            share = sub.tokens.numel() if out.mean_over is None else out.mean_over  # the terms its mean is over
            gi = flat_grad(out.loss * (share / n), self.params)
            g = gi if g is None else g.add_(gi)
            weights.append(out.weights)
            terms_total += share
            # else this micro-batch's (n, V) logits, θ_s log-distribution and q, and a gradient the
            # size of the model, stay alive through the next one's forward: 8.9 GiB of a Qwen3-0.6B
            # paper step's peak (docs/cluster.md, "Memory and time model")
            del logits_t, logp_s_of, terms, out, gi
        if terms_total != n:  # a mean over other terms (kept tokens, sequences): Σ_chunks (chunk sum) / (all terms)
            g.mul_(n / max(terms_total, 1))
        return g, weight_diagnostics(concat_weights(weights), s.tb.seq, s.tb.num_seqs)

    def sgd_step(self, g: torch.Tensor) -> None:
        """One SGD step of the policy along the flat direction `g` (θ ← θ − lr·g)."""
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = g[offset : offset + n].view_as(p)  # a view: SGD reads it, never writes it
            offset += n
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def update(self, batch: Batch, g: torch.Tensor, *, updates: int) -> torch.Tensor:
        """The correction's `updates` SGD steps on one batch: the first along `g` (its direction at
        θ_t, `correction_grad`), each further one (PPO's epochs, `registry.updates_per_batch`) along a
        fresh gradient at the moved θ with the same θ_old and the same θ_s: the batch's kept
        distribution where it has one (a one-micro-batch batch, θ_t's own where the sampler was
        synced), else from the sampler's copy where it is read (θ has moved; where the sampler was
        synced the copy is θ_t before the step). Then the batch releases its kept distribution.
        Returns the run's update direction over all its steps: `g` for one, else
        (θ_before − θ_after) / lr, the one SGD step that lands there."""
        if updates == 1:
            batch.release_sampler_distribution()
            self.sgd_step(g)
            return g
        before = flat_params(self.params)
        for u in range(updates):
            self.sgd_step(g if u == 0 else self.correction_grad(batch, epoch=u)[0])
        batch.release_sampler_distribution()
        return (before - flat_params(self.params)) / self.tcfg.lr
