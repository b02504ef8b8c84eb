"""The engine calls of one training step and one evaluation, timed as a cell makes them.

    .venv/bin/python bench/engine_calls.py [--config configs/tiny.yaml] [--repeats 8] [--threads 1]

For each call a cell makes (the step's sample with and without top-k log-probs, the probe pair,
the eval's greedy pool answers, its sampled answers and the held-out greedy answers), the median
wall time of `--repeats` calls on the warm-started model with a BF16 engine, and, for the calls
whose log-probs a cell never reads (probes and the eval's sampled answers), the same call without
them, checking that it samples the same tokens. A benchmark, not a test: it asserts nothing but
the tokens' identity. Needs a warm-started model (`python -m dlcrepro warmstart`, or the
workflow's first job).
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/tiny.yaml")
    p.add_argument("--model", default="tiny")
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch threads (a grid job gets one CPU)")
    args = p.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from dlcrepro.core import config as config_mod
    from dlcrepro.step import data
    from dlcrepro.step.engine import VLLMEngine
    from dlcrepro.step.model import load_tokenizer
    from dlcrepro.core.paths import model_dir

    cfg = config_mod.load(args.config)
    mdir = model_dir(cfg, args.model)
    if not (mdir / "config.json").exists():
        raise SystemExit(f"no model at {mdir}: run `python -m dlcrepro warmstart --config {args.config}` first")
    tcfg = cfg.train_for(args.model)
    tok = load_tokenizer(mdir)
    train, test = data.load_problems(cfg.task)
    pool = train[: tcfg.pool_size or len(train)]
    pool_prompts = data.encode_prompts(tok, pool, cfg.task.prompt)
    test_prompts = data.encode_prompts(tok, test, cfg.task.prompt)
    step_prompts = pool_prompts[: tcfg.prompts_per_step]
    n = tcfg.responses_per_prompt
    engine = VLLMEngine(str(mdir), cfg.engine, "bf16", 0)

    calls = {
        "sample, top-k": lambda s, lp: engine.generate(step_prompts, n, s, cfg.engine.topk),
        "sample": lambda s, lp: engine.generate(step_prompts, n, s, 0),
        "probe pair": lambda s, lp: engine.generate(step_prompts + step_prompts, n, s, 0, logprobs=lp),
        "eval greedy (pool)": lambda s, lp: engine.greedy(pool_prompts),
        "eval sampled (pool)": lambda s, lp: engine.generate(pool_prompts, tcfg.eval_samples, s, 0, logprobs=lp),
        "eval greedy (held-out)": lambda s, lp: engine.greedy(test_prompts),
    }
    without = {"probe pair", "eval sampled (pool)"}
    print(f"{cfg.name}: BF16 engine, {args.threads} torch thread(s), median of {args.repeats} calls")
    print(f"  {'call':<24s} {'with log-probs':>15s} {'without':>10s}")
    for name, fn in calls.items():
        fn(0, True)  # warm up
        sides = (True, False) if name in without else (True,)
        times: dict[bool, list[float]] = {s: [] for s in sides}
        for r in range(args.repeats):
            outs = {}
            for side in sides:
                t = time.perf_counter()
                outs[side] = fn(r + 1, side)
                times[side].append(time.perf_counter() - t)
            if len(outs) == 2 and outs[True].response_ids != outs[False].response_ids:
                raise SystemExit(f"{name}: the call without log-probs sampled other tokens")
        med = {s: statistics.median(v) * 1e3 for s, v in times.items()}
        print(f"  {name:<24s} {med[True]:12.1f} ms"
              + (f" {med[False]:7.1f} ms ({med[True] / med[False]:.2f}x)" if False in med else ""))


if __name__ == "__main__":
    main()
