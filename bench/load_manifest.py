"""What the weight-sync load manifest costs per push, and which of its checks catches each fault.

    python3 bench/load_manifest.py --model-dir DIR [--config configs/smoke.yaml] [--pushes 20]

For the bf16 and the emulated fp8 engine (and, with --native, vLLM's native FP8 engine: AMX or a GPU)
on the model in DIR: `--pushes` correct pushes of a trainer state that moves a little each time (as
after an update), timing vLLM's reload and the manifest's own work (reading every linear layer through
its kernel, the other tensors' fingerprints and the comparison), and the worst linear layer of each, in
bounds (manifest.worst_error); then each fault of tests/test_sync_manifest.py's FAULTS pushed against
the trainer's state, printing the part of the WeightLoadError that caught it and the worst layer's
error in bounds ("a push one update stale" sends the previous push's state, one update of 1 % of each
tensor's mean |w| away). A measurement, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

import torch

from dlcrepro.core.config import EngineConfig, load
from dlcrepro.step.engine import VLLMEngine, WeightLoadError
from dlcrepro.step.model import build_tiny_model, load_model

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from test_sync_manifest import FAULTS  # noqa: E402  (the faults the tests inject, one list)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "smoke.yaml"))
    p.add_argument("--model-dir", required=True)
    p.add_argument("--pushes", type=int, default=20)
    p.add_argument("--native", action="store_true", help="also vLLM's native FP8 engine (needs AMX or a GPU)")
    args = p.parse_args()
    cfg = load(args.config)
    model = load_model(args.model_dir).eval()
    theta_0 = {k: v.detach().clone() for k, v in model.state_dict().items()}
    other = {k: v.detach() for k, v in build_tiny_model(cfg.models["tiny"].arch, seed=7).state_dict().items()}
    g = torch.Generator().manual_seed(0)
    engines = [("bf16", "emulate"), ("fp8", "emulate")] + ([("fp8", "native")] if args.native else [])
    for precision, backend in engines:
        engine_cfg = EngineConfig(**{**cfg.engine.__dict__, "fp8_backend": backend})
        engine = VLLMEngine(args.model_dir, engine_cfg, precision, seed=0, max_model_len=64)
        reload_ms, manifest_ms, worst, state = [], [], [], theta_0
        for version in range(1, args.pushes + 1):
            with torch.no_grad():
                for q in model.parameters():
                    q.add_(0.01 * q.abs().mean() * torch.randn(q.shape, generator=g))
            previous, state = state, {k: v.detach().clone() for k, v in model.state_dict().items()}
            # the expected weights a separate dict, as a sampler sync's θ_t: transformed and fingerprinted apart
            m = engine.load_weights(state, version, expected=dict(state))
            worst.append(max(m.computed.values()))
            reload_ms.append(1e3 * engine.reload_seconds)
            manifest_ms.append(1e3 * engine.manifest_seconds)
        print(f"{engine.kind}: {args.pushes} correct pushes, vLLM's reload median {statistics.median(reload_ms):.1f} ms "
              f"(max {max(reload_ms):.1f}), the manifest's own work median {statistics.median(manifest_ms):.1f} ms "
              f"(max {max(manifest_ms):.1f}); worst linear layer {max(worst):.3g} bounds; {engine.computes_with}")
        for fault, (make, _named) in FAULTS.items():
            try:
                engine.load_weights(make(state, previous, other), version, expected=state)
                print(f"  {fault}: NOT CAUGHT")
            except WeightLoadError as e:
                caught = [part.split(":")[0].split(" (")[0]
                          for part in str(e).split(f"given version {version}: ")[1].split(". vLLM warned")[0].split("; ")]
                errors = re.findall(r"[.]weight (inf|[0-9][0-9.e+-]*[0-9]|[0-9])", str(e))
                worst_fault = f"; worst layer {max(map(float, errors)):.3g} bounds" if errors else ""
                print(f"  {fault}: caught by {' + '.join(caught)}{worst_fault}")
            engine.load_weights(state, version, expected=state)


if __name__ == "__main__":
    main()
