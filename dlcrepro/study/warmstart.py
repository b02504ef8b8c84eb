"""Warm start of the tiny model: supervised training on solver solutions, then greedy test accuracy.

RL must start from a policy that sometimes succeeds; a few minutes of SFT on 2 CPU cores gets
the tiny Qwen3 there.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..step import countdown, data
from ..core import paths
from ..core.config import Config
from ..step.engine import VLLMEngine
from ..step.model import build_tiny_model, build_tokenizer, make_token_batch, response_logits, save_model_dir, token_logprobs
from ..core.util import atomic_write_text, log


def greedy_accuracy(engine, tokenizer, problems, kind: str) -> float:
    """Share of `problems` whose greedy response scores +1."""
    prompts = data.encode_prompts(tokenizer, problems, kind)
    return float(np.mean([r == countdown.REWARD_CORRECT for r in data.rewards(tokenizer, problems, engine.greedy(prompts))]))


def warmstart(cfg: Config, model_name: str, out: Path | None = None) -> dict:
    """Train, save `<artifacts>/<model>/model/` and `warmstart.json`; return the summary."""
    mcfg = cfg.models[model_name]
    if mcfg.kind != "tiny":
        raise ValueError(f"warmstart: model {model_name!r} has kind {mcfg.kind!r}; only 'tiny' models are warm-started")
    ws = mcfg.warmstart
    out = Path(out) if out else paths.model_dir(cfg, model_name).parent
    train, test = data.load_problems(cfg.task)
    tokenizer = build_tokenizer(cfg.task.answer_format)
    model = build_tiny_model(mcfg.arch, ws.seed)
    n_params = sum(p.numel() for p in model.parameters())
    prompts = data.encode_prompts(tokenizer, train, cfg.task.prompt)
    answers = [tokenizer(answer_text(p, cfg.task.answer_format), add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
               for p in train]
    t_start = time.time()
    steps_done, loss, train_seconds = supervised_train(model, prompts, answers, ws, tokenizer.pad_token_id,
                                                       f"warmstart {model_name}")
    model.eval()
    tmp = out / "model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_model_dir(model, tokenizer, tmp)
    engine = VLLMEngine(str(tmp), cfg.engine, "bf16", seed=ws.seed, max_model_len=_max_len(cfg))
    acc = greedy_accuracy(engine, tokenizer, test, cfg.task.prompt)
    del engine
    final = out / "model"
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    summary = {
        "model": model_name,
        "parameters": n_params,
        "steps": steps_done,
        "train_seconds": round(train_seconds, 1),
        "final_loss": round(loss, 4),
        "test_accuracy": acc,
        "n_test": len(test),
        "seconds_total": round(time.time() - t_start, 1),
    }
    atomic_write_text(out / "warmstart.json", json.dumps(summary, indent=1))
    log(f"warmstart {model_name}: {n_params} parameters, {steps_done} steps in {train_seconds:.0f} s, greedy test accuracy "
        f"{acc:.3f}")
    return summary


def answer_text(problem, answer_format: str) -> str:
    """The response the warm start teaches for `problem` (`task.answer_format`)."""
    if answer_format == "worked":
        return countdown.worked_answer(problem.numbers, problem.target)
    return countdown.solve(problem.numbers, problem.target)


def supervised_train(model, prompts, answers, ws, pad_id: int, desc: str) -> tuple[int, float, float]:
    """Supervised training of `model` on (prompt, answer) token ids: the mean log-loss of the
    answer tokens, AdamW, gradient norm clipped at 1, the learning rate of `lr_factor`, batches drawn
    with `ws.seed`. Returns (steps taken, last loss, seconds)."""
    t0 = time.time()
    opt = torch.optim.AdamW(model.parameters(), lr=ws.lr, weight_decay=0.01)
    rng = np.random.default_rng(ws.seed)

    def progress(step: int) -> float:
        """Share of the budget used: steps, or wall seconds when `max_seconds` runs out first."""
        p = step / ws.steps
        return min(max(p, (time.time() - t0) / ws.max_seconds) if ws.max_seconds else p, 1.0)

    model.train()
    bar = tqdm(range(ws.steps), desc=desc, unit="step", mininterval=2.0)
    steps_done = 0
    for step in bar:
        idx = rng.integers(len(prompts), size=ws.batch)
        tb = make_token_batch([prompts[i] for i in idx], [answers[i] for i in idx], pad_id)
        loss = -token_logprobs(response_logits(model, tb), tb.tokens).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for g in opt.param_groups:
            g["lr"] = ws.lr * lr_factor(step, progress(step), ws.lr_final, ws.warmup_steps)
        opt.step()
        steps_done = step + 1
        if step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
        if ws.max_seconds and time.time() - t0 > ws.max_seconds:
            break
    return steps_done, float(loss.item()), time.time() - t0


def lr_factor(step: int, progress: float, lr_final: float, warmup_steps: int) -> float:
    """The warm start's learning rate as a fraction of its peak: a cosine from 1 to `lr_final` over
    the budget (`progress` 0 → 1), times a linear warm-up over the first `warmup_steps` steps."""
    cosine = lr_final + (1 - lr_final) * 0.5 * (1 + math.cos(math.pi * progress))
    return cosine * min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else cosine


def _max_len(cfg: Config) -> int:
    """Prompt plus response budget for the tiny model's vLLM engine."""
    return 64 + cfg.engine.max_tokens
