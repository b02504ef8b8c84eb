"""The trainer's memory per micro-batch and its time per token: measured on a CPU at small sizes,
fitted, and extrapolated to Qwen3-0.6B and -1.7B (docs/cluster.md, "Memory and time model";
the fitted coefficients are dlcrepro/cluster/memory.py's LAYER_BYTES and LOGIT_BYTES).

    OMP_NUM_THREADS=1 python bench/memory_model.py validate  # the counter on cases known by hand, and against ru_maxrss
    OMP_NUM_THREADS=1 python bench/memory_model.py same      # real vs shape-only tensors: the same bytes
    OMP_NUM_THREADS=1 python bench/memory_model.py fit       # peak = c + (a_0 + L·a_layer)·T + a_R·R per shape, 1-2 layers
    OMP_NUM_THREADS=1 python bench/memory_model.py widths    # a_layer as a linear form in the layer's widths
    OMP_NUM_THREADS=1 python bench/memory_model.py logits    # a_R / V for the probe and every correction
    OMP_NUM_THREADS=1 python bench/memory_model.py step      # a real step at rehearsal size vs its composition
    OMP_NUM_THREADS=1 python bench/memory_model.py paper     # the paper step at 28 layers, shape-only (~2-4 min each)
    OMP_NUM_THREADS=1 python bench/memory_model.py time      # CPU seconds per token of a forward+backward vs its FLOPs

What is measured: the bytes of tensor storage alive at the peak of one micro-batch of the trainer's
own code (`Learner.pg_grad`, the probe path: response_logits + token_logprobs + a backward through
flat_grad; `Learner.correction_grad` for each correction, with θ_s's distribution and the engine's
q), counted by `LiveBytes`: every ATen op's output whose storage is new (a view or an in-place op
adds nothing), released when the storage is freed. That is what torch.cuda.max_memory_allocated
reports on a GPU (the H200 peaks in docs/cluster.md), less the caching allocator's 512-byte
rounding. Tensors that exist before the block (the weights) are not counted: they are counted by
hand (cluster.peak_memory).

Real tensors cost CPU time, and bf16 autocast on a CPU without AMX is emulated (~15x slower), so
the Qwen3-shaped fits run on shape-only tensors (FakeTensorMode: the same ops, shapes and dtypes,
no arithmetic) after `same` has shown that real and shape-only tensors give the same bytes where
both run. A benchmark: it asserts only the counter's hand cases, and prints one JSON line per result.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import time
import weakref
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dlcrepro.run import gpu_check  # noqa: E402
from dlcrepro.core.arch import QWEN3_ARCH  # noqa: E402
from dlcrepro.study.rehearsal import REHEARSAL_ARCH  # noqa: E402

ARCHS = {"rehearsal": REHEARSAL_ARCH, **QWEN3_ARCH}
PAPER_CORRECTIONS = ("pg", "center", "is", "is_center", "ppo", "dlc", "is_resync")
MALLOC_RETURNS = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


class LiveBytes(TorchDispatchMode):
    """`now` and `peak`: bytes of the tensor storages created inside the block and still alive.

    An op's output counts when its storage is not one of the op's inputs' (views, in-place ops and
    detach share their input's); it stops counting when the storage is freed (a weakref callback).
    `at`: the op that set the peak."""

    def __init__(self):
        super().__init__()
        self.now = self.peak = 0
        self.at = ""
        self._live: dict[int, int] = {}
        self._finalizers: list[weakref.finalize] = []

    def __exit__(self, *exc):
        for f in self._finalizers:  # nothing of this block's calls back once it is over
            f.detach()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key = id(st)
            if key in inputs or key in self._live:
                continue
            self._live[key] = st.nbytes()
            self.now += self._live[key]
            if self.now > self.peak:
                self.peak, self.at = self.now, str(func)
            self._finalizers.append(weakref.finalize(st, self._free, key))
        return out

    def _free(self, key: int) -> None:
        self.now -= self._live.pop(key, 0)


# ----------------------------------------------------------------------------- models and batches


def build(arch: dict, layers: int, vocab: int | None = None, fake=None):
    """A Qwen3ForCausalLM of `arch` with `layers` layers (and `vocab` entries) in float32, random
    weights; shape-only under a FakeTensorMode `fake`."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    a = dict(arch, num_hidden_layers=layers, **({"vocab_size": vocab} if vocab else {}))
    cfg = Qwen3Config(**a, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    torch.manual_seed(0)
    with fake or contextlib.nullcontext():
        return Qwen3ForCausalLM(cfg)


def learner(model, correction: str, dtype: str, rows: int):
    """The run's Learner around `model` (θ_s and θ_0 its copies), its micro-batch `rows` sequences and
    no token bound: one micro-batch per call."""
    from dlcrepro.step import learner as lrn
    from dlcrepro.core.config import TrainConfig

    tcfg = TrainConfig(micro_batch=rows, micro_batch_tokens=0, lr=0.02)
    if not isinstance(next(model.parameters()), FakeTensor):
        return lrn.Learner(model, tcfg, correction, dtype, torch.device("cpu"))
    # Shape-only modules cannot move their parameters (`.to`), and deepcopy reads a FakeTensor's
    # data pointer (undefined, and it corrupts the heap here): θ_s and θ_0 are built anew instead.
    fake, cls = next(model.parameters()).fake_mode, type(model)

    def twin(m, *memo):
        if not isinstance(m, cls):
            return real(m, *memo)
        with fake:
            out = cls(m.config)
        out.to = lambda *a, **k: out
        return out

    model.to = lambda *a, **k: model
    real, lrn.copy.deepcopy = lrn.copy.deepcopy, twin
    try:
        return lrn.Learner(model, tcfg, correction, dtype, torch.device("cpu"))
    finally:
        lrn.copy.deepcopy = real


def batch(rows: int, prompt: int, response: int, vocab: int, seed: int = 0):
    """`rows` sequences of `prompt` + `response` tokens (one prompt, all the same length: padded
    tokens T = rows × (prompt + response), response tokens R = rows × response), with the engine's
    top-20 log-probs: the (Scored, Rollout) of `gpu_check.paper_step_batch`."""
    return gpu_check.paper_step_batch(rows, rows, prompt, (response, response), vocab, topk=20, seed=seed)


def micro_batch(ln, path: str, s, r) -> None:
    """One micro-batch of the trainer's `path`: `probe` (`Learner.pg_grad`, an on-policy probe's
    gradient), else the learner's correction's gradient (`Learner.correction_grad`: logits at θ_t
    recomputed, θ_s's distribution from its own forward, the engine's q where the correction reads
    it), as a step of more than one micro-batch runs them."""
    from dlcrepro.step.learner import Batch, BatchLogProbs

    if path == "probe":
        ln.pg_grad(s)
        return
    e = r.engine_logp
    lp = BatchLogProbs(a=e.clone(), b=e.clone(), kl_sampler=0.0)
    ln.correction_grad(Batch(r, s, lp, e, synced=False))


@contextlib.contextmanager
def no_diagnostics():
    """Shape-only tensors hold no values: skip the correction's diagnostics (floats of the weights),
    computed after the gradient and allocating nothing of note."""
    from dlcrepro.step import learner as lrn

    real = lrn.weight_diagnostics
    lrn.weight_diagnostics = lambda *a, **k: {}
    try:
        yield
    finally:
        lrn.weight_diagnostics = real


def measure(arch: str, layers: int, dtype: str, path: str, rows: int, prompt: int, response: int,
            fake: bool = True, vocab: int | None = None) -> dict:
    """Peak bytes of one micro-batch (`LiveBytes`), with its shape."""
    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else None
    model = build(ARCHS[arch], layers, vocab, mode)
    ln = learner(model, "pg" if path == "probe" else path, dtype, rows)
    V = model.config.vocab_size
    s, r = batch(rows, prompt, response, V)
    if fake:
        fake_inputs(mode, s, r)
    t = time.perf_counter()
    with LiveBytes() as m, (no_diagnostics() if fake else contextlib.nullcontext()):
        micro_batch(ln, path, s, r)
    params = sum(p.numel() for p in ln.params)
    return dict(arch=arch, layers=layers, dtype=dtype, path=path, rows=rows, prompt=prompt, response=response,
                T=rows * (prompt + response), R=rows * response, V=V, params=params, fake=fake, peak=m.peak,
                after=m.now, peak_op=m.at, seconds=round(time.perf_counter() - t, 2))


def emit(d: dict) -> dict:
    print(json.dumps(d), flush=True)
    return d


# ----------------------------------------------------------------------------- validate


def validate(_args) -> None:
    """The counter on cases known by hand, then against the process's peak RSS."""
    with LiveBytes() as m:
        a = torch.empty(1000, 1000)
        b = torch.empty(500, 1000)
        del a
        c = torch.empty(250, 1000)
    assert (m.peak, m.now) == (4 * 1_500_000, 4 * 750_000), (m.peak, m.now)
    del b, c
    # y = x @ w and a backward of y.sum(): y (n, m), the sum and its ones (4 bytes each), then
    # dL/dx (n, k) and dL/dw (k, m); the ones broadcast as an expand (a view), never materialised
    n, k, mm = 300, 200, 400
    x, w = torch.randn(n, k, requires_grad=True), torch.randn(k, mm, requires_grad=True)
    with LiveBytes() as m:
        y = x @ w
        y.sum().backward()
    hand = 4 * (n * mm + n * k + k * mm) + 4 + 4
    assert m.peak == hand, (m.peak, hand)
    emit(dict(case="hand", tensors=6_000_000, matmul_backward=m.peak, by_hand=hand))
    # against ru_maxrss, in fresh processes: a real micro-batch of the probe path. glibc keeps a freed
    # block below its (dynamic, up to 32 MiB) mmap threshold in the heap, resident, for reuse: the
    # RSS would not fall after the warm-up's frees, nor grow as the same sizes come back. A fixed
    # threshold of 64 KiB hands every larger block to mmap, returned to the OS when freed.
    for arch, layers, rows, prompt, response in (("qwen3-0.6b", 1, 4, 64, 192), ("rehearsal", 2, 32, 100, 400)):
        out = subprocess.run([sys.executable, __file__, "_rss", arch, str(layers), str(rows), str(prompt), str(response)],
                             capture_output=True, text=True, check=True, env={**os.environ, **MALLOC_RETURNS})
        emit(json.loads(out.stdout.strip().splitlines()[-1]))


def _rss(args) -> None:
    """One real micro-batch in this fresh process: the counter's peak and the peak RSS's growth."""
    import gc

    arch, layers, rows, prompt, response = args.rest[0], *map(int, args.rest[1:])
    model = build(ARCHS[arch], layers)
    ln = learner(model, "pg", "float32", rows)
    s, r = batch(rows, prompt, response, model.config.vocab_size)
    micro_batch(ln, "probe", s, r)  # warm-up: the allocator's arenas and the kernels' buffers
    gc.collect()
    rss = lambda: int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()  # noqa: E731
    before_max, before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, rss()
    with LiveBytes() as m:
        micro_batch(ln, "probe", s, r)
    after_max = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(dict(case="rss", arch=arch, layers=layers, T=rows * (prompt + response), R=rows * response,
                          counted_peak=m.peak, rss_before=before, maxrss_before=before_max, maxrss_after=after_max,
                          maxrss_growth_over_rss=after_max - before)))


