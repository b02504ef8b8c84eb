"""`python -m dlcrepro sample`: one batch from each sampler at the model's weights, with its mismatch.

For the stale samplers the trainer has not moved yet, so the lag is zero and what shows is the
engine's numerical discrepancy alone: BF16 rounding for bf16/stale, FP8 for fp8/fp8_stale.
"""

from __future__ import annotations

import torch

from ..step import data
from ..core import paths
from ..core.config import Config
from ..step.diagnostics import stats
from ..step.engine import VLLMEngine
from ..core.grid import SAMPLERS
from ..step.model import load_model, load_tokenizer, make_token_batch, response_logits, token_logprobs


def sample_report(cfg: Config, model: str, n_prompts: int, n: int, seed: int, model_dir: str | None = None) -> list[dict]:
    mdir = paths.model_dir(cfg, model, model_dir)
    tok = load_tokenizer(mdir)
    trainer = load_model(mdir).eval()
    state = {k: v.detach() for k, v in trainer.state_dict().items()}
    train, _ = data.load_problems(cfg.task)
    problems = train[:n_prompts]
    prompts = data.encode_prompts(tok, problems, cfg.task.prompt)
    engines: dict[str, VLLMEngine] = {}
    rows = []
    for name, sampler in SAMPLERS.items():
        if sampler.precision not in engines:
            engines[sampler.precision] = VLLMEngine(str(mdir), cfg.engine, sampler.precision, seed)
            engines[sampler.precision].load_weights(state, 0)
        r = engines[sampler.precision].generate(prompts, n, seed)
        tb = make_token_batch(r.prompt_ids, r.response_ids, tok.pad_token_id)
        with torch.no_grad():
            a = token_logprobs(response_logits(trainer, tb), tb.tokens)
        rewards = data.rewards(tok, [problems[g] for g in r.group.tolist()], r.response_ids)
        row = {"sampler": name, "responses": len(r.response_ids), "tokens": int(a.numel())}
        row.update({k: round(v, 6) for k, v in stats("discrepancy", a - r.engine_logp).items()})
        row["reward_mean"] = sum(rewards) / len(rewards)
        rows.append(row)
    return rows
