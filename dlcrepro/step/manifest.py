"""The weight-sync load manifest: what a reload put into the engine, checked against the trainer's weights.

At every push the engine's worker reloads the sent tensors (`reload_with_manifest`) and reports:
- presence: which engine parameters received a tensor in that reload, and which sent names no
  parameter takes;
- each decoder linear layer by what it computes (`layer_readback`): the layer's own quantization
  method (`quant_method.apply`, the kernel vLLM chose, whatever it did to the weight's storage after
  loading) applied to one-hot probe rows returns the weight as the kernel computes with it, compared
  elementwise with the weight the trainer means the engine to hold (`reference`), within the bound of
  one FP8 or BF16 path (`worst_error`);
- every other tensor (embeddings, norms, lm_head: vLLM keeps them in the checkpoint's layout) by a
  fingerprint of its value.
`problems` turns that into one line per kind of fault. Statistics of sampled tokens cannot tell a
layer left at an old version from a correct one (docs/method.md, "The load manifest"); this can.

Why by computation and not by the stored tensor: a backend may store a weight in its own layout
after loading. vLLM-CPU packs BF16 weights for AMX or oneDNN (and drops `layer.weight`), VNNI-packs
native FP8 weights on AMX; on a GPU DeepGEMM can requantize codes and scales. The kernel's output on
one-hot rows is the same on every backend that computes the right thing, and only there.

The fingerprint of a tensor T `(R, C)` (1-D: `(R, 1)`) is u_R · (T v_C) in float64, with u_R and v_C
fixed pseudo-random vectors of lengths R and C, entries in [-1, 1). A fused vLLM parameter is sliced
by rows into its checkpoint names. Two tensors whose values differ anywhere give different
fingerprints (for random u, v, a nonzero difference projects to zero with probability 0); the same
values give the same float64 sums up to their rounding (`TOLERANCE`).
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from . import quant

# Two fingerprints agree when they differ by at most this times the sum of |u_i (T v)_i|: the float64
# rounding of sums of up to ~10^6 terms is ~10^-13 of it; one BF16 unit changed in one weight of a
# 128 x 128 matrix moves the fingerprint ~10^4 times this bound.
TOLERANCE = 1e-9
CHUNK_ELEMENTS = 2**22  # rows are projected in chunks of about this many elements (float64 copies of 32 MiB)

# A linear layer is probed with one-hot rows (the identity), PROBE_ROWS at a time: its output on row j
# is column j of the weight as its kernel computes with it. Dense (Gaussian) probes are not enough:
# measured on vLLM-CPU's AMX FP8 kernel, they hide one FP8 code moved by one step and a layer 0.1 %
# stale (docs/measurements.md, "The load check by what each layer computes").
PROBE_ROWS = 1024
# The elementwise bound: |computed − expected| ≤ ROUNDING · (|expected| + 2·S_sub). ROUNDING = 2^-7 is
# two BF16 roundings (unit 2^-8): the weight's (a W8A16 kernel dequantizes code x scale to BF16) and
# the output's. S_sub is the FP8 block scale where a code is zero or subnormal (|code| < 2^-6), else
# 0: vLLM-CPU's AMX FP8 kernel computes code m of those as 2^-7·(1 + m/8)·scale (zero is not zero).
# A correct push reaches at most 1/2 of the bound (one rounding; 0 where the engine holds BF16 values
# and one-hot rows read them back exactly); one FP8 code moved by one step reaches ≥ 8.
ROUNDING = 2.0**-7
FP8_MIN_NORMAL = 2.0**-6
BOUND = 1.0  # a layer passes when its worst element is at most this many bounds away


@dataclass(frozen=True)
class Fingerprint:
    """u · (T v) of a tensor, and the scale its rounding is measured against: Σ |u_i (T v)_i|."""

    value: float
    scale: float

    def matches(self, other: "Fingerprint") -> bool:
        return abs(self.value - other.value) <= TOLERANCE * max(self.scale, other.scale)


@lru_cache(maxsize=256)
def _projection(n: int, which: int) -> torch.Tensor:
    """A fixed `(n,)` float64 vector, entries uniform in [-1, 1): the same in every process."""
    g = torch.Generator().manual_seed(0x5EED0 + 2 * n + which)
    return torch.rand(n, generator=g, dtype=torch.float64).mul_(2).sub_(1)


def row_products(t: torch.Tensor) -> torch.Tensor:
    """`(R,)` float64 T v_C of a tensor `(R, ...)` (flattened to `(R, C)`; 1-D: `(R, 1)`), on the CPU."""
    t2 = t.detach().reshape(t.shape[0], -1)
    v = _projection(t2.shape[1], 1).to(t2.device)
    step = max(1, CHUNK_ELEMENTS // max(1, t2.shape[1]))
    return torch.cat([t2[i : i + step].double() @ v for i in range(0, t2.shape[0], step)]).cpu()


def fingerprint_of_rows(rows: torch.Tensor) -> Fingerprint:
    """The fingerprint of a tensor from its `(R,)` row products."""
    ur = _projection(rows.numel(), 0) * rows
    return Fingerprint(float(ur.sum()), float(ur.abs().sum()))


def fingerprints(state: dict[str, torch.Tensor]) -> dict[str, Fingerprint]:
    """The fingerprint of each tensor of a state dict (the trainer's side)."""
    return {k: fingerprint_of_rows(row_products(v)) for k, v in state.items()}


# --------------------------------------------------------------------------- a linear layer by what it computes


def layer_readback(compute, in_features: int, dtype: torch.dtype, device: torch.device | str = "cpu",
                   rows: int = PROBE_ROWS) -> torch.Tensor:
    """`(out, in)` float32 on `device`: the weight a linear map computes with, read through `compute`
    (`(M, in)` -> `(M, out)`, e.g. a vLLM layer's `quant_method.apply`) on one-hot rows of `dtype`,
    `rows` at a time. Exact for any kernel that rounds only its output: one nonzero term per sum."""
    cols = []
    with torch.no_grad():
        for first in range(0, in_features, rows):
            n = min(rows, in_features - first)
            probe = torch.zeros(n, in_features, dtype=dtype, device=device)
            probe[:, first : first + n].fill_diagonal_(1)
            cols.append(compute(probe).float().T)
    return torch.cat(cols, dim=1)


def reference_weight(reference: dict[str, torch.Tensor], name: str,
                     device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the weight `name` of a reference state dict in float32 on `device`, the FP8 block scale at each
    of its zero or subnormal codes (0 elsewhere), or None for a weight that is not FP8 codes): a
    block-FP8 weight (`name` with `name + "_scale_inv"`, quant.fp8_checkpoint_state_dict) is dequantized."""
    w, scale = reference[name].to(device), reference.get(name + "_scale_inv")
    if scale is None:
        return w.float(), None
    scale = scale.to(device)
    dense = quant.fp8_block_dequantize(w, scale)
    per_element = quant.fp8_block_dequantize(torch.ones_like(w, dtype=torch.float32), scale)
    return dense, torch.where(w.float().abs() < FP8_MIN_NORMAL, per_element, torch.zeros_like(dense))


def worst_error(computed: torch.Tensor, expected: torch.Tensor, sub_scale: torch.Tensor | None = None) -> float:
    """max over elements of |computed − expected| / (ROUNDING · (|expected| + 2·sub_scale)): a layer
    computing the expected weight through one FP8 or BF16 path stays ≤ BOUND. An element whose bound
    is 0 counts 0 if equal, else inf; NaN counts inf."""
    if computed.shape != expected.shape:
        return math.inf
    if not computed.numel():
        return 0.0
    d = computed.float().sub(expected).abs_()
    b = expected.float().abs()
    if sub_scale is not None:
        b.add_(sub_scale, alpha=2)
    ratio = d.div_(b.mul_(ROUNDING))
    ratio.masked_fill_(ratio.isnan(), math.inf)  # NaN computed, or 0/0 (fixed just below)
    ratio.masked_fill_(computed.float() == expected, 0)  # equal, even where the bound is 0
    return float(ratio.max())


# --------------------------------------------------------------------------- the engine's side


def _checkpoint_names(model: torch.nn.Module) -> dict[str, tuple[str, int, int]]:
    """Checkpoint name -> (engine parameter name, shard index, shard count) for every engine
    parameter, tied aliases included: a fused parameter (`packed_modules_mapping`, e.g. qkv_proj ->
    q_proj, k_proj, v_proj) gives one name per shard, any other its own name."""
    packed = getattr(model, "packed_modules_mapping", {}) or {}
    out = {}
    for name, _ in model.named_parameters(remove_duplicate=False):
        module_name, _, pname = name.rpartition(".")
        parent, _, leaf = module_name.rpartition(".")
        parts = packed.get(leaf, [leaf])
        for i, sub in enumerate(parts):
            out[f"{parent}.{sub}.{pname}" if parent else f"{sub}.{pname}"] = (name, i, len(parts))
    return out


def decoder_linear_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """vLLM's linear layers of the decoder blocks (module name -> layer): the layers whose weights
    the load check reads by what they compute."""
    from vllm.model_executor.layers.linear import LinearBase

    return {name: m for name, m in model.named_modules() if isinstance(m, LinearBase) and ".layers." in f".{name}"}


def _shard_rows(module: torch.nn.Module, total: int, index: int, count: int) -> tuple[int, int]:
    """(first row, rows) of shard `index` of `count` in a parameter of `total` rows: a fused linear
    layer's shards by its `output_sizes` (scaled to the parameter's rows: a block scale has one row
    per 128); an embedding's real vocabulary, without vLLM's padding rows."""
    if count == 1:
        return 0, min(total, getattr(module, "org_vocab_size", total))
    sizes = list(module.output_sizes)
    unit = total / sum(sizes)
    return round(sum(sizes[:index]) * unit), round(sizes[index] * unit)


def _engine_shape(model: torch.nn.Module, param: str, index: int, count: int) -> tuple[int, ...]:
    """The shape of the checkpoint tensor shard `index` of `count` of an engine parameter takes;
    a linear weight that vLLM's CPU dispatch dropped (packed for its kernel) has the layer's
    (output_size, input_size)."""
    module_name, _, pname = param.rpartition(".")
    module = model.get_submodule(module_name)
    t = module.get_parameter(pname)
    shape = tuple(t.shape) if t.numel() else (module.output_size, module.input_size)
    return (_shard_rows(module, shape[0], index, count)[1], *shape[1:])


@dataclass
class Manifest:
    """What one reload did, reported by the engine's worker.

    received: engine parameters that received a tensor (vLLM's `load_weights` return value).
    not_received: engine parameters (tied aliases resolved) that did not.
    unknown: sent names that no engine parameter takes, or whose shape it does not have (nothing
      was reloaded then: vLLM would raise halfway, its layers left on the meta device).
    computed: per checkpoint weight name of a decoder linear layer, the worst element of what the
      layer computes against the reference weight, in units of the bound (`worst_error`; ≤ BOUND passes).
    fingerprints: per checkpoint name of every other tensor, the engine's value after post-load processing.
    unreadable: engine parameters outside the linear layers with no value (an empty tensor).
    linear_methods: the decoder's linear layers counted by quantization method and kernel (`linear_method`).
    warnings: what vLLM logged at WARNING or above during the reload.
    reload_seconds: vLLM's reload itself; check_seconds: the worker's reading of what the layers compute.
    """

    received: list[str] = field(default_factory=list)
    not_received: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    computed: dict[str, float] = field(default_factory=dict)
    fingerprints: dict[str, Fingerprint] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)
    linear_methods: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    reload_seconds: float = 0.0
    check_seconds: float = 0.0


def linear_method(layer: torch.nn.Module) -> str:
    """How a vLLM linear layer computes: its quantization method's class, and for a quantized one the
    kernel vLLM chose (`Fp8LinearMethod/CPUFp8BlockScaledMMKernel`, `Fp8LinearMethod/CutlassFp8BlockScaledMMKernel`)."""
    method = layer.quant_method
    kernel = getattr(method, "fp8_linear", None)
    return type(method).__name__ + (f"/{type(kernel).__name__}" if kernel is not None else "")


def linear_methods(model: torch.nn.Module) -> dict[str, int]:
    """The decoder's linear layers counted by `linear_method`."""
    counts: dict[str, int] = {}
    for layer in decoder_linear_layers(model).values():
        method = linear_method(layer)
        counts[method] = counts.get(method, 0) + 1
    return counts


def worker_linear_methods(worker) -> dict[str, int]:
    """(Runs in vLLM's worker.) `linear_methods` of the worker's model."""
    return linear_methods(worker.model_runner.get_model())


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name}: {record.getMessage()}")