# ----------------------------------------------------------------------------- real vs shape-only


def same(_args) -> None:
    """Real and shape-only tensors, the same micro-batch: the same peak bytes (float32 and bf16 at
    rehearsal size; float32 at one Qwen3-0.6B layer)."""
    cases = [("rehearsal", 2, dt, path, 8, 100, 50) for dt in ("float32", "bfloat16") for path in ("probe", "dlc", "is")]
    cases += [("qwen3-0.6b", 1, "float32", path, 2, 64, 64) for path in ("probe", "dlc")]
    for arch, layers, dtype, path, rows, prompt, response in cases:
        real = measure(arch, layers, dtype, path, rows, prompt, response, fake=False)
        shape = measure(arch, layers, dtype, path, rows, prompt, response, fake=True)
        emit(dict(case="same", arch=arch, layers=layers, dtype=dtype, path=path, T=real["T"], R=real["R"],
                  real=real["peak"], shape_only=shape["peak"], equal=real["peak"] == shape["peak"],
                  real_seconds=real["seconds"]))


# ----------------------------------------------------------------------------- the fit


# Padded tokens T varied at R = 2048, then R varied at T = 8192, both large enough that the tokens'
# bytes set the peak (not the flat gradients at the end of the backward): (rows, prompt, response).
FIT_SHAPES = [(8, 256, 256), (8, 768, 256), (8, 1280, 256), (8, 512, 512), (8, 256, 768)]


