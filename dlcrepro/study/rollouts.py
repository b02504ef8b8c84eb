"""Rollouts shared by the cells of a lagged sampler.

A sampler that is not synced before every step (`stale`, `fp8_stale`) samples its first
min(steps, sync_every) steps from θ_0 in every cell of the same (model, sampler, seed): a step's
prompts and the engine's seeds depend only on (seed, step), and the engine holds θ_0 until its
first sync. So every correction of the grid samples the same batches there, bit for bit, and a
resync correction does until its first resync. `python -m dlcrepro rollouts` samples them once
into one file (the workflow's rule `rollouts`); a cell given the file (`train --rollouts`) takes
each of those steps' batch from it while its engine still holds θ_0, and samples itself after
that. Nothing else is shared here: the trainer's log-probs, the probes and the evaluations stay the
cell's own (θ_0's evaluation is shared per seed by initial_eval.py). Measured: the tiny study's 84
cells with and without the file, identical in every column but the seconds (docs/measurements.md,
"Shared rollouts: the main command before and after").
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..step import stamped
from ..core.config import Config, ConfigError
from ..step.engine import Rollout
from ..core.seeds import derive_seed, step_problems
from ..core.util import log

FORMAT = 1  # bump when the file's layout changes

# the train section's keys the shared rollouts depend on (the engine and task sections: all of them)
TRAIN_KEYS = ("steps", "sync_every", "prompts_per_step", "responses_per_prompt", "pool_size")


def identity(cfg: Config, model: str, sampler: str, seed: int, model_dir: Path, topk: int) -> dict:
    """Everything the shared rollouts depend on; a cell uses a file only if its own is the same. The model is
    named by its weights' hash, not `model_dir`, and the node by its kernel path
    (`stamped.model_and_kernels`)."""
    return stamped.shared_identity(FORMAT, cfg, model, model_dir, TRAIN_KEYS, sampler=sampler, seed=int(seed), topk=int(topk))


def _as_record(r: Rollout) -> dict:
    return {"prompt_ids": r.prompt_ids, "response_ids": r.response_ids, "group": r.group, "engine_logp": r.engine_logp,
            "topk_ids": r.topk_ids, "topk_logp": r.topk_logp, "version": r.version}


def save(path: Path, ident: dict, rollouts: dict[int, Rollout]) -> dict:
    """Write the rollouts (step → Rollout) stamped with their identity, atomically; the file's digest."""
    return stamped.write(path, ident, "steps", {int(k): _as_record(r) for k, r in rollouts.items()})


def load(path: Path, want: dict, need_topk: int) -> dict[int, Rollout]:
    """The rollouts of `path`, step → Rollout, if the file was written for exactly `want`
    (`identity`, but its top-k) and, where a correction reads them (`need_topk` > 0), with exactly
    that many top-k log-probs; else a ConfigError naming what differs (a DamagedFileError for a
    file that does not load). Loaded as tensors and plain containers only: a file is never code."""
    got, steps = stamped.load(path, want, "steps", "rollouts", "rollouts file", skip=("topk",))
    if need_topk and got.get("topk") != need_topk:
        raise ConfigError(f"{path} holds the engine's top-{got.get('topk')} log-probs, and this cell's correction reads "
                          f"the top-{need_topk} (engine.topk): rerun its rule with --topk {need_topk}")
    return {int(k): Rollout(**r) for k, r in steps.items()}


def write_rollouts(cfg: Config, model: str, sampler_name: str, seed: int, out: Path, model_dir: Path, topk: int) -> dict:
    """Sample the shared steps of (model, sampler, seed) as a cell would (its engine given θ_0 through
    the same weight load, the same prompts and seeds) and save them to `out`. Returns the identity."""
    from ..step import data
    from ..cluster import check_device
    from ..step.engine import VLLMEngine
    from ..core.grid import get_sampler
    from ..step.model import load_model, load_tokenizer, make_token_batch, response_logits, token_logprobs

    check_device(cfg, model)  # a GPU job on a CPU torch stops here, as a training job does
    sampler = get_sampler(sampler_name)
    t = cfg.train_for(model)
    count = sampler.shared_steps(t.steps, t.sync_every)
    if count == 0:
        raise ConfigError(f"sampler {sampler_name!r} is synced before every step: its cells share no rollouts")
    tok = load_tokenizer(model_dir)
    train_problems, test_problems = data.load_problems(cfg.task)
    pool = len(train_problems[: t.pool_size or len(train_problems)])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # where a cell's trainer holds θ_0 (Trainer)
    policy = load_model(model_dir).to(device).eval().requires_grad_(False)
    engine = VLLMEngine(str(model_dir), cfg.engine, sampler.precision, seed)
    engine.load_weights({k: v.detach() for k, v in policy.state_dict().items()}, 0)  # as a cell pushes θ_0
    if cfg.engine.sync_check:  # drawn from the prompts a cell's first check draws from (Trainer.eval_prompts)
        check_on = train_problems[:pool] if t.eval_on == "pool" else test_problems

        def trainer_logp(prompts, responses):
            with torch.no_grad():
                tb = make_token_batch(prompts, responses, tok.pad_token_id).to(device)
                return token_logprobs(response_logits(policy, tb), tb.tokens)

        d = engine.check_sync(trainer_logp, data.encode_prompts(tok, check_on[:4], cfg.task.prompt))
        log(f"sync check: {engine.kind} engine holds θ_0: mean |log q − log π| {d:.4f}/token (bound "
            f"{engine.precision.sync_bound})")
    out_steps = {}
    for k in range(1, count + 1):
        idx = step_problems(seed, k, pool, t.prompts_per_step)
        prompts = data.encode_prompts(tok, [train_problems[i] for i in idx], cfg.task.prompt)
        out_steps[k] = engine.generate(prompts, t.responses_per_prompt, derive_seed(seed, k, "sample"), topk)
    ident = identity(cfg, model, sampler_name, seed, model_dir, topk)
    save(out, ident, out_steps)
    log(f"rollouts {model}/{sampler_name}/seed{seed}: steps 1-{count} sampled from θ_0 ({sampler.precision} engine, top-k "
        f"{topk}) into {out}")
    return ident