@contextmanager
def vllm_warnings():
    """vLLM's warnings in the block, collected (the engine runs vLLM's loggers at ERROR:
    VLLM_LOGGING_LEVEL in engine.py, for its start-up chatter; a reload's warnings are wanted)."""
    logger = logging.getLogger("vllm")
    handler, level = _Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(min(level, logging.WARNING) if level else logging.WARNING)
    try:
        yield handler.lines
    finally:
        logger.setLevel(level)
        logger.removeHandler(handler)


def _read_linear_layers(model: torch.nn.Module, names: dict[str, tuple[str, int, int]],
                        reference: dict[str, torch.Tensor], dtype: torch.dtype) -> tuple[dict[str, float], set[str]]:
    """Each decoder linear layer's computed weight against `reference`, shard by shard: (checkpoint
    weight name -> worst error in bounds, the engine parameters these cover: every parameter of those
    layers but a bias, which `quant_method.apply(layer, x, None)` leaves out)."""
    layers = decoder_linear_layers(model)
    shards: dict[str, list[tuple[str, int, int]]] = {}
    for ckpt, (param, index, count) in names.items():
        module_name, _, pname = param.rpartition(".")
        if module_name in layers and pname == "weight":
            shards.setdefault(module_name, []).append((ckpt, index, count))
    computed, covered = {}, set()
    for module_name, layer in layers.items():
        covered.update(f"{module_name}.{p}" for p, _ in layer.named_parameters(recurse=False) if p != "bias")
        device = next(layer.parameters()).device
        readback = layer_readback(lambda x: layer.quant_method.apply(layer, x, None), layer.input_size_per_partition,
                                  dtype, device)
        for ckpt, index, count in shards.get(module_name, []):
            first, n = _shard_rows(layer, readback.shape[0], index, count)
            if ckpt not in reference:
                computed[ckpt] = math.inf  # nothing to compare with: `problems` names it as not sent
                continue
            expected, sub_scale = reference_weight(reference, ckpt, readback.device)  # compared where the layer is
            computed[ckpt] = worst_error(readback[first : first + n], expected, sub_scale)
    return computed, covered