def fit_one(arch: str, dtype: str, path: str, vocab: int | None = None) -> dict:
    """Bytes per padded token per layer (a_layer), per padded token outside the layers (a_0), per
    response token (a_R), and the intercept c: peak = c + (a_0 + L·a_layer)·T + a_R·R, from
    shape-only micro-batches of 1 and 2 layers."""
    import numpy as np

    rows_ = [measure(arch, L, dtype, path, *shape, vocab=vocab) for L in (1, 2) for shape in FIT_SHAPES]
    X = np.array([[1.0, r["layers"], r["T"], r["layers"] * r["T"], r["R"]] for r in rows_])
    y = np.array([r["peak"] for r in rows_], dtype=float)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = float(np.abs(X @ coef - y).max())
    c0, cL, a0, aL, aR = coef
    return dict(case="fit", arch=arch, dtype=dtype, path=path, V=rows_[0]["V"], c=c0, c_layer=cL, a_0=a0,
                a_layer=aL, a_R=aR, a_layer_per_h=aL / ARCHS[arch]["hidden_size"], a_R_per_V=aR / rows_[0]["V"],
                max_residual=resid, points=len(rows_), peak_ops=sorted({r["peak_op"] for r in rows_}))


def logits(args) -> None:
    """Bytes per response token of the head and the loss, in vocabulary entries (a_R / V), for the
    probe path and every registered correction: T fixed, R varied, one layer. Real float32 tensors
    at rehearsal size (V = 3,072: every correction, the rejections' data-dependent means included),
    and shape-only bf16 tensors at Qwen3-0.6B's V = 151,936 for the paper's."""
    from dlcrepro.step.corrections import CORRECTIONS

    for arch, dtype, fake, paths in (("rehearsal", "float32", False, ["probe", *CORRECTIONS]),
                                     ("qwen3-0.6b", "bfloat16", True, ["probe", *PAPER_CORRECTIONS])):
        for path in paths:
            lo, hi = (measure(arch, 1, dtype, path, 8, 600 - resp, resp, fake=fake) for resp in (200, 400))
            a_R = (hi["peak"] - lo["peak"]) / (hi["R"] - lo["R"])
            emit(dict(case="logits", arch=arch, dtype=dtype, fake=fake, path=path, V=lo["V"], a_R=a_R,
                      a_R_per_V=a_R / lo["V"], peak_ops=sorted({lo["peak_op"], hi["peak_op"]})))


