"""Where one grid cell's time goes, and what the engine wrapper costs over raw vLLM.

    .venv/bin/python bench/cell_phases.py [--config configs/tiny.yaml] [--sampler stale]
        [--correction dlc] [--steps 10] [--threads 1]

Prints (1) the set-up of a training job piece by piece (imports, problem set, models, engines),
(2) `VLLMEngine.generate` against a raw `LLM.generate` with the same sampling parameters on the
same prompts (median of repeated calls), (3) the mean seconds per step of each phase of a real
cell run in a temporary directory, and (4) a one-step job from command to exit in its own process
and through the fork server. A benchmark, not a test: it asserts nothing.
Needs a warm-started model (`python -m dlcrepro warmstart`, or the workflow's first job).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()


def timed(label: str, fn, *args, **kwargs):
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    print(f"  {label:<34s} {time.perf_counter() - t:7.2f} s")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/tiny.yaml")
    p.add_argument("--model", default="tiny")
    p.add_argument("--sampler", default="stale")
    p.add_argument("--correction", default="dlc")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (a grid job gets one CPU)")
    p.add_argument("--repeats", type=int, default=20, help="generate calls per side in the wrapper comparison")
    p.add_argument("--jobs", type=int, default=3, help="one-step jobs per side in the start-up comparison (0: skip)")
    args = p.parse_args()

    print("set-up of a training job")
    torch = timed("import torch", __import__, "torch")
    torch.set_num_threads(args.threads)
    timed("import vllm", __import__, "vllm")
    from dlcrepro.core import config as config_mod
    from dlcrepro.step import data
    from dlcrepro.core.paths import model_dir
    from dlcrepro.step.engine import VLLMEngine
    from dlcrepro.step.model import load_model, load_tokenizer
    from dlcrepro.study.celldir import run_cell
    from dlcrepro.core.phases import PHASES

    cfg = config_mod.load(args.config, {"train.steps": args.steps})
    mdir = model_dir(cfg, args.model)
    if not (mdir / "config.json").exists():
        raise SystemExit(f"no model at {mdir}: run `python -m dlcrepro warmstart --config {args.config}` first")
    tok = timed("tokenizer", load_tokenizer, mdir)
    _, test = timed("problem set", data.load_problems, cfg.task)
    timed("trainer model (x3 copies: 1 load)", load_model, mdir)
    engine = timed("vLLM engine start (bf16)", VLLMEngine, str(mdir), cfg.engine, "bf16", args.seed)
    timed("vLLM engine start (fp8)", VLLMEngine, str(mdir), cfg.engine, "fp8", args.seed)
    print(f"  {'process start to here':<34s} {time.perf_counter() - T0:7.2f} s")

    tcfg = cfg.train_for(args.model)
    prompts = data.encode_prompts(tok, test[: tcfg.prompts_per_step], cfg.task.prompt)
    n, k = tcfg.responses_per_prompt, cfg.engine.topk
    print(f"\nengine wrapper vs raw vLLM generate: {len(prompts)} prompts x {n} responses, top-{k} log-probs, median of "
          f"{args.repeats}")
    from vllm.inputs import TokensPrompt

    from dlcrepro.step.engine import request_seeds

    def raw(seed: int):
        params = [engine._params(n, s, min(k, engine.vocab_size)) for s in request_seeds(seed, len(prompts))]
        return engine.llm.generate([TokensPrompt(prompt_token_ids=list(q)) for q in prompts], params, use_tqdm=False)

    def wrapped(seed: int):
        return engine.generate(prompts, n, seed, k)

    for fn in (raw, wrapped):  # warm up
        fn(0)
    times = {"raw": [], "wrapper": []}
    for r in range(args.repeats):
        for name, fn in (("raw", raw), ("wrapper", wrapped)):
            t = time.perf_counter()
            fn(r + 1)
            times[name].append(time.perf_counter() - t)
    med = {name: statistics.median(v) for name, v in times.items()}
    for name, v in med.items():
        print(f"  {name:<10s} {v * 1e3:8.1f} ms")
    print(f"  ratio      {med['wrapper'] / med['raw']:8.2f} x")

    print(f"\none cell: {args.model}/{args.sampler}/{args.correction}/seed{args.seed}, {args.steps} steps, {args.threads} torch "
          "thread(s)")
    import pandas as pd

    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        summary = run_cell(cfg, args.model, args.sampler, args.correction, args.seed, Path(tmp) / "cell")
        wall = time.perf_counter() - t
        df = pd.read_parquet(Path(tmp) / "cell" / "metrics.parquet")
    per_step = {ph: df[f"sec_{ph}"].mean() for ph in PHASES}
    for ph, v in per_step.items():
        print(f"  {ph:<12s} {v:7.3f} s/step")
    print(f"  {'step total':<12s} {sum(per_step.values()):7.3f} s/step")
    print(f"  {'set-up':<12s} {summary['seconds_by_phase']['setup']:7.2f} s")
    print(f"  {'cell wall':<12s} {wall:7.2f} s")
    if args.jobs:
        job_startup(args, mdir)


def job_startup(args, mdir: Path) -> None:
    """A one-step job as Snakemake starts it, from `python -m dlcrepro train` to its exit: in its
    own process, and forked by the fork server (dlcrepro/run/server.py)."""
    import os
    import signal
    import subprocess
    import sys

    print(f"\na one-step job, command to exit (median of {args.jobs})")
    with tempfile.TemporaryDirectory() as tmp:
        sock = str(Path(tmp) / "s.sock")
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        t = time.perf_counter()
        server = subprocess.Popen([sys.executable, "-m", "dlcrepro", "serve", "--socket", sock, "--watch-pid", str(os.getpid())],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not Path(sock).exists():
            if server.poll() is not None:
                raise SystemExit("the fork server did not start")
            time.sleep(0.1)
        print(f"  {'fork server start (once)':<34s} {time.perf_counter() - t:7.2f} s")
        for label, extra in (("own process", []), ("fork server", ["--server", sock])):
            walls = []
            for i in range(args.jobs):
                cmd = [sys.executable, "-m", "dlcrepro", "train", "--config", args.config, "--model", args.model,
                       "--model-dir", str(mdir), "--sampler", args.sampler, "--correction", args.correction,
                       "--seed", str(args.seed), "--out", str(Path(tmp) / f"{label}{i}"), "--set", "train.steps=1", *extra]
                t = time.perf_counter()
                subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                walls.append(time.perf_counter() - t)
            print(f"  {label:<34s} {statistics.median(walls):7.2f} s")
        server.send_signal(signal.SIGTERM)
        server.wait()


if __name__ == "__main__":
    main()
