"""One grid cell: model x sampler x correction x seed, from warm start to summary.

Each step, top to bottom: sync (schedule) → sample → score → trainer log-probs at θ_t and θ_s →
resync check → on-policy probes → correction → deviation and floor → SGD update → eval →
checkpoint. Every random draw is seeded from (seed, step, purpose), so a resumed run is
identical to an uninterrupted one.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import shutil
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml
from tqdm import tqdm

from . import analysis, checkpoint, countdown, data, paths, rollouts, tracking
from .cluster import check_device
from .config import Config, ConfigError, to_dict
from .corrections import CorrectionParams, TokenTerms, concat_weights, engine_distribution, get_correction, weight_diagnostics
from .diagnostics import dev_ratio, kl_rows, mismatch_metrics, off_support_share, squared_distance
from .engine import Rollout, SyncCheckError, VLLMEngine
from .grid import computed_as, get_sampler
from .initial_eval import identity as initial_identity
from .initial_eval import load_initial_eval
from .model import TokenBatch, load_model, load_tokenizer, make_token_batch, response_logits, token_logprobs
from .registry import engine_topk, updates_per_batch
from .util import DamagedFileError, Diverged, NonFiniteError, atomic_save, atomic_write_text, disk_full, log, remove_leftovers

PHASES = ("sync", "sample", "score", "logprobs", "resync", "probe", "correction", "update", "eval", "checkpoint")
METRICS_FILE, SUMMARY_FILE, CONFIG_FILE, CKPT_FILE, LOG_FILE = (
    "metrics.parquet",
    "summary.json",
    "config.yaml",
    "checkpoint.pt",
    "train.log",
)


def derive_seed(seed: int, step: int, purpose: str) -> int:
    """A 32-bit seed that depends only on (run seed, step, purpose)."""
    ss = np.random.SeedSequence([seed, step, zlib.crc32(purpose.encode())])
    return int(ss.generate_state(1, dtype=np.uint32)[0])


def step_problems(seed: int, step: int, pool: int, n: int) -> list[int]:
    """The indices of step `step`'s `n` training problems, drawn without replacement from the first
    `pool` (the RL pool): the same in every cell of a seed, whatever its sampler or correction."""
    rng = np.random.default_rng(derive_seed(seed, step, "prompts"))
    return rng.choice(pool, size=n, replace=False).tolist()


class PhaseTimer:
    """Wall seconds per phase of the current step."""

    def __init__(self):
        self.sec = dict.fromkeys(PHASES, 0.0)

    @contextmanager
    def __call__(self, phase: str):
        t = time.perf_counter()
        # names the phase in a torch profile (bench/cell_profile.py); a few µs when none records
        with torch.profiler.record_function(f"phase:{phase}"):
            yield
        self.sec[phase] += time.perf_counter() - t


@dataclass
class Scored:
    """A rollout laid out for the trainer, with rewards and per-token advantages."""

    tb: TokenBatch
    rewards: torch.Tensor  # (B,)
    adv_tok: torch.Tensor  # (N,)


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
class Cell:
    """The state of one run that a checkpoint holds."""

    step: int = 0  # updates done
    sampler_version: int = 0  # version of θ_s (= number of updates it has)
    rows: list[dict] = field(default_factory=list)
    resync_steps: list[int] = field(default_factory=list)
    initial: dict = field(default_factory=dict)  # the accuracies of θ_0, measured before step 1
    diverged_at_step: int | None = None  # the first step a diverged run could not complete (docs/method.md#diverged-runs)


@dataclass
class KeptLogits:
    """θ_t's logits of a one-micro-batch batch, with their graph, and θ_s's log-distribution:
    computed for the log-probs, reused by the correction."""

    logits_t: torch.Tensor
    logp_s: torch.Tensor


@dataclass
class BatchLogProbs:
    """The trainer's view of a sampled batch: `a` `(N,)` log π(y; θ_s) and `b` `(N,)` log π(y; θ_t)
    (no gradient), the mean KL(π_θs ‖ π_θt) per prefix, and the kept logits (None: recompute)."""

    a: torch.Tensor
    b: torch.Tensor
    kl_sampler: float
    kept: KeptLogits | None


class Learner:
    """The trainer's models and their micro-batched math, with no engine and no data: θ_t
    (`policy`, updated by SGD), θ_s (`sampler_model`, the copy the sampler holds) and θ_0
    (`initial_model`), all the same module class in the same numerics.

    `Trainer` adds the engines and the task; `gpu_check` drives a Learner alone at the paper's
    model sizes to measure a step's trainer time and memory."""

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

    def state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.policy.state_dict().items()}

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

    def probe(self, probes: list[Scored]) -> tuple[torch.Tensor, torch.Tensor, float]:
        """The on-policy gradients g_on, g_on′ of two probe batches, and the first batch's
        off-support share under θ_0."""
        g_on, g_on2 = (self.pg_grad(p) for p in probes)
        logp_0 = self.token_logp(self.initial_model, probes[0].tb)
        return g_on, g_on2, off_support_share(logp_0.cpu(), self.tcfg.off_support_threshold)

    def token_logp(self, model, tb: TokenBatch) -> torch.Tensor:
        """`(N,)` log π(y|p) of each response token under `model`, no gradient, micro-batched."""
        with torch.no_grad():
            return torch.cat([token_logprobs(self.logits(model, sub), sub.tokens) for sub, _ in self.micro_batches(tb)])

    def sampler_logp(self, sub: TokenBatch, synced: bool, logp_t: torch.Tensor) -> torch.Tensor:
        """`(n, V)` trainer log π(·|p; θ_s) of a micro-batch (θ_t's own when the sampler is synced)."""
        if synced:  # θ_s is θ_t: the same numbers
            return logp_t
        with torch.no_grad():
            return torch.log_softmax(self.logits(self.sampler_model, sub), -1)

    def log_probs(self, s: Scored, synced: bool) -> "BatchLogProbs":
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
        return BatchLogProbs(a=torch.cat(a), b=torch.cat(b), kl_sampler=kl / max(s.tb.tokens.numel(), 1), kept=kept)

    def correction_grad(self, s: Scored, rollout: Rollout, e: torch.Tensor, lp: "BatchLogProbs", synced: bool,
                        kept: "KeptLogits | None") -> tuple[torch.Tensor, dict[str, float]]:
        """The correction's update direction (the gradient of its token-mean loss, summed over
        micro-batches, each chunk's loss weighted by its share of the batch's tokens, or of the
        terms its mean is over: `CorrectionLoss.mean_over`) and its diagnostics over the batch
        (`corrections.weight_diagnostics`). θ_old is `lp.b`, the trainer before this batch."""
        n, g, weights, terms_total = s.tb.tokens.numel(), None, [], 0
        for sub, sl in self.micro_batches(s.tb):
            if kept is not None:
                logits_t, logp_s = kept.logits_t, kept.logp_s
            else:  # θ at this moment (PPO's later epochs see the updated θ), θ_s as sampled
                # (`synced`: θ_t still equals θ_s, so its distribution is θ_s's)
                logits_t = self.logits(self.policy, sub)
                logp_s = self.sampler_logp(sub, synced, torch.log_softmax(logits_t.detach(), -1))
            q = None
            if self.correction.needs_q:
                q = engine_distribution(rollout.topk_ids[sl].to(self.device), rollout.topk_logp[sl].to(self.device), logp_s)
            terms = TokenTerms(logits=logits_t, tokens=sub.tokens, adv=s.adv_tok[sl], e=e[sl], a=lp.a[sl], old=lp.b[sl],
                               q=q, logp_s=logp_s, seq=sub.seq, num_seqs=sub.num_seqs)
            out = self.correction.fn(terms, self.cparams)
            share = sub.tokens.numel() if out.mean_over is None else out.mean_over  # the terms its mean is over
            gi = flat_grad(out.loss * (share / n), self.params)
            g = gi if g is None else g.add_(gi)
            weights.append(out.weights)
            terms_total += share
            # else this micro-batch's (n, V) logits, θ_s log-distribution and q, and a gradient the
            # size of the model, stay alive through the next one's forward: 8.9 GiB of a Qwen3-0.6B
            # paper step's peak (docs/cluster.md, "Memory and time model")
            del logits_t, logp_s, q, terms, out, gi
        if terms_total != n:  # a mean over other terms (kept tokens, sequences): Σ_chunks (chunk sum) / (all terms)
            g.mul_(n / max(terms_total, 1))
        return g, weight_diagnostics(concat_weights(weights), s.tb.seq, s.tb.num_seqs)

    def _apply(self, g: torch.Tensor) -> None:
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = g[offset : offset + n].view_as(p)  # a view: SGD reads it, never writes it
            offset += n
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class Trainer(Learner):
    """A Learner with the run's engines and task: samples, scores and takes whole steps."""

    def __init__(self, cfg: Config, model_name: str, sampler: str, correction: str, seed: int, model_dir: Path):
        self.cfg, self.seed = cfg, seed
        self.sampler = get_sampler(sampler)
        mcfg = cfg.models[model_name]
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = load_tokenizer(model_dir)
        self.train_problems, self.test_problems = data.load_problems(cfg.task)
        super().__init__(load_model(model_dir), cfg.train_for(model_name), correction, mcfg.trainer_dtype, device)
        # the problems RL draws its prompts from: a pool of the first `pool_size` (0: all)
        self.rl_problems = self.train_problems[: self.tcfg.pool_size or len(self.train_problems)]
        self._prompt_cache: dict[int, list[int]] = {}  # train prompts are encoded when first drawn
        self.test_prompts = data.encode_prompts(self.tokenizer, self.test_problems, cfg.task.prompt)
        # the problems test_accuracy is measured on: the held-out test set, or the RL pool itself
        if self.tcfg.eval_on == "pool":
            self.eval_problems = self.rl_problems
            self.eval_prompts = data.encode_prompts(self.tokenizer, self.eval_problems, cfg.task.prompt)
        else:
            self.eval_problems, self.eval_prompts = self.test_problems, self.test_prompts
        # engines take the model's own context length
        self.engine = VLLMEngine(str(model_dir), cfg.engine, self.sampler.precision, seed)
        # The on-policy probe/eval engine is BF16 synced to θ_t: for the always-synced bf16 sampler
        # that is the run's own engine.
        shared = self.sampler.precision == "bf16" and self.sampler.always_synced
        self.probe_engine = self.engine if shared else VLLMEngine(str(model_dir), cfg.engine, "bf16", seed)
        self.probe_version = -1
        self.sync_checks: list[dict] = []  # one per checked weight sync: engine, version, discrepancy, seconds
        # per engine role (engine_role): the largest |weight| of the last version it matched; saved in
        # the checkpoint, so that a resumed run judges a failed check as an uninterrupted one does
        self.matched_weight_max: dict[str, float] = {}
        self.ckpt_on_disk: dict | None = None  # the sidecar entry of the checkpoint file on disk (checkpoint.save)
        self.topk = engine_topk(correction, cfg.engine)
        self.shared_rollouts: dict[int, Rollout] = {}  # step -> the batch this sampler's cells share (rollouts.py; set by train_cell)
        if self.correction.needs_q and self.topk < 1:
            raise ConfigError(f"engine.topk={self.topk}: correction {correction!r} reads the engine's next-token distribution; it must be >= 1")

    # ------------------------------------------------------------------ pieces of a step

    def push_weights(self, engine: VLLMEngine, model: torch.nn.Module, version: int,
                     expected: torch.nn.Module | None = None) -> None:
        """`model`'s weights into `engine` as `version`, checked twice. First the load manifest
        (`engine.load_weights`): every tensor taken, every engine parameter reloaded, each engine
        tensor's fingerprint that of `expected`'s weights (the trainer's copy of that version; default
        `model`); a wrong load raises WeightLoadError and stops the run, always. Then the sync check
        (`engine.sync_check`): the engine's teacher-forced log-probs of a few sequences against
        `model`'s. A failed check raises SyncCheckError and stops the run, unless the weights have
        grown BLOWUP-fold or more (largest |weight|) since the last version this engine matched: the
        load being right (the manifest passed), what the engine cannot compute is weights an update
        blew up (Diverged; docs/method.md#diverged-runs)."""
        state = {k: v.detach() for k, v in model.state_dict().items()}
        want = None if expected is None else {k: v.detach() for k, v in expected.state_dict().items()}
        engine.load_weights(state, version, expected=want)  # WeightLoadError: a fault, never a divergence
        if not self.cfg.engine.sync_check:
            return
        top = largest_abs_weight(model.parameters())
        t = time.perf_counter()

        def trainer_logp(prompts: list[list[int]], responses: list[list[int]]) -> torch.Tensor:
            return self.token_logp(model, make_token_batch(prompts, responses, self.tokenizer.pad_token_id).to(self.device))

        role = self.engine_role(engine)
        try:
            d = engine.check_sync(trainer_logp, self.eval_prompts)
        except SyncCheckError as e:
            matched = self.matched_weight_max.get(role)
            if matched is None or top < BLOWUP * matched:
                raise
            raise Diverged(version, f"θ_{version}'s largest |weight| is {top:.4g}, {top / matched:.0f}x that of the last version the {engine.kind} engine "
                                    f"matched, and the engine no longer computes its policy ({str(e).split('; ')[0]}): the run diverged") from e
        if not math.isnan(d):  # a check that cannot tell (no likely token) matched nothing: the baseline stays
            self.matched_weight_max[role] = top
        sec = time.perf_counter() - t
        self.sync_checks.append({"engine": engine.kind, "version": version, "discrepancy": d, "seconds": sec})
        log(f"sync check: {engine.kind} engine holds version {version} (load manifest {1e3 * engine.manifest_seconds:.0f} ms): "
            f"mean |log q − log π| {d:.4f}/token (bound {engine.precision.sync_bound}) in {sec:.2f} s")

    def engine_role(self, engine: VLLMEngine) -> str:
        """"sampler" or "probe": an engine's name in the growth baselines, the same in every process."""
        return "sampler" if engine is self.engine else "probe"

    def sync_sampler(self, cell: Cell) -> None:
        """θ_s ← θ_t, pushed to the run's engine (unless it already holds this version of θ_t)."""
        version = cell.step
        self.sampler_model.load_state_dict(self.policy.state_dict())
        if self.engine.version != version:
            self.push_weights(self.engine, self.sampler_model, version, expected=self.policy)
        if self.probe_engine is self.engine:
            self.probe_version = version
        cell.sampler_version = version

    def sync_probe(self, version: int) -> None:
        if self.probe_version != version:
            self.push_weights(self.probe_engine, self.policy, version)
            self.probe_version = version

    def prompts_for(self, step: int) -> tuple[list[int], list[list[int]]]:
        """The step's training problems (indices) and their prompt token ids."""
        idx = step_problems(self.seed, step, len(self.rl_problems), self.tcfg.prompts_per_step)
        new = [i for i in idx if i not in self._prompt_cache]
        for i, ids in zip(new, data.encode_prompts(self.tokenizer, [self.train_problems[i] for i in new], self.cfg.task.prompt)):
            self._prompt_cache[i] = ids
        return idx, [self._prompt_cache[i] for i in idx]

    def shared_rollout(self, k: int, cell: Cell, prompts: list[list[int]]) -> Rollout | None:
        """Step k's batch from the rollouts shared by this sampler's cells (`rollouts.py`), while the
        engine still holds θ_0; None: the engine samples it."""
        r = self.shared_rollouts.get(k)
        if r is None or cell.sampler_version != 0 or self.engine.version != 0:
            return None
        if r.prompt_ids[:: self.tcfg.responses_per_prompt] != [list(p) for p in prompts]:
            raise DamagedFileError(f"the shared rollouts' step {k} has other prompts than this run draws there: "
                                   "the file is not this run's; delete it and rerun its rule")
        self.engine.keep_for_check(r.prompt_ids, r.response_ids)  # as if it had sampled them: its next sync check scores them
        if not self.topk:  # the correction reads no engine distribution: as the engine returns without top-k
            r = dataclasses.replace(r, topk_ids=None, topk_logp=None)
        return r

    def score(self, rollout: Rollout, idx: list[int]) -> Scored:
        problems = [self.train_problems[idx[g]] for g in rollout.group.tolist()]
        rewards = torch.tensor(data.rewards(self.tokenizer, problems, rollout.response_ids), dtype=torch.float32)
        adv = advantages(rewards, rollout.group, len(idx))
        tb = make_token_batch(rollout.prompt_ids, rollout.response_ids, self.tokenizer.pad_token_id)
        return Scored(tb.to(self.device), rewards, adv.to(self.device)[tb.seq])

    # ------------------------------------------------------------------ one step

    def step(self, cell: Cell, timer: PhaseTimer) -> dict:
        k = cell.step + 1  # the step being taken, 1-based
        t = self.tcfg
        with timer("sync"):
            if k > 1 and self.sampler.due(k - 1, t.sync_every):
                self.sync_sampler(cell)
        idx, prompts = self.prompts_for(k)
        resync, ess_presync = 0, math.nan
        while True:
            with timer("sample"):
                rollout = None if resync else self.shared_rollout(k, cell, prompts)
                if rollout is None:
                    purpose = "sample" if not resync else "resample"
                    rollout = self.engine.generate(prompts, t.responses_per_prompt, derive_seed(self.seed, k, purpose), self.topk)
            with timer("score"):
                s = self.score(rollout, idx)
            with timer("logprobs"):
                synced = cell.sampler_version == cell.step  # θ_s is θ_t
                lp = self.log_probs(s, synced)
                e = rollout.engine_logp.to(self.device)
                mism = mismatch_metrics(e.cpu(), lp.a.cpu(), lp.b.cpu(), s.tb.seq.cpu(), s.tb.num_seqs)
            with timer("resync"):
                if self.correction.resync and not resync and mism["ess_lag"] < t.resync_ess:
                    self.sync_sampler(cell)
                    cell.resync_steps.append(k)
                    resync, ess_presync = 1, mism["ess_lag"]
                    continue
            break
        row = {"step": k, "sync_version": cell.sampler_version, "resync": resync, "ess_lag_presync": ess_presync}
        row["reward_mean"] = float(s.rewards.mean())
        row.update(success_metrics(s.rewards, rollout.group, len(idx)))
        row["response_len_mean"] = float(rollout.lengths.double().mean())
        row.update(mism)
        row["kl_sampler"] = lp.kl_sampler

        probing = k % t.probe_every == 0 or k == t.steps  # the last step too: its eval needs its off-support
        with timer("probe"):
            if probing:
                self.sync_probe(cell.step)
                # the two probe batches in one engine call: the prompts twice, independent seeds; their
                # tokens only (the probe's gradients are the trainer's)
                both = self.probe_engine.generate(prompts + prompts, t.responses_per_prompt, derive_seed(self.seed, k, "probes"), logprobs=False)
                probes = [self.score(r, idx) for r in both.split(len(prompts))]
                g_on, g_on2, row["off_support"] = self.probe(probes)

        with timer("correction"):
            updates = updates_per_batch(self.correction.name, t)  # 1, or its own count, or train.updates_per_batch
            theta_before = flat_params(self.params) if updates > 1 else None
            g_c, diagnostics = self.correction_grad(s, rollout, e, lp, synced, lp.kept)
            lp.kept = None  # frees the kept graph's logits
            row.update(diagnostics)
            check_finite(k, row)
            check_direction_finite(k, g_c)

        with timer("update"):
            for u in range(updates):
                # PPO's further epochs: fresh logits at the current θ, the same θ_old (b); θ has
                # moved, so θ_s's distribution comes from the sampler's copy even when it was synced
                g_u = g_c if u == 0 else self.correction_grad(s, rollout, e, lp, False, None)[0]
                self._apply(g_u)
            # a diverged run (a later PPO epoch's gradient, or a step that overflows θ) ends here
            # (train_steps records it) instead of writing a row whose dev is NaN and going on
            check_weights_finite(k, self.params, updates)
            if updates > 1:  # the run's update direction over all its SGD steps
                g_c = (theta_before - flat_params(self.params)) / t.lr
        cell.step = k

        if probing:
            row["dev"] = squared_distance(g_c, g_on)
            row["floor"] = squared_distance(g_on, g_on2)
            row["dev_ratio"] = dev_ratio(row["dev"], row["floor"])
            row.update(gradient_snr(g_on, g_on2, row["floor"]))
        else:
            row.update(off_support=math.nan, dev=math.nan, floor=math.nan, dev_ratio=math.nan, grad_signal=math.nan, grad_snr=math.nan)

        with timer("eval"):
            evaluating = k % t.eval_every == 0 or k == t.steps
            row.update(self.evaluate(k) if evaluating else dict.fromkeys(EVAL_COLUMNS, math.nan))
        check_finite(k, row)
        return row

    def evaluate(self, version: int) -> dict[str, float]:
        """The accuracies of θ_t (BF16 engine) on the eval problems, greedy and sampled
        (`eval_samples` answers each at temperature 1, seeded by the step), the held-out test set's
        greedy accuracy when the eval problems are the RL pool, and `test_accuracy`: the one
        `eval_mode` chooses for the tables. The plan's cost model counts these answers
        (`cluster.eval_answers_per_eval`)."""
        t = self.tcfg
        self.sync_probe(version)
        greedy = self._correct(self.eval_problems, self.probe_engine.greedy(self.eval_prompts))
        sampled = self.probe_engine.generate(self.eval_prompts, t.eval_samples, derive_seed(self.seed, version, "eval"), logprobs=False)
        out = {
            "accuracy_greedy": float(np.mean(greedy)),
            "accuracy_sampled": float(np.mean(self._correct([self.eval_problems[g] for g in sampled.group.tolist()], sampled.response_ids))),
            "heldout_accuracy_greedy": math.nan,
        }
        if t.eval_on == "pool":
            out["heldout_accuracy_greedy"] = float(np.mean(self._correct(self.test_problems, self.probe_engine.greedy(self.test_prompts))))
        out["test_accuracy"] = out[f"accuracy_{t.eval_mode}"]
        return out

    def _correct(self, problems, responses) -> list[bool]:
        return [r == countdown.REWARD_CORRECT for r in data.rewards(self.tokenizer, problems, responses)]

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, path: Path, cell: Cell, run: dict | None = None) -> None:
        """The run's state at `path`, with the sidecar that vouches for it (dlcrepro/checkpoint.py);
        `run`: the run it belongs to (`run_identity`), which a resume must match."""
        blob = {
            "cell": cell.__dict__,
            "policy": self.policy.state_dict(),
            "optimizer": self.opt.state_dict(),
            "sampler": self.sampler_model.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "matched_weight_max": dict(self.matched_weight_max),
            "run": run,
        }
        self.ckpt_on_disk = checkpoint.save(path, blob, run, cell.step, self.ckpt_on_disk)

    def load_checkpoint(self, path: Path, run: dict | None = None) -> Cell:
        """The state of a verified checkpoint (of `run`, if given); checkpoint.BadCheckpoint if it is not one."""
        blob, self.ckpt_on_disk = checkpoint.load(path, run, map_location=self.device)
        self.policy.load_state_dict(blob["policy"])
        self.opt.load_state_dict(blob["optimizer"])
        self.sampler_model.load_state_dict(blob["sampler"])
        torch.set_rng_state(blob["torch_rng"])
        self.matched_weight_max = dict(blob.get("matched_weight_max", {}))  # none in a checkpoint written before it was saved
        return Cell(**blob["cell"])


