"""What the weight-sync check sees on its fresh samples: correct syncs, and faults loaded past the manifest.

    python3 bench/sync_check.py --model-dir DIR [--config configs/smoke.yaml] [--model tiny] [--steps 6] [--lr LR]

DIR is the warm-started tiny model (the smoke or tiny config), or a Hugging Face Qwen3 snapshot with
its config (the rehearsal's: `--config configs/rehearsal.yaml --model qwen3-rehearsal --model-dir
<cache>/models--dlcrepro--Qwen3-Rehearsal/snapshots/<commit>`).

A `Trainer` of the `fp8` sampler (its run's engine emulated FP8, its probe engine BF16) takes real RL
steps from the warm-started model in DIR. After each step k (θ_{k−1} → θ_k), on both engines: θ_k
pushed as the trainer pushes it (the load manifest passes: `correct`), and each fault loaded with the
manifest's verdict ignored (`load_past_the_manifest`: what the check alone sees; the manifest catches
every one of them first) into an engine that held θ_{k−1}, told it now holds version k. The faults:
tests/test_sync_manifest.py's FAULTS (t1 = θ_k, t0 = θ_{k−1}, another checkpoint a fresh model),
its stale FP8 scales (fp8 engine), issue 40's sweep over the layers (each layer's projections zeroed,
its q_proj or o_proj transposed, its down_proj zeroed, the layer from another checkpoint), and whole
models (zeros, vLLM's dummy init, another model); and a correct sync of θ_k sharpened (final norm
x40: what a collapsed run's large logits look like). Each time `VLLMEngine.sync_discrepancy` draws the
check's responses and gives mean |log q − log π_θk| over the drawn tokens the trainer gives
π ≥ CHECK_MIN_PROB, and their count. Prints one line per (step, engine, case), then per (engine, case)
the range over steps and the fewest likely tokens. A measurement, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from dlcrepro.core.config import load
from dlcrepro.step.model import make_token_batch
from dlcrepro.step.train import Cell, PhaseTimer, Trainer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
# the faults the tests inject, one list; the load past the manifest, one helper
from test_sync_manifest import L, _changed, fault_table, load_past_the_manifest, stale_fp8_scales  # noqa: E402


def fresh_like(model, seed: int):
    """Another checkpoint of the same architecture: `model`'s class and config, initialised anew."""
    torch.manual_seed(seed)
    return type(model)(model.config).to(next(model.parameters()).dtype)


def per_layer(layers: int) -> dict:
    """Issue 40's sweep: each layer's projections zeroed, q_proj or o_proj transposed, down_proj
    zeroed, or taken from another checkpoint; as FAULTS, (t1, t0, other) -> the state pushed."""
    out = {}
    for i in range(layers):
        a = f"{L}{i}."
        out[f"layer {i}'s projections zeroed"] = lambda t1, t0, o, a=a: {
            k: torch.zeros_like(v) if k.startswith(a) and k.endswith("proj.weight") else v for k, v in t1.items()}
        for m in ("q_proj", "o_proj"):
            out[f"layer {i}'s {m} transposed"] = lambda t1, t0, o, k=f"{a}self_attn.{m}.weight": _changed(
                t1, k, lambda w: w.T.contiguous())
        out[f"layer {i}'s down_proj zeroed"] = lambda t1, t0, o, k=f"{a}mlp.down_proj.weight": _changed(t1, k, torch.zeros_like)
        out[f"layer {i} from another checkpoint"] = lambda t1, t0, o, a=a: {**t1,
                                                                            **{k: v for k, v in o.items() if k.startswith(a)}}
    return out


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
    layers = tr.policy.config.num_hidden_layers

    def logp_of(model):
        return lambda pr, rs: tr.token_logp(model, make_token_batch(pr, rs, tr.tokenizer.pad_token_id).to(tr.device)).cpu()

    def state(model):
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    whole = {
        "zeros": lambda t1, t0, o: {k: torch.zeros_like(v) for k, v in t1.items()},
        "dummy": lambda t1, t0, o: {k: torch.rand(v.shape, generator=torch.Generator().manual_seed(2)).mul(2e-3).sub(1e-3)
                                    for k, v in t1.items()},
        "another model": lambda t1, t0, o: o,
    }
    faults = {name: make for name, (make, _named) in fault_table(layers).items()} | per_layer(layers) | whole
    stale_key = f"{L}{min(2, layers - 1)}.mlp.down_proj.weight"
    cell = Cell()
    for e in engines.values():
        e.load_weights(state(tr.policy), 0)
    results, counts = defaultdict(list), defaultdict(list)
    print(f"lr {tr.tcfg.lr}; rows: step, engine, case, mean |log q - log pi_k| per likely drawn token (likely tokens/drawn "
          "tokens, seconds)")
    for _ in range(args.steps):
        before = state(tr.policy)
        tr.step(cell, PhaseTimer())  # samples with the FP8 engine at θ_{k-1}, then θ_k = θ_{k-1} + update
        k, after = cell.step, state(tr.policy)
        other = state(fresh_like(tr.policy, 1000 + k))
        for ename, e in engines.items():
            cases = {"correct": None} | faults | ({"stale FP8 scales": None} if ename == "fp8" else {})
            for case, make in cases.items():
                e.load_weights(before, k - 1)  # what the engine held before this push
                note = ""
                if case == "correct":
                    e.load_weights(after, k)
                else:
                    sent = stale_fp8_scales(e, after, before,
                                            stale_key) if case == "stale FP8 scales" else e.transform(make(after, before, other))
                    if load_past_the_manifest(e, sent, k).unknown:
                        note = ", nothing reloaded: the engine keeps θ_k-1"
                t = time.perf_counter()
                d, n = e.sync_discrepancy(logp_of(tr.policy), tr.eval_prompts)
                sec = time.perf_counter() - t
                drawn = sum(map(len, e.check_draw(tr.eval_prompts).response_ids))
                results[(ename, case)].append(d)
                counts[(ename, case)].append(n)
                print(f"{k} {ename} {case}: {d:.4f} ({n}/{drawn}, {sec:.3f} s{note})", flush=True)
            # a correct sync of a collapsed-like policy: θ_k's final norm x40, every logit that much larger
            sharp = {n: v * 40.0 if n == "model.norm.weight" else v for n, v in after.items()}
            sharp_model = copy.deepcopy(tr.policy).eval()
            sharp_model.load_state_dict(sharp)
            e.load_weights(sharp, k)
            d, n = e.sync_discrepancy(logp_of(sharp_model), tr.eval_prompts)
            results[(ename, "correct, sharpened x40")].append(d)
            counts[(ename, "correct, sharpened x40")].append(n)
            print(f"{k} {ename} correct, sharpened x40: {d:.4f} ({n})", flush=True)
            e.load_weights(after, k)  # the correct θ_k for the next step
        tr.sampler_model.load_state_dict(after)
    print("\nengine case: min median max over steps (fewest likely tokens)")
    for key, v in results.items():
        v = sorted(v, key=lambda x: (math.isnan(x), x))
        print(f"{key[0]} {key[1]}: {v[0]:.4f} {v[len(v) // 2]:.4f} {v[-1]:.4f} ({min(counts[key])})")


if __name__ == "__main__":
    main()
