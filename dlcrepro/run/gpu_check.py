"""`python -m dlcrepro.run.gpu_check`: every GPU-side piece that can run on this machine, one line each.

Runs on a machine with one CUDA GPU and PyTorch; transformers, vLLM and model weights are optional
(pieces that need a missing one say SKIP and why). Everything uses models built here from a
seed: no download. Exit status 1 when a piece FAILs. `--device cpu` runs the same checks on the
CPU (what the test suite does, to keep the script itself working).

Pieces:
  cuda          the device, its memory, bf16 support
  quantizer     block-FP8 quantization on the device equals the CPU's bit for bit
  activations   per-token 1x128 FP8 activation rounding on the device equals the CPU's
  corrections   every registered correction's loss and gradient on the device equal the CPU's
  trainer       tiny Qwen3 on the device: log-probs at θ_t/θ_s/θ_0 in the trainer's numerics
                (bf16 autocast, fp32 weights and log-softmax), an SGD step, micro-batching exact
                (by sequences and padded tokens, each micro-batch cut to its longest row)
  vllm-bf16     vLLM engine (CUDA graphs) on the tiny model: weights pushed, samples, log-probs
                within BF16 tolerance of the trainer's
  vllm-fp8      vLLM's native block-FP8 path (CUTLASS, pinned) fed weight + weight_scale_inv: the
                kernel each layer got, the load check reading every layer through it (scales used as
                sent, not requantized), samples, a larger discrepancy than BF16, a sync that changes them
  cell          three steps of a real grid cell (fp8_stale/dlc) through run_cell on the device
  paper-trainer the trainer's side of one paper step (a stale sampler, dlc, probes) at Qwen3-0.6B
                and -1.7B size (random weights, their published architectures) with the paper
                config's batch, micro_batch and micro_batch_tokens: seconds per phase and peak GPU
                memory, which the memory plan and cost model of docs/cluster.md only estimate. CUDA only.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from ..core.arch import QWEN3_ARCH

# Linear widths that are multiples of 128 so that vLLM's block-FP8 path takes the model (the
# smoke/tiny model's k/v projections are 64 wide).
ALIGNED_ARCH = dict(
    vocab_size=32,
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=32,
    max_position_embeddings=128,
    tie_word_embeddings=True,
    rope_theta=10000.0,
)


def small_arch(arch: dict) -> dict:
    """`arch` shrunk to run the paper-size code paths on a CPU in seconds."""
    return dict(arch, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                head_dim=32, vocab_size=1000)


class Skip(Exception):
    """A piece that cannot run here (a missing package or device)."""


def _need(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise Skip(f"{module} not installed")


def check_cuda(dev: torch.device) -> str:
    if dev.type != "cuda":
        return "cpu run (no CUDA asked for)"
    if not torch.cuda.is_available():
        raise AssertionError("torch.cuda.is_available() is False")
    p = torch.cuda.get_device_properties(dev)
    return f"{p.name}, {p.total_memory / 2**30:.0f} GiB, bf16 {torch.cuda.is_bf16_supported()}, torch {torch.__version__}"


def check_quantizer(dev: torch.device) -> str:
    from ..step import quant

    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 260, generator=g) * torch.logspace(-3, 1, 260)  # blocks of very different scale
    w[:128, :128] = 0  # an all-zero block
    q_cpu, s_cpu = quant.fp8_block_quantize(w)
    q_dev, s_dev = quant.fp8_block_quantize(w.to(dev))
    assert torch.equal(q_cpu.view(torch.uint8), q_dev.cpu().view(torch.uint8)), "FP8 bits differ"
    assert torch.equal(s_cpu, s_dev.cpu()), "scales differ"
    err = (quant.fp8_block_dequantize(q_dev, s_dev).cpu() - w).abs().max().item()
    return f"bit-identical q and scale_inv {tuple(s_dev.shape)}; max |w - dq(q)| {err:.3g}"


def check_activations(dev: torch.device) -> str:
    from ..step import quant

    x = torch.randn(7, 5, 300, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    a, b = quant.fp8_round_activations(x), quant.fp8_round_activations(x.to(dev)).cpu()
    assert torch.equal(a, b), f"max diff {(a.float() - b.float()).abs().max().item()}"
    return "bit-identical"


def check_corrections(dev: torch.device) -> str:
    from ..step.corrections import CORRECTIONS, CorrectionParams, TokenTerms, engine_distribution

    g = torch.Generator().manual_seed(2)
    n, v, d = 64, 50, 16
    feats, w0 = torch.randn(n, d, generator=g), torch.randn(d, v, generator=g) * 0.3
    tokens = torch.randint(v, (n,), generator=g)
    adv = torch.randn(n, generator=g)
    logp_s = torch.log_softmax(feats @ (w0 + 0.05 * torch.randn(d, v, generator=g)), -1)
    e = logp_s.gather(-1, tokens[:, None]).squeeze(-1) + 0.01 * torch.randn(n, generator=g)
    topv, topi = logp_s.topk(10, -1)

    def run(device):
        w = w0.clone().to(device).requires_grad_(True)
        logits = feats.to(device) @ w
        b = torch.log_softmax(logits.detach(), -1).gather(-1, tokens.to(device)[:, None]).squeeze(-1)
        ls = logp_s.to(device)
        q = engine_distribution(topi.to(device), topv.to(device), ls)
        tok = tokens.to(device)
        terms = TokenTerms(logits=logits, tokens=tok, adv=adv.to(device), e=e.to(device),
                           a=ls.gather(-1, tok[:, None]).squeeze(-1),
                           old=b, q=q, logp_s_of=lambda: ls, seq=torch.arange(n, device=device) // 4, num_seqs=n // 4)
        out = {}
        for name, c in CORRECTIONS.items():
            (grad,) = torch.autograd.grad(c.fn(terms, CorrectionParams()).loss, w, retain_graph=True)
            out[name] = grad.cpu().double()
        return out

    cpu, on_dev = run(torch.device("cpu")), run(dev)
    worst = max(((cpu[k] - on_dev[k]).norm() / cpu[k].norm().clamp_min(1e-12)).item() for k in cpu)
    assert worst < 1e-4, f"relative gradient difference {worst:.2e}"
    return f"{len(cpu)} corrections, worst relative gradient difference {worst:.1e}"


def _tiny_batch(n: int = 24):
    from ..step import countdown
    from ..step.model import build_tokenizer, make_token_batch

    tok = build_tokenizer()
    problems = countdown.generate(n, seed=0, number_range=(1, 9), target_range=(1, 30))
    prompts = [tok(countdown.compact_prompt(p), add_special_tokens=False).input_ids for p in problems]
    answers = [tok(countdown.solve(p.numbers, p.target), add_special_tokens=False).input_ids + [tok.eos_token_id]
               for p in problems]
    return tok, make_token_batch(prompts, answers, tok.pad_token_id)


def check_trainer(dev: torch.device) -> str:
    """The run's `Learner` on the device in the paper's trainer numerics (bf16 autocast)."""
    _need("transformers")
    import dataclasses

    from ..core.config import TrainConfig
    from ..step.model import build_tiny_model, response_logits, token_logprobs
    from ..step.learner import Learner, Scored

    _, tb = _tiny_batch()
    tb = tb.to(dev)
    learner = Learner(build_tiny_model(ALIGNED_ARCH, 0), TrainConfig(lr=0.5), "pg", "bfloat16", dev)
    b = learner.token_logp(learner.policy, tb)
    assert b.dtype == torch.float32, b.dtype
    a = learner.token_logp(learner.sampler_model, tb)
    assert torch.equal(a, b), "θ_s = θ_t but log-probs differ: the numerics are not identical"
    whole = learner.tcfg
    # rows of 17-18 tokens: 3 per micro-batch (the token bound, not micro_batch), each cut to its longest row
    learner.tcfg = dataclasses.replace(whole, micro_batch=5, micro_batch_tokens=64)
    assert torch.allclose(learner.token_logp(learner.policy, tb), b, atol=1e-5), "micro-batched log-probs differ"
    learner.tcfg = whole
    ones = torch.ones(tb.tokens.numel(), device=dev)  # advantage 1 everywhere: the gradient of −mean log π
    learner.sgd_step(learner.pg_grad(Scored(tb, torch.ones(tb.num_seqs), ones)))
    b2 = learner.token_logp(learner.policy, tb)
    lag = (b2 - a).abs().mean().item()
    assert lag > 0 and torch.equal(learner.token_logp(learner.initial_model, tb), a), "θ_0 changed or θ_t did not"
    with torch.no_grad():
        fp32 = token_logprobs(response_logits(learner.policy, tb), tb.tokens)
    d = (fp32 - b2).abs().mean().item()
    return f"log-probs at θ_t/θ_s/θ_0 in bf16 autocast; SGD step moved them {lag:.3g}/token; bf16 vs fp32 {d:.3g}/token"


def _engine_cfg():
    from ..core.config import EngineConfig

    return EngineConfig(max_tokens=16, topk=64, kv_cache_mib=64, gpu_memory_utilization=0.2)


def _model_dir(tmp: Path):
    from ..step.model import build_tiny_model, build_tokenizer, save_model_dir

    mdir = tmp / "aligned"
    if not (mdir / "config.json").exists():
        save_model_dir(build_tiny_model(ALIGNED_ARCH, 0), build_tokenizer(), mdir)
    return mdir


def _delta(engine, model, prompts, dev):
    from ..step.model import make_token_batch, response_logits, token_logprobs

    r = engine.generate(prompts, 8, seed=0, topk=64)
    tb = make_token_batch(r.prompt_ids, r.response_ids).to(dev)
    with torch.no_grad():
        a = token_logprobs(response_logits(model, tb), tb.tokens)
    return r, (a.cpu() - r.engine_logp).abs().mean().item()


def check_vllm(dev: torch.device, tmp: Path, precision: str) -> str:
    _need("transformers")
    _need("vllm")
    from ..step import countdown
    from ..step.engine import VLLMEngine
    from ..step.model import build_tokenizer, load_model

    mdir = _model_dir(tmp)
    cfg = _engine_cfg()  # fp8_backend "auto": vLLM's native block-FP8 on CUDA, the emulation on CPU
    model = load_model(mdir).to(dev).eval()
    tok = build_tokenizer()
    prompts = [tok(countdown.compact_prompt(p), add_special_tokens=False).input_ids
               for p in countdown.generate(16, seed=1, number_range=(1, 9), target_range=(1, 30))]
    t = time.perf_counter()
    engine = VLLMEngine(str(mdir), cfg, precision, seed=0, max_model_len=64)
    start = time.perf_counter() - t
    # the load check reads each layer through its kernel: scales requantized after loading (DeepGEMM's
    # E8M0) or a kernel computing something else fail it here, naming the layers
    loaded = engine.load_weights({k: v.detach() for k, v in model.state_dict().items()}, 0)
    r, delta = _delta(engine, model, prompts, dev)
    assert r.topk_logp is not None and torch.allclose(r.topk_logp.exp().sum(-1), torch.ones(len(r.topk_logp)), atol=2e-2)
    msg = (f"start {start:.1f} s, {engine.computes_with}; every layer computes the weights as sent (worst "
           f"{max(loaded.computed.values()):.3g} of the bound); eager {engine.llm.llm_engine.model_config.enforce_eager}, "
           f"mean |δ| {delta:.4f}/token")
    if precision == "bf16":
        assert delta < 0.05, msg
    else:
        with torch.no_grad():  # a sync changes what it samples
            for p in model.parameters():
                p.mul_(1.5)
        engine.load_weights({k: v.detach() for k, v in model.state_dict().items()}, 1)
        r2, delta2 = _delta(engine, model, prompts, dev)
        assert r2.response_ids != r.response_ids, "the engine ignored the new weights"
        assert delta2 < 0.5, f"after a sync the FP8 engine is off by {delta2:.3f}/token"
        msg += f"; after a sync {delta2:.4f}/token"
    del engine
    return msg


def check_cell(dev: torch.device, tmp: Path) -> str:
    _need("transformers")
    _need("vllm")
    from ..core.config import load
    from ..study.celldir import run_cell

    root = Path(__file__).resolve().parents[2]
    over = {
        "models": {"tiny": {"kind": "tiny", "arch": ALIGNED_ARCH,
                            "trainer_dtype": "bfloat16" if dev.type == "cuda" else "float32"}},
        "train.steps": 3,
        "train.prompts_per_step": 4,
        "train.responses_per_prompt": 4,
        "train.eval_every": 3,
        "train.probe_every": 1,
        "task.n_train": 200,
        "task.n_test": 16,
        "engine.kv_cache_mib": 64,
        "engine.gpu_memory_utilization": 0.2,
        "engine.max_tokens": 16,
    }
    cfg = load(root / "configs" / "smoke.yaml", over)
    t = time.perf_counter()
    s = run_cell(cfg, "tiny", "fp8_stale", "dlc", 0, tmp / "cell", model_dir=str(_model_dir(tmp)))
    assert s["steps"] == 3, s
    return (f"3 steps in {time.perf_counter() - t:.1f} s; M {s['noise_floor_multiple']:.2f}, "
            f"test accuracy {s['final_test_accuracy']:.2f}")


def paper_step_batch(num_seqs: int, group: int, prompt_len: int, resp_len: tuple[int, int], vocab: int, topk: int, seed: int):
    """A (Scored, Rollout) pair with the paper step's shapes and random tokens: `num_seqs`
    responses of `group` per prompt, lengths uniform in `resp_len`, top-`topk` engine log-probs."""
    from ..step.engine import Rollout
    from ..step.model import make_token_batch
    from ..step.learner import Scored, advantages

    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(resp_len[0], resp_len[1] + 1, (num_seqs,), generator=g).tolist()
    prompts = [torch.randint(vocab, (prompt_len,), generator=g).tolist() for _ in range(num_seqs // group)]
    prompt_ids = [prompts[i // group] for i in range(num_seqs)]
    response_ids = [torch.randint(vocab, (n,), generator=g).tolist() for n in lens]
    tb = make_token_batch(prompt_ids, response_ids)
    n = tb.tokens.numel()
    topk_logp = torch.log_softmax(torch.randn(n, topk + 1, generator=g), -1)[:, :topk].sort(-1, descending=True).values
    rollout = Rollout(
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        group=torch.arange(num_seqs) // group,
        engine_logp=topk_logp[:, 0] - 0.01,
        topk_ids=torch.randint(vocab, (n, topk), generator=g),
        topk_logp=topk_logp,
        version=0,
    )
    rewards = torch.where(torch.rand(num_seqs, generator=g) < 0.3, 1.0, -1.0)
    adv = advantages(rewards, rollout.group, num_seqs // group)
    return Scored(tb, rewards, adv[tb.seq]), rollout


def learner_step(learner, scored, probes, rollout) -> dict[str, float]:
    """The trainer's side of one step of `Trainer.step` (a stale sampler, probing): seconds per
    phase, with the device synchronised at each phase's end."""
    from ..step.diagnostics import squared_distance

    dev = learner.device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sec, t = {}, time.perf_counter()

    def lap(name):
        nonlocal t
        sync()
        sec[name] = time.perf_counter() - t
        t = time.perf_counter()

    s = scored
    batch = learner.batch(rollout, s, synced=False)
    lap("logprobs")
    p = learner.probe(probes)
    lap("probe")
    g_c, _ = learner.correction_grad(batch)
    lap("correction")
    learner.update(batch, g_c, updates=1)
    dev_, floor = squared_distance(g_c, p.g_on), squared_distance(p.g_on, p.g_on2)
    assert math.isfinite(dev_) and floor > 0, (dev_, floor)
    lap("update")
    return sec