# A sync check that fails after the weights' largest |weight| grew this many times since the engine's
# last matched version is a diverged run, not a broken load. Measured in the zoo (stale/gspo seed 0):
# from step 20 to 23 the largest |weight| moved 1.29 -> 1.386 (at most 7 % a step); step 24's update
# took it to 221.6 (160x), and the bf16 engine then gave 88.7 nats/token against the trainer.
BLOWUP = 10.0

# Columns that are NaN by definition on some steps: probes and evals only on their steps, the
# pre-resync ESS only where a resync happened, ratios where their denominator is 0.
MAY_BE_NAN = {"ess_lag_presync", "dev", "floor", "dev_ratio", "off_support", "grad_signal", "grad_snr",
              "accuracy_greedy", "accuracy_sampled", "heldout_accuracy_greedy", "test_accuracy"}


def check_finite(step: int, row: dict) -> None:
    """Raise NonFiniteError naming the step and the column if a value is infinite, or NaN where
    the column is always defined. Called on the step's mismatch columns and the correction's
    diagnostics before the update (an overflowed ratio would turn θ into NaN), and on the whole row
    after it, before the row or a checkpoint is written: the run stops at that step, its last
    checkpoint intact. A fault, not an outcome: a diverged θ shows first in the update direction or
    the weights (check_direction_finite, check_weights_finite)."""
    for col, v in row.items():
        if isinstance(v, float) and (math.isinf(v) or (math.isnan(v) and col not in MAY_BE_NAN)):
            raise NonFiniteError(f"step {step}: {col} is {v}; the run stops here (its last checkpoint is kept)")