def fit(args) -> None:
    for arch in args.archs:
        for dtype in args.dtypes:
            for path in args.paths:
                emit(fit_one(arch, dtype, path))


# ----------------------------------------------------------------------------- the layer's widths

# Qwen3-0.6B with one width changed at a time (and Qwen3-1.7B as it is), vocabulary 1,024 (the layer
# term does not read it): the per-layer bytes as a linear form in the widths.
WIDTH_VARIANTS = {
    "0.6b": {}, "i 4096": dict(intermediate_size=4096), "heads 8": dict(num_attention_heads=8),
    "kv heads 4": dict(num_key_value_heads=4), "h 2048": dict(hidden_size=2048),
    "head_dim 64": dict(head_dim=64, num_attention_heads=32, num_key_value_heads=16),
}


def widths(args) -> None:
    """a_layer, bytes per padded token and layer, of each width variant (the difference of 2- and
    1-layer peaks at two padded-token counts, R fixed), beside cluster.memory.layer_bytes's linear form."""
    from dlcrepro.cluster.memory import layer_bytes

    for dtype in args.dtypes:
        for name, change in [*WIDTH_VARIANTS.items(), ("1.7b", None)]:
            arch = dict(ARCHS["qwen3-0.6b"], **change) if change is not None else ARCHS["qwen3-1.7b"]
            ARCHS[name] = arch
            pk = {(L, p): measure(name, L, dtype, "probe", 8, p, 32, vocab=1024)["peak"] for L in (1, 2) for p in (992, 1504)}
            a_layer = ((pk[2, 1504] - pk[1, 1504]) - (pk[2, 992] - pk[1, 992])) / (8 * 512)
            emit(dict(case="widths", variant=name, dtype=dtype, **{k: arch[k] for k in ("hidden_size", "intermediate_size",
                      "num_attention_heads", "num_key_value_heads", "head_dim")}, a_layer=a_layer,
                      linear_form=layer_bytes(arch, dtype)))