def check_paper_trainer(dev: torch.device, models=tuple(QWEN3_ARCH), shape: dict | None = None, archs: dict | None = None) -> str:
    """One trainer step per paper model at the paper config's batch, micro_batch and lr; the
    sampled tokens are random (the trainer's cost does not depend on them), the response lengths
    uniform in [150, 450] (~300 tokens, the cost model's assumption) after a ~120-token chat prompt."""
    _need("transformers")
    if dev.type != "cuda" and shape is None:
        raise Skip("paper-size models need a GPU (the tests run this piece at a small size on CPU)")
    from ..core.config import load
    from ..step.model import build_tiny_model
    from ..step.learner import Learner

    cfg = load(Path(__file__).resolve().parents[2] / "configs" / "paper.yaml")
    shape = shape or dict(prompt_len=120, resp_len=(150, 450))
    archs = archs or QWEN3_ARCH
    out = []
    for name in models:
        tcfg = cfg.train_for(name)
        arch = archs[name]
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
        t = time.perf_counter()
        with torch.device(dev):
            model = build_tiny_model(arch, 0)
        learner = Learner(model, tcfg, "dlc", cfg.models[name].trainer_dtype, dev)
        build = time.perf_counter() - t
        num_seqs, group = tcfg.prompts_per_step * tcfg.responses_per_prompt, tcfg.responses_per_prompt
        mk = lambda seed, n=num_seqs: paper_step_batch(  # noqa: E731
            n, group, vocab=arch["vocab_size"], topk=cfg.engine.topk, seed=seed, **shape)
        to = lambda sr: (type(sr[0])(sr[0].tb.to(dev), sr[0].rewards, sr[0].adv_tok.to(dev)), sr[1])  # noqa: E731
        # warm-up (kernels, allocator) on a batch of two micro-batches, then the full step
        (w, wr), (w1, _), (w2, _) = (to(mk(seed, 2 * tcfg.micro_batch)) for seed in (9, 10, 11))
        learner_step(learner, w, [w1, w2], wr)
        (s, r), (p1, _), (p2, _) = to(mk(0)), to(mk(1)), to(mk(2))
        sec = learner_step(learner, s, [p1, p2], r)
        peak = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else float("nan")
        params = sum(p.numel() for p in learner.params) / 1e9
        out.append(
            f"{name} ({params:.2f}B params, {num_seqs} seqs, {s.tb.tokens.numel()} response tokens, "
            f"micro_batch {tcfg.micro_batch}, micro_batch_tokens {tcfg.micro_batch_tokens}): "
            f"build {build:.1f} s; step " + ", ".join(f"{k} {v:.1f}" for k, v in sec.items())
            + f" = {sum(sec.values()):.1f} s; peak {peak:.1f} GiB"
        )
        del learner, model, s, p1, p2, w, w1, w2
    return "; ".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dlcrepro.run.gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--only", nargs="*", help="run only these pieces")
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    tmp = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    pieces = {
        "cuda": lambda: check_cuda(dev),
        "quantizer": lambda: check_quantizer(dev),
        "activations": lambda: check_activations(dev),
        "corrections": lambda: check_corrections(dev),
        "trainer": lambda: check_trainer(dev),
        "vllm-bf16": lambda: check_vllm(dev, tmp, "bf16"),
        "vllm-fp8": lambda: check_vllm(dev, tmp, "fp8"),
        "cell": lambda: check_cell(dev, tmp),
        "paper-trainer": lambda: check_paper_trainer(dev),
    }
    failed = 0
    for name, fn in pieces.items():
        if args.only and name not in args.only:
            continue
        t = time.perf_counter()
        try:
            status, msg = "PASS", fn()
        except Skip as e:
            status, msg = "SKIP", str(e)
        except Exception as e:  # a piece's failure is reported, the others still run
            status, msg = "FAIL", f"{type(e).__name__}: {e}"
            traceback.print_exc(file=sys.stderr)
            failed += 1
        print(f"{status} {name:<12s} {time.perf_counter() - t:6.1f} s  {msg}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