def check_direction_finite(step: int, g: torch.Tensor) -> None:
    """Before the update: a NaN or infinite update direction at a moved θ (step > 1) means the run
    diverged (Diverged: its outcome, recorded); at θ_0, which no update has moved, it is a fault
    (NonFiniteError: the run stops with an error)."""
    top = float(g.abs().max())
    if math.isfinite(top):
        return
    if step == 1:
        raise NonFiniteError(f"step 1: the update direction is {top} at θ_0, before any update; the run stops here")
    raise Diverged(step, f"step {step}: the update direction is {top}: the run diverged")


def largest_abs_weight(params) -> float:
    """max |w| over the weights, NaN or ∞ if any weight is: each tensor's max and min (no temporary
    of its size), then one device sync for all of them."""
    with torch.no_grad():
        return float(torch.stack([torch.maximum(p.amax(), -p.amin()).float() for p in params]).amax())


def check_weights_finite(step: int, params: list[torch.Tensor], updates: int) -> None:
    """Raise Diverged if any trained weight is NaN or infinite after the step's update
    (`largest_abs_weight`: one pass, one device sync)."""
    if not math.isfinite(largest_abs_weight(params)):
        raise Diverged(step, f"step {step}: the policy's weights are not finite after its update ({updates} SGD step(s)): the run diverged")