# ----------------------------------------------------------------------------- a whole step


@contextlib.contextmanager
def valueless_step():
    """What a shape-only step cannot compute, made to return a number after doing its tensor work:
    the KL's float (log_probs), the squared distances (learner_step) and the correction's
    diagnostics."""
    from dlcrepro.step import diagnostics
    from dlcrepro.step import learner as lrn

    kl, dist = lrn.kl_rows, diagnostics.squared_distance
    lrn.kl_rows = lambda p, q: (kl(p, q), torch.zeros(()))[1]
    diagnostics.squared_distance = lambda a, b=None: 1.0
    try:
        with no_diagnostics():
            yield
    finally:
        lrn.kl_rows, diagnostics.squared_distance = kl, dist


def fake_inputs(mode, s, r) -> None:
    """The (N,)- and (N, k)-shaped inputs as shape-only tensors, so that what is made from them
    (one_hot's (N, V), q) is shape-only too; lengths, rows and seq stay real (chunking reads them)."""
    s.tb.tokens, s.adv_tok = mode.from_tensor(s.tb.tokens), mode.from_tensor(s.adv_tok)
    r.engine_logp, r.topk_ids, r.topk_logp = (mode.from_tensor(x) for x in (r.engine_logp, r.topk_ids, r.topk_logp))


def largest_micro_batches(ln, s, r, keep: int = 3):
    """The batch (s, r) cut to its `keep` micro-batches of most response tokens, the largest last:
    a step's peak is set by its largest micro-batch once the flat gradients of the earlier ones are
    held (from the third on), so these three give the whole step's peak in a tenth of its time."""
    from dlcrepro.step.engine import Rollout
    from dlcrepro.step.model import make_token_batch
    from dlcrepro.step.learner import Scored

    bounds = [(sl.stop - sl.start, i) for i, (_, sl) in enumerate(ln.micro_batches(s.tb))]
    starts = [0]
    for sub, _ in ln.micro_batches(s.tb):
        starts.append(starts[-1] + sub.num_seqs)
    rows = [j for _, i in sorted(bounds)[-keep:] for j in range(starts[i], starts[i + 1])]
    tb = make_token_batch([r.prompt_ids[j] for j in rows], [r.response_ids[j] for j in rows])
    first = torch.cumsum(torch.tensor([0] + [len(x) for x in r.response_ids]), 0)  # each sequence's first token
    idx = torch.cat([first[j] + torch.arange(len(r.response_ids[j])) for j in rows])
    sub_r = Rollout(prompt_ids=[r.prompt_ids[j] for j in rows], response_ids=[r.response_ids[j] for j in rows],
                    group=r.group[rows], engine_logp=r.engine_logp[idx], topk_ids=r.topk_ids[idx],
                    topk_logp=r.topk_logp[idx], version=0)
    return Scored(tb, s.rewards[rows], s.adv_tok[idx]), sub_r


