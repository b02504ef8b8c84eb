"""The cost model: minutes of a job on one H200, from the trainer's shares of a paper step measured
there and the engine's throughput assumed (docs/cluster.md, "Runtime and GPU-hours")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core.config import Config
from ..core.grid import get_sampler
from ..core.phases import Schedule
from ..core.registry import updates_per_batch

# docs/cluster.md, "Runtime and GPU-hours": the trainer's share of a paper step measured on one H200
# (gpu_check piece `paper-trainer`, 512 sequences, ~150k response tokens); the engine's share is a
# model (throughput assumed, not measured).


@dataclass(frozen=True)
class StepCost:
    """Seconds of one step of a 512-sequence batch on one H200, and the engine's throughput."""

    logprobs_s: float  # trainer log-probs at θ_t and θ_s (measured)
    probes_s: float  # the two probe gradients and θ_0 (measured; on probe steps only)
    correction_s: float  # the correction's gradient (measured, dlc)
    engine_tokens_per_s: float  # generated tokens per second (assumed)
    sync_s: float  # two weight syncs (assumed)


COST_MODEL: dict[str, StepCost] = {
    "Qwen/Qwen3-0.6B": StepCost(6.0, 18.3, 10.5, 20_000, 3.0),
    "Qwen/Qwen3-1.7B": StepCost(7.9, 28.3, 17.0, 12_000, 6.0),
}
COST_BATCH = 512  # sequences per step the trainer shares were measured at
RESPONSE_TOKENS = 300  # mean response length assumed
ENGINE_START_S = 180  # CUDA graph capture of two engines


def step_cost(cfg: Config, model: str) -> StepCost | None:
    """The cost model's entry for a model: by Hugging Face id, or a local directory of that name."""
    path = cfg.models[model].path or ""
    for hf_id, cost in COST_MODEL.items():
        if path == hf_id or Path(path).name.lower() == hf_id.split("/")[-1].lower():
            return cost
    return None


def estimated_minutes(cfg: Config, model: str, correction: str | None = None) -> float | None:
    """Minutes of one trained cell of `correction` (None: one SGD step per batch) by the cost model
    (None: the model is not in it): steps × (trainer shares scaled to the batch, the correction's
    gradient once per SGD step + probe share × probes + generated tokens / throughput + syncs) +
    evaluations + engine start. A further SGD step on the batch (registry.updates_per_batch:
    ppo_multi's 4) is a fresh correction gradient at the moved θ (Learner.update), priced as the
    one measured: dlc's, θ_s's forward included, which a correction that does not read θ_s's
    distribution skips (`TokenTerms.logp_s`): for those the estimate is high by that forward."""
    cost = step_cost(cfg, model)
    if cost is None:
        return None
    t = cfg.train_for(model)
    batch = t.prompts_per_step * t.responses_per_prompt
    scale, probe_share = batch / COST_BATCH, 1 / t.probe_every
    sgd_steps = 1 if correction is None else updates_per_batch(correction, t)
    engine_tokens = batch * RESPONSE_TOKENS * (1 + 2 * probe_share)  # the run's batch and two probe batches
    trainer = cost.logprobs_s + sgd_steps * cost.correction_s + probe_share * cost.probes_s
    step = scale * trainer + engine_tokens / cost.engine_tokens_per_s + cost.sync_s
    schedule = Schedule.of(t)
    # each eval step's; θ_0's is its seed's initial_eval job's (initial_eval_minutes)
    evals = schedule.count(schedule.evaluates) * eval_answers_per_eval(cfg, model) * RESPONSE_TOKENS / cost.engine_tokens_per_s
    return (t.steps * step + evals + ENGINE_START_S) / 60


def failure_minutes(cfg: Config, model: str, correction: str | None = None) -> float | None:
    """Minutes of one GPU that a failed training job (a node failure, a preemption, its time limit)
    can cost its retry by the cost model, None where the model is not in it: the steps since its last
    checkpoint, at most one interval (train.ckpt_every; every step without), at the cell's mean step
    (`estimated_minutes` less the start, its evaluations spread), and the engines' start again:

        min(ckpt_every or steps, steps) × (estimated − start) / steps + start.

    A job stopped after its last write costs its retry no step (celldir.rewrite_finished)."""
    est = estimated_minutes(cfg, model, correction)
    if est is None:
        return None
    t = cfg.train_for(model)
    start = ENGINE_START_S / 60
    return Schedule.of(t).steps_lost_at_most() * (est - start) / t.steps + start


def initial_eval_minutes(cfg: Config, model: str) -> float | None:
    """Minutes of one θ_0 evaluation job by the cost model: one evaluation's answers and one
    engine's start; None where the model is not in the cost model."""
    cost = step_cost(cfg, model)
    if cost is None:
        return None
    return (eval_answers_per_eval(cfg, model) * RESPONSE_TOKENS / cost.engine_tokens_per_s + ENGINE_START_S / 2) / 60


def shared_sampling_minutes(cfg: Config, model: str, sampler: str) -> float | None:
    """Minutes of generating the batches a lagged sampler's cells share (its steps before the first
    sync), by the cost model: what its rollouts job takes (and each cell that reads it no longer
    does); None where the model is not in the cost model."""
    cost = step_cost(cfg, model)
    if cost is None:
        return None
    t = cfg.train_for(model)
    steps = get_sampler(sampler).shared_steps(t.steps, t.sync_every)
    return steps * t.prompts_per_step * t.responses_per_prompt * RESPONSE_TOKENS / cost.engine_tokens_per_s / 60


def rollouts_minutes(cfg: Config, model: str, sampler: str) -> float | None:
    """Minutes of one rollouts job by the cost model: its generated tokens and one engine's start."""
    shared = shared_sampling_minutes(cfg, model, sampler)
    return None if shared is None else shared + ENGINE_START_S / 2 / 60


def eval_answers_per_eval(cfg: Config, model: str) -> int:
    """Answers the BF16 probe engine generates in one evaluation (`train.Trainer.evaluate`, run for
    θ_0 and at every eval step), whatever `eval_mode` reports: a greedy answer and `eval_samples`
    sampled ones per eval problem, and with `eval_on: pool` a greedy answer per held-out test
    problem as well:

        |eval problems| × (1 + eval_samples) + [eval_on = pool] × n_test,

    the eval problems being the n_test held-out ones, or the RL pool's min(pool_size, n_train)."""
    t = cfg.train_for(model)
    if t.eval_on == "pool":
        return min(t.pool_size, cfg.task.n_train) * (1 + t.eval_samples) + cfg.task.n_test
    return cfg.task.n_test * (1 + t.eval_samples)