EVAL_COLUMNS = ("accuracy_greedy", "accuracy_sampled", "heldout_accuracy_greedy", "test_accuracy")


def success_metrics(rewards: torch.Tensor, group: torch.Tensor, num_groups: int) -> dict[str, float]:
    """Of a batch of k responses per prompt: pass@1 (share of correct responses), pass@k (share of
    prompts with at least one) and the share of prompts whose rewards are mixed (only those carry a
    non-zero advantage, and with it a gradient)."""
    correct = (rewards == countdown.REWARD_CORRECT).double()
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


def summarize(rows: list[dict], cell: Cell, meta: dict, seconds: dict) -> dict:
    """The run's summary: final test accuracy, noise-floor multiple, ESS crossings, resync steps, seconds.

    The aggregates are analysis.py's, applied to this one run: each is defined once.
    """
    ids = {k: meta.get(k, "") for k in analysis.RUN}
    df = pd.DataFrame(rows).assign(**ids)
    for col in ("ess_lag_presync", "test_accuracy", "dev", "floor", "dev_ratio", "ess_lag", "ess_lag_gauss", "step"):
        if col not in df:  # a column every row has, absent only from a run that diverged at step 1
            df[col] = pd.Series(dtype=float)
    one = lambda f, col: f(df)[col].iloc[0] if len(df) else math.nan  # noqa: E731
    acc = df["test_accuracy"].dropna()
    as_int = lambda x: None if pd.isna(x) else int(x)  # noqa: E731
    return {
        **meta,
        "steps": int(len(df)),
        # a diverged policy (weights NaN or blown up) counts as answering no problem (docs/method.md#diverged-runs)
        "final_test_accuracy": 0.0 if cell.diverged_at_step else float(acc.iloc[-1]) if len(acc) else math.nan,
        "diverged_at_step": cell.diverged_at_step,
        "initial_test_accuracy": cell.initial.get("test_accuracy", math.nan),
        "initial_accuracies": cell.initial,
        "noise_floor_multiple": float(one(analysis.noise_floor_multiple, "noise_floor_multiple")),
        "leave_floor_step": as_int(one(analysis.leave_floor_step, "leave_floor_step")),
        "ess_crossing_step": as_int(one(analysis.ess_crossings, "ess_crossing_step")),
        "ess_gauss_crossing_step": as_int(one(analysis.ess_crossings, "ess_gauss_crossing_step")),
        "resync_steps": list(cell.resync_steps),
        "seconds_by_phase": {k: round(v, 2) for k, v in seconds.items()},
    }


