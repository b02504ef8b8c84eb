"""Where the trainer's time goes in one paper step: the PyTorch profiler over each piece.

    python3 bench/trainer_profile.py [--model qwen3-0.6b] [--device cuda] [--top 15]

Builds the paper model's architecture with random weights (`arch.QWEN3_ARCH`, no download),
a `Learner` with `configs/paper.yaml`'s train settings, and a batch of the paper step's shape
(`gpu_check.paper_step_batch`); then, after a warm-up, profiles each of the step's trainer
pieces once (log-probs at θ_t and θ_s, one probe gradient, θ_0's log-probs, the dlc gradient)
and prints its wall seconds and its top operators by device time. `--small` runs the same on a
tiny architecture (for a CPU). A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from dlcrepro.run import gpu_check
from dlcrepro.core.config import load
from dlcrepro.step.model import build_tiny_model
from dlcrepro.step.learner import Learner


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-0.6b", choices=sorted(gpu_check.QWEN3_ARCH))
    p.add_argument("--device", default="cuda")
    p.add_argument("--micro-batch", type=int, help="override the paper config's micro_batch")
    p.add_argument("--top", type=int, default=12, help="operators listed per piece")
    p.add_argument("--small", action="store_true", help="a tiny architecture and short sequences (CPU)")
    args = p.parse_args()
    dev = torch.device(args.device)
    cfg = load(Path(__file__).resolve().parent.parent / "configs" / "paper.yaml")
    tcfg = cfg.train_for(args.model)
    if args.micro_batch:
        tcfg.micro_batch = args.micro_batch
    arch, shape = gpu_check.QWEN3_ARCH[args.model], dict(prompt_len=120, resp_len=(150, 450))
    if args.small:
        arch = gpu_check.small_arch(arch)
        shape = dict(prompt_len=8, resp_len=(4, 12))
    with torch.device(dev):
        model = build_tiny_model(arch, 0)
    learner = Learner(model, tcfg, "dlc", cfg.models[args.model].trainer_dtype, dev)
    n, group = tcfg.prompts_per_step * tcfg.responses_per_prompt, tcfg.responses_per_prompt

    def batch(seed):
        s, r = gpu_check.paper_step_batch(n, group, vocab=arch["vocab_size"], topk=cfg.engine.topk, seed=seed, **shape)
        return type(s)(s.tb.to(dev), s.rewards, s.adv_tok.to(dev)), r

    (s, r), (w, wr) = batch(0), batch(1)
    gpu_check.learner_step(learner, w, [w, s], wr)  # warm-up
    print(f"{args.model}: {sum(x.numel() for x in learner.params) / 1e9:.2f}B params, {n} seqs, "
          f"{s.tb.tokens.numel()} response tokens, micro_batch {tcfg.micro_batch}, device {dev}")
    state = {}

    def measured():
        # θ_t's logits and θ_s's distribution recomputed in the correction, as in a batch of several micro-batches
        state["batch"] = learner.batch(r, s, synced=False)
        state["batch"].release_sampler_distribution()

    pieces = {
        "log_probs (θ_t, θ_s)": measured,
        "pg_grad (one probe)": lambda: learner.pg_grad(s),
        "token_logp (θ_0)": lambda: learner.token_logp(learner.initial_model, s.tb),
        "correction_grad (dlc)": lambda: learner.correction_grad(state["batch"]),
    }
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    sort = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    for name, fn in pieces.items():
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        with profile(activities=acts) as prof:
            t = time.perf_counter()
            fn()
            sync()
            sec = time.perf_counter() - t
        print(f"\n== {name}: {sec:.2f} s wall")
        print(prof.key_averages().table(sort_by=sort, row_limit=args.top, max_name_column_width=48))


if __name__ == "__main__":
    main()