def reload_with_manifest(worker, sent: dict[str, torch.Tensor], reference: dict[str, torch.Tensor] | None = None,
                         dtype: torch.dtype = torch.bfloat16) -> Manifest:
    """(Runs in vLLM's worker.) Reload `sent` in place, in checkpoint format (vLLM re-runs each
    layer's post-load processing), and report what arrived: presence, each decoder linear layer's
    computed weight against `reference` (default `sent`: what the engine should hold, in the same
    format), probed in `dtype` (the engine's), and every other tensor's fingerprint. Sent names that
    no engine parameter takes, or takes in another shape, stop it before anything is reloaded."""
    model = worker.model_runner.get_model()
    reference = sent if reference is None else reference
    names = _checkpoint_names(model)
    unknown = sorted(k for k in sent if k not in names)
    unknown += sorted(f"{k} {tuple(t.shape)} (the engine's is {shape})" for k, t in sent.items()
                      if k in names and (shape := _engine_shape(model, *names[k])) != tuple(t.shape))
    if unknown:
        return Manifest(unknown=unknown)
    received: set[str] = set()
    vllm_load = model.load_weights

    def load_and_record(weights):
        loaded = vllm_load(weights)
        received.update(loaded or ())
        return loaded

    model.load_weights = load_and_record  # reload_weights discards what load_weights returns
    t = time.perf_counter()
    try:
        with vllm_warnings() as warnings:
            worker.model_runner.reload_weights(weights_iterator=list(sent.items()), is_checkpoint_format=True)
    finally:
        del model.load_weights
    got = {id(model.get_parameter(n)) for n in received}
    out = Manifest(received=sorted(received), warnings=warnings, reload_seconds=time.perf_counter() - t)
    out.not_received = [n for n, p in model.named_parameters() if id(p) not in got]
    t = time.perf_counter()
    out.computed, covered = _read_linear_layers(model, names, reference, dtype)
    out.check_seconds = time.perf_counter() - t
    out.linear_methods = linear_methods(model)
    rows_of: dict[str, torch.Tensor | None] = {}
    for ckpt, (param, index, count) in names.items():
        if param in covered:
            continue
        if param not in rows_of:
            t_param = model.get_parameter(param)
            rows_of[param] = row_products(t_param) if t_param.numel() else None
        rows = rows_of[param]
        if rows is None:
            out.unreadable.append(param)
            continue
        first, n = _shard_rows(model.get_submodule(param.rpartition(".")[0]), rows.numel(), index, count)
        out.fingerprints[ckpt] = fingerprint_of_rows(rows[first : first + n])
    out.unreadable = sorted(set(out.unreadable))
    return out