def run_identity(meta: dict, cfg: Config) -> dict:
    """What makes a run this run: the cell and its whole config, as its config.yaml records them. A
    checkpoint is resumed only by the run it names."""
    return {"cell": meta, "config": to_dict(cfg)}


def finished_as(cell: Path, meta: dict, cfg: Config) -> bool:
    """Whether `cell` holds a finished run of exactly this cell (`meta`) under exactly `cfg`."""
    if not ((cell / SUMMARY_FILE).exists() and (cell / METRICS_FILE).exists() and (cell / CONFIG_FILE).exists()):
        return False
    ran = yaml.safe_load((cell / CONFIG_FILE).read_text()) or {}
    want = yaml.safe_load(yaml.safe_dump({"cell": meta, "config": to_dict(cfg)}, sort_keys=False))
    for c in (ran.get("config") or {}, want["config"]):
        c.pop("tracking", None)  # where a run is watched is no part of what it computes
    return ran.get("cell") == want["cell"] and ran.get("config") == want["config"] and "computed_as" not in ran


@contextmanager
def cell_log(path: Path):
    """`note(msg)`: `msg` on stderr and, time-stamped, on a line of the cell's log file, which is
    closed however the block ends."""
    with open(path, "a") as f:

        def note(msg: str) -> None:
            log(msg)
            try:
                f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}\n")
                f.flush()
            except OSError as e:
                raise (disk_full(e, path) or e) from e

        yield note