def paper_step(arch: str, layers: int = 28, correction: str = "dlc", micro_batch_tokens: int | None = None,
               resp_len=(150, 450), micro_batch: int | None = None) -> dict:
    """`gpu_check.check_paper_trainer`'s step (paper.yaml's batch of 512 sequences, 120-token
    prompts, responses uniform in `resp_len`, its micro_batch and micro_batch_tokens unless given)
    on shape-only tensors, cut to its three largest micro-batches (`largest_micro_batches`): the θ
    copies (12P, made before the count) + the step's counted peak is what
    torch.cuda.max_memory_allocated reported on the H200."""
    import dataclasses

    from dlcrepro.core.config import load

    cfg = load(ROOT / "configs" / "paper.yaml")
    name = arch if arch in cfg.models else "qwen3-0.6b"
    tcfg = cfg.train_for(name)
    given = {"micro_batch_tokens": micro_batch_tokens, "micro_batch": micro_batch}
    tcfg = dataclasses.replace(tcfg, **{k: v for k, v in given.items() if v is not None})
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    model = build(ARCHS[arch], layers, fake=mode)
    ln = learner(model, correction, cfg.models[name].trainer_dtype, tcfg.micro_batch)
    ln.tcfg = tcfg
    V, n, group = model.config.vocab_size, tcfg.prompts_per_step * tcfg.responses_per_prompt, tcfg.responses_per_prompt
    whole = [gpu_check.paper_step_batch(n, group, 120, resp_len, V, cfg.engine.topk, seed) for seed in (0, 1, 2)]
    full_chunks = ln.micro_batches(whole[0][0].tb)
    (s, r), (p1, r1), (p2, r2) = (largest_micro_batches(ln, *sr) for sr in whole)
    for x, y in ((s, r), (p1, r1), (p2, r2)):
        fake_inputs(mode, x, y)
    chunks = ln.micro_batches(s.tb)
    t = time.perf_counter()
    with valueless_step(), LiveBytes() as m:
        gpu_check.learner_step(ln, s, [p1, p2], r)
    P = sum(p.numel() for p in ln.params)
    Rs = [sl.stop - sl.start for _, sl in chunks]
    return dict(case="paper_step", arch=arch, layers=layers, correction=correction, dtype=cfg.models[name].trainer_dtype,
                micro_batch=tcfg.micro_batch, micro_batch_tokens=tcfg.micro_batch_tokens,
                step_micro_batches=len(full_chunks), step_response_tokens=whole[0][0].tb.tokens.numel(), kept_R=Rs,
                kept_T=[c.input_ids.numel() for c, _ in chunks], params=P, counted_peak=m.peak, peak_op=m.at,
                peak_GiB=(12 * P + m.peak) / 2**30, seconds=round(time.perf_counter() - t, 1))


def paper(args) -> None:
    for arch in args.archs:
        emit(paper_step(arch))