# --------------------------------------------------------------------------- the comparison


def _named(what: str, names: list[str], limit: int = 24) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"{what}: {', '.join(names[:limit])}{more}"


def problems(m: Manifest, sent: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> list[str]:
    """What is wrong with a reload, one line per kind, naming the parameters ([] if nothing):
    sent tensors no engine parameter took, engine parameters that received none, tensors the
    trainer holds but did not send, decoder linear layers that do not compute the reference's
    weights within the bound, and other engine tensors whose fingerprint is not the reference's
    (`reference`: checkpoint name -> what the engine should hold, in the engine's format)."""
    if m.unknown:
        return [_named("sent tensors no engine parameter takes in their name and shape (nothing was reloaded)",
                       m.unknown)]
    out = []
    if m.not_received:
        out.append(_named("engine parameters that received no tensor in this reload (they keep their previous values)",
                          m.not_received))
    if m.unreadable:
        out.append(_named("engine parameters with no value after this reload", m.unreadable))
    missing = sorted(k for k in reference if k not in sent)
    if missing:
        out.append(_named("tensors the trainer holds but did not send", missing))
    wrong = sorted((k for k, e in m.computed.items() if not e <= BOUND), key=lambda k: -m.computed[k])
    if wrong:
        out.append(_named("engine linear layers that do not compute the trainer's weights (their worst element "
                          "in bounds of one FP8 or BF16 path, under 1 for a correct load)",
                          [f"{k} {m.computed[k]:.3g}" for k in wrong]))
    want = fingerprints({k: reference[k] for k in m.fingerprints if k in reference})
    off = [k for k, fp in want.items() if not m.fingerprints[k].matches(fp)]
    if off:
        out.append(_named("engine tensors whose fingerprint is not the trainer's (other values, shape or place)", off))
    return out
