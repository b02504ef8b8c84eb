"""What the weight-sync check sees: engine against trainer after correct and after broken syncs.

    python3 bench/sync_check.py --model-dir DIR [--config configs/smoke.yaml] [--steps 6]

A `Trainer` of the `fp8` sampler (its run's engine FP8, its probe engine BF16) takes real RL steps
from the warm-started model in DIR. After each step k (θ_{k-1} → θ_k) both engines are given, as
version k: θ_k (correct), θ_{k-1} (stale: the previous version pushed with the version advanced),
zeros, vLLM's dummy init (uniform ±1e-3) and a freshly initialized model (random), and each time
`VLLMEngine.sync_discrepancy` measures mean |log q − log π_θk| per token on the sequences the check
uses: four of the step's rollout (the update was computed on them), and, as before any sampling,
the eval prompts' last tokens. `update` is what a stale sync has to show: the trainer's own
mean |log π_θk − log π_θ(k-1)| on the same tokens. Prints one line per (step, engine, case) and the
range over steps per (engine, case). A measurement, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import torch

from dlcrepro.config import load
from dlcrepro.model import build_tiny_model, make_token_batch
from dlcrepro.train import Cell, PhaseTimer, Trainer

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "smoke.yaml"))
    p.add_argument("--model", default="tiny")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--lr", type=float, help="override train.lr")
    args = p.parse_args()
    over = {"engine.sync_check": False, "train.probe_every": 1000, "train.eval_every": 1000, "train.steps": 1000}
    if args.lr:
        over["train.lr"] = args.lr
    cfg = load(args.config, over)
    tr = Trainer(cfg, args.model, "fp8", "pg", 0, Path(args.model_dir))
    engines = {"bf16": tr.probe_engine, "fp8": tr.engine}
    arch = cfg.models[args.model].arch

    def logp_of(model):
        return lambda pr, rs: tr.token_logp(model, make_token_batch(pr, rs, tr.tokenizer.pad_token_id).to(tr.device)).cpu()

    def state(model):
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    cell = Cell()
    for e in engines.values():
        e.load_weights(state(tr.policy), 0)
    results = defaultdict(list)
    print(f"lr {tr.tcfg.lr}; rows: step, engine, sequences, case, mean |log q - log pi_k| per token (tokens, seconds)")
    for _ in range(args.steps):
        before = state(tr.policy)
        old_model = build_tiny_model(arch, 0).to(tr.device).eval()
        old_model.load_state_dict(before)
        tr.step(cell, PhaseTimer())  # samples with the FP8 engine at θ_{k-1}, then θ_k = θ_{k-1} + update
        k = cell.step
        after = state(tr.policy)
        rollout_seqs = tr.engine.check_seqs
        g = torch.Generator().manual_seed(k)
        cases = {
            "correct": after,
            "stale": before,
            "zeros": {n: torch.zeros_like(t) for n, t in after.items()},
            "dummy": {n: torch.rand(t.shape, generator=g).mul(2e-3).sub(1e-3) for n, t in after.items()},
            "random": state(build_tiny_model(arch, 1000 + k)),
        }
        for seqs_name, seqs in (("rollout", rollout_seqs), ("prompt", None)):
            tr.engine.check_seqs = seqs
            scored = tr.engine.check_sequences(tr.eval_prompts)
            upd = (logp_of(tr.policy)(*scored) - logp_of(old_model)(*scored)).abs().mean()
            results[("trainer", seqs_name, "update")].append(float(upd))
            print(f"{k} trainer {seqs_name} update {float(upd):.4f}")
            for ename, e in engines.items():
                for case, st in cases.items():
                    e.load_weights(st, k)
                    e.check_seqs = seqs
                    t = time.perf_counter()
                    d, n = e.sync_discrepancy(logp_of(tr.policy), tr.eval_prompts)
                    sec = time.perf_counter() - t
                    results[(ename, seqs_name, case)].append(d)
                    print(f"{k} {ename} {seqs_name} {case} {d:.4f} ({n}, {sec:.3f} s)")
                    if case == "stale":  # the same engine against the version it does hold
                        d_old, _ = e.sync_discrepancy(logp_of(old_model), tr.eval_prompts)
                        results[(ename, seqs_name, "stale vs its own version")].append(d_old)
        for e in engines.values():  # back to the correct θ_k and the rollout's sequences for the next step
            e.load_weights(after, k)
            e.check_seqs = rollout_seqs
        tr.sampler_model.load_state_dict(after)
    print("\nengine sequences case: min median max over steps")
    for key, v in results.items():
        v = sorted(v)
        print(f"{' '.join(key)}: {v[0]:.4f} {v[len(v) // 2]:.4f} {v[-1]:.4f}")


if __name__ == "__main__":
    main()