def copy_cell(src: Path, out: Path, meta: dict, cfg: Config, why: str) -> dict:
    """Write the cell `meta` as the finished run in `src`, which computes the same numbers bit for
    bit (grid.computed_as says why): its metrics table byte for byte, its summary under this cell's
    name with `computed_as` naming the source."""
    t0 = time.perf_counter()
    damaged = analysis.metrics_problem(src)
    if damaged:
        raise DamagedFileError(f"{src}: {damaged}; {out} copies it. Rerun that cell: delete {src} and rerun the same command")
    atomic_write_text(out / CONFIG_FILE, yaml.safe_dump({"cell": meta, "computed_as": str(src), "why": why, "config": to_dict(cfg)}, sort_keys=False))
    digest = atomic_save(out / METRICS_FILE, lambda tmp: shutil.copyfile(src / METRICS_FILE, tmp))
    ran = json.loads((src / SUMMARY_FILE).read_text())
    summary = {**ran, **meta, "computed_as": str(src), "why": why, "metrics_file": digest}
    summary["wall_seconds"] = round(time.perf_counter() - t0, 3)
    summary.pop("tracking", None)
    with cell_log(out / LOG_FILE) as note:
        note(f"{out} is the run in {src} ({why}): metrics copied, not recomputed")
        if cfg.tracking.backends:  # its series are in the trackers once, under the run it copies
            twin = tracking.run_name(ran)
            summary["tracking"] = f"not logged: this cell is the run logged as {twin}"
            note(f"tracking: not logged to {', '.join(cfg.tracking.backends)}: this cell is the run logged there as {twin}")
    atomic_write_text(out / SUMMARY_FILE, json.dumps(summary, indent=1))
    return summary