def step(_args) -> None:
    """A real trainer step at rehearsal size (gpu_check.learner_step: a stale sampler, dlc, probes;
    4 micro-batches of 8 × 150 tokens), its counted peak against what cluster.peak_memory composes:
    the flat gradients alive while the correction's micro-batches run (g_on, g_on′ and the running
    sum: 12P) + one micro-batch's measured peak. The θ copies exist before the count."""
    from dlcrepro.core.config import TrainConfig
    from dlcrepro.step.learner import Learner

    arch = ARCHS["rehearsal"]
    for dtype in ("float32", "bfloat16"):
        model = build(arch, arch["num_hidden_layers"])
        rows, prompt, resp = 8, 100, 50
        tcfg = TrainConfig(micro_batch=rows, micro_batch_tokens=0, lr=0.02)
        ln = Learner(model, tcfg, "dlc", dtype, torch.device("cpu"))
        mk = lambda seed: batch(32, prompt, resp, arch["vocab_size"], seed)  # noqa: E731 (4 micro-batches)
        (s, r), (p1, _), (p2, _) = mk(0), mk(1), mk(2)
        gpu_check.learner_step(ln, s, [p1, p2], r)  # warm-up
        with LiveBytes() as m:
            gpu_check.learner_step(ln, s, [p1, p2], r)
        P = sum(p.numel() for p in ln.params)
        mb = measure("rehearsal", arch["num_hidden_layers"], dtype, "dlc", rows, prompt, resp, fake=False)
        emit(dict(case="step", dtype=dtype, params=P, step_peak=m.peak, peak_op=m.at, micro_batch_peak=mb["peak"],
                  composed=12 * P + mb["peak"], composed_over_step=(12 * P + mb["peak"]) / m.peak))


# ----------------------------------------------------------------------------- time


def flops(arch: dict, layers: int, T: int, R: int, width: int) -> float:
    """FLOPs of one forward+backward (3× the forward's): the layers' matrices 2·T per weight, the
    causal attention 2·2·(width²/2)·heads·d per row, the head 2·R·V·h."""
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")
    h, i, heads, kv, d, V = (arch[k] for k in keys)
    per_layer = h * d * (2 * heads + 2 * kv) + 3 * h * i
    rows = T // width
    attention = 2 * 2 * (width**2 / 2) * heads * d * rows
    return 3 * (2 * T * per_layer * layers + attention * layers + 2 * R * V * h)


def timing(args) -> None:
    """Seconds of a real float32 forward+backward (the probe path) at rehearsal size, one thread,
    and the FLOP rate it implies; the median of 5 after a warm-up."""
    arch = ARCHS["rehearsal"]
    for rows, prompt, resp in ((8, 100, 50), (16, 100, 50), (8, 100, 150)):
        model = build(arch, arch["num_hidden_layers"])
        ln = learner(model, "pg", "float32", rows)
        s, r = batch(rows, prompt, resp, arch["vocab_size"])
        micro_batch(ln, "probe", s, r)
        sec, cpu = [], []
        for _ in range(5):
            t, c = time.perf_counter(), time.process_time()
            micro_batch(ln, "probe", s, r)
            sec.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        sec, cpu = sorted(sec)[2], sorted(cpu)[2]
        T, R = rows * (prompt + resp), rows * resp
        f = flops(arch, arch["num_hidden_layers"], T, R, prompt + resp)
        emit(dict(case="time", arch="rehearsal", dtype="float32", threads=torch.get_num_threads(), T=T, R=R,
                  seconds=round(sec, 4), cpu_seconds=round(cpu, 4), us_per_padded_token=round(cpu / T * 1e6, 1),
                  gflop=round(f / 1e9, 2), gflop_per_cpu_s=round(f / cpu / 1e9, 1)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["validate", "same", "fit", "widths", "logits", "step", "paper", "time", "_rss"])
    p.add_argument("rest", nargs="*")
    p.add_argument("--archs", nargs="+", default=["rehearsal", "qwen3-0.6b", "qwen3-1.7b"])
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    p.add_argument("--paths", nargs="+", default=["probe", *PAPER_CORRECTIONS])
    args = p.parse_args()
    commands = {"validate": validate, "same": same, "fit": fit, "widths": widths, "logits": logits, "step": step,
                "paper": paper, "time": timing, "_rss": _rss}
    commands[args.what](args)


if __name__ == "__main__":
    main()