def check_names(cfg: Config, model: str, sampler: str, correction: str) -> None:
    """Fail fast, before anything is written, on a model the config lacks or an unregistered
    sampler or correction; the error lists the known names."""
    if model not in cfg.models:
        raise KeyError(f"unknown model {model!r}; known: {sorted(cfg.models)}")
    get_sampler(sampler), get_correction(correction)


def cell_model_dir(cfg: Config, model: str, model_dir: str | None) -> Path:
    """The weights the cell starts from: `model_dir` if given, else the config's; it must hold a model."""
    mdir = paths.model_dir(cfg, model, model_dir)
    if not (mdir / "config.json").exists():
        hint = "run `python -m dlcrepro warmstart` first" if cfg.models[model].kind == "tiny" else "is it a model directory?"
        raise FileNotFoundError(f"model directory {mdir} has no config.json ({hint})")
    return mdir


def same_run(cfg: Config, meta: dict, out: Path) -> tuple[Path | None, str]:
    """The finished run this cell may copy instead of training, and why: the cell of the correction
    that computes its numbers bit for bit (grid.computed_as), beside `out` in the grid's layout
    (<correction>/<seed dir>) and finished under exactly this config. (None, why) if there is none."""
    same, why = computed_as(meta["sampler"], meta["correction"], cfg.train_for(meta["model"]))
    if same != meta["correction"] and out.parent.name == meta["correction"]:
        src = out.parent.parent / same / out.name
        if finished_as(src, {**meta, "correction": same}, cfg):
            return src, why
    return None, why


def start_or_resume(tr: Trainer, ckpt: Path, out: Path, meta: dict, run: dict, note, initial: dict | None = None) -> Cell:
    """The run's state: from its checkpoint if there is one that verifies as this run's, else fresh,
    with θ_0's accuracies (where every run's accuracy curve starts): `initial` where its seed's were
    computed once (initial_eval.py), else measured here; a checkpoint that does not verify is set
    aside, named. The engines then hold θ_s."""
    cell, resumed = None, False
    if ckpt.exists():
        try:
            cell = tr.load_checkpoint(ckpt, run)
            resumed = True
            note(f"resuming {out} from step {cell.step}")
        except checkpoint.BadCheckpoint as e:
            aside = checkpoint.set_aside(ckpt, e.kind)
            note(f"{e}: set aside as {aside} (delete it once you have looked); starting {out} again from step 0")
    if cell is None:
        cell = Cell()
        note(f"starting {out}: {meta}")
        if initial is None:
            cell.initial = tr.evaluate(0)
        else:  # the probe engine still gets θ_0 and its check, as evaluate(0) gives them
            cell.initial = dict(initial)
            tr.sync_probe(0)
    where = {k: os.environ[k] for k in ("SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES") if k in os.environ}
    note(f"device {tr.device}, torch threads {torch.get_num_threads()}" + "".join(f", {k}={v}" for k, v in where.items()))
    baselines = dict(tr.matched_weight_max)
    tr.push_weights(tr.engine, tr.sampler_model, cell.sampler_version)
    if resumed:  # θ_s re-verified is no new match: the baselines stay those the uninterrupted run had
        tr.matched_weight_max = baselines
    if tr.probe_engine is tr.engine:
        tr.probe_version = cell.sampler_version
    return cell


def train_steps(tr: Trainer, cell: Cell, ckpt: Path, run: dict, note, desc: str, trackers: tracking.Trackers) -> dict[str, float]:
    """Take the cell's remaining steps, one metrics row each, checkpointing every `ckpt_every`
    steps (not after the last) and sending each finished row to the trackers; the seconds spent
    per phase, summed over these steps."""
    totals = dict.fromkeys(PHASES, 0.0)
    steps = tr.tcfg.steps
    bar = tqdm(total=steps, initial=cell.step, desc=desc, unit="step", mininterval=2.0)
    while cell.step < steps:
        timer = PhaseTimer()
        try:
            row = tr.step(cell, timer)
        except Diverged as e:  # the run's outcome, not a fault: it ends here, its rows so far kept
            cell.diverged_at_step = cell.rows[-1]["step"] + 1 if cell.rows else 1  # the first step without a row
            note(f"{e}; the run ends with its {len(cell.rows)} finished step(s), and its final test accuracy counts as 0")
            break
        cell.rows.append({**row, **{f"sec_{p}": v for p, v in timer.sec.items()}})
        if tr.tcfg.ckpt_every and cell.step % tr.tcfg.ckpt_every == 0 and cell.step < steps:
            # the checkpoint holds this row before its own writing time is known: NaN there (what a
            # run resumed from it keeps), the time itself here once written
            cell.rows[-1]["sec_checkpoint"] = math.nan
            with timer("checkpoint"):
                tr.save_checkpoint(ckpt, cell, run)
            cell.rows[-1]["sec_checkpoint"] = timer.sec["checkpoint"]
        trackers.log(cell.step, cell.rows[-1])
        for p_, v in timer.sec.items():
            totals[p_] += v
        bar.update(1)
        bar.set_postfix(reward=f"{row['reward_mean']:+.2f}", ess=f"{row['ess_lag']:.2f}")
        if row["resync"]:
            note(f"step {cell.step}: lag ESS below {tr.tcfg.resync_ess}: resynchronized the sampler")
    bar.close()
    return totals


def train_cell(cfg: Config, meta: dict, mdir: Path, out: Path, note, keep_checkpoint: bool, shared_rollouts: Path | None = None,
               initial_eval: Path | None = None) -> dict:
    """Train the cell `meta` to its last step (resuming from its checkpoint if there is one) and
    write its metrics and summary; the checkpoint is then removed unless `keep_checkpoint`.
    `shared_rollouts`: the file of its sampler's shared steps (rollouts.py), which it samples itself
    without; `initial_eval`: the file of its seed's θ_0 evaluation (initial_eval.py), which it
    computes itself without."""
    t0 = time.perf_counter()
    shared, initial = {}, None
    if initial_eval is not None:  # checked before anything loads, as the rollouts are
        initial = load_initial_eval(initial_eval, initial_identity(cfg, meta["model"], meta["seed"], mdir))
        note(f"θ_0's accuracies are read from {initial_eval}")
    if shared_rollouts is not None:  # checked before anything loads: another run's file stops here
        topk = engine_topk(meta["correction"], cfg.engine)  # what Trainer.topk will be
        shared = rollouts.load(shared_rollouts, rollouts.identity(cfg, meta["model"], meta["sampler"], meta["seed"], mdir, topk), topk)
        note(f"steps {min(shared)}-{max(shared)}: the batches its engine samples at θ_0 are read from {shared_rollouts}")
    torch.manual_seed(meta["seed"])
    tr = Trainer(cfg, meta["model"], meta["sampler"], meta["correction"], meta["seed"], mdir)
    tr.shared_rollouts = shared
    setup_sec = time.perf_counter() - t0
    ckpt, run = out / CKPT_FILE, run_identity(meta, cfg)
    cell = start_or_resume(tr, ckpt, out, meta, run, note, initial)
    trackers = tracking.open_trackers(cfg, out, note, first_step=cell.step + 1)
    trackers.start(meta, tracking.cell_params(cfg, meta))
    try:
        totals = train_steps(tr, cell, ckpt, run, note, tracking.run_name(meta), trackers)
    except BaseException:
        trackers.finish(None)  # the trackers' runs end as failed; the checkpoint is kept
        raise
    totals["setup"] = setup_sec
    if trackers.status:
        totals["tracking"] = trackers.seconds  # starting the trackers and each step's logging
    df = pd.DataFrame(cell.rows)
    digest = atomic_save(out / METRICS_FILE, lambda tmp: df.to_parquet(tmp, index=False))
    summary = summarize(cell.rows, cell, meta, totals)
    summary["wall_seconds"] = round(time.perf_counter() - t0, 1)
    summary["metrics_file"] = digest  # what `collect` checks the table against
    trackers.finish(summary)
    if trackers.status:
        summary["tracking"] = trackers.status
    atomic_write_text(out / SUMMARY_FILE, json.dumps(summary, indent=1))
    if keep_checkpoint:  # the final θ_t and θ_s, e.g. for `python -m dlcrepro scan --checkpoint`
        tr.save_checkpoint(ckpt, cell, run)
    else:
        checkpoint.remove(ckpt)
    note(f"finished {out}: {json.dumps({k: summary[k] for k in ('final_test_accuracy', 'noise_floor_multiple', 'resync_steps', 'diverged_at_step')})}")
    return summary


def run_cell(cfg: Config, model: str, sampler: str, correction: str, seed: int, out: Path, model_dir: str | None = None,
             keep_checkpoint: bool = False, shared_rollouts: Path | None = None, initial_eval: Path | None = None) -> dict:
    """Run (or resume, or return the finished) cell; write metrics, config, summary and log into `out`.
    A cell whose numbers a finished cell of the grid computes bit for bit copies them instead.
    `shared_rollouts`: its sampler's shared steps (rollouts.py); `initial_eval`: its seed's θ_0
    evaluation (initial_eval.py): the same numbers, computed once."""
    out = Path(out)
    if (out / SUMMARY_FILE).exists() and (out / METRICS_FILE).exists():
        return json.loads((out / SUMMARY_FILE).read_text())
    check_names(cfg, model, sampler, correction)
    mdir = cell_model_dir(cfg, model, model_dir)
    meta = {"model": model, "sampler": sampler, "correction": correction, "seed": seed, "model_dir": str(mdir)}
    src, why = same_run(cfg, meta, out)
    if src is not None:
        return copy_cell(src, out, meta, cfg, why)
    check_device(cfg, model)  # a config asking for a GPU stops here on a CPU torch or without a device
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / CONFIG_FILE, yaml.safe_dump({"cell": meta, "config": to_dict(cfg)}, sort_keys=False))
    with cell_log(out / LOG_FILE) as note:
        for tmp in remove_leftovers(out):  # a killed run's half-written file: never a result, only space taken
            note(f"removed {tmp.name}, left half-written by an earlier run")
        return train_cell(cfg, meta, mdir, out, note, keep_checkpoint, shared_rollouts, initial_eval)
