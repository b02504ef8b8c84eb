"""FP8 (e4m3) quantization shared by the CPU emulation and the GPU block-FP8 path.

Weights: one scale per 128x128 block, scale = block amax / 448 (an all-zero block gets 1);
activations: one scale per token per 1x128 group of input features, computed on the fly;
attention query, key and value: one scale of 1.0 for the whole tensor (vLLM's FP8 attention on GPU).
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
BLOCK = 128
# The model config vLLM is given for its native block-FP8 path (the layout of Qwen's own FP8
# checkpoints): FP8 weights with one float32 `weight_scale_inv` per 128x128 block, activations
# quantized per token in 1x128 groups on the fly.
VLLM_QUANTIZATION_CONFIG = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [BLOCK, BLOCK],
}


# torch 2.13 decodes float8 on a CPU one element at a time: 51 µs for a 128 x 128 tensor to float32,
# 67 µs to BF16, against 16 µs for a lookup of the same values in a 256-entry table (one thread, an
# AVX-512 EPYC). The FP8 engine's hooks decode every linear and attention input of every decode
# step, so the emulation decodes on a CPU by table: each entry is torch's own decoding of that
# code, so the values are the same bits by construction (tests/test_quant.py checks all 256).
_FP8_TABLES: dict[torch.dtype, torch.Tensor] = {}


def fp8_decode(q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`q` as `dtype`: `q.to(dtype)`, for float8_e4m3fn codes on a CPU by table lookup (the same
    values); a tensor of another dtype (a reference built of ones, manifest.py) is simply cast."""
    if q.device.type != "cpu" or q.dtype != FP8:
        return q.to(dtype)
    table = _FP8_TABLES.get(dtype)
    if table is None:
        table = _FP8_TABLES[dtype] = torch.arange(256, dtype=torch.uint8).view(FP8).to(dtype)
    return table.index_select(0, q.reshape(-1).view(torch.uint8).int()).view(q.shape)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _div_exact(x: torch.Tensor, d: float) -> torch.Tensor:
    """x / d correctly rounded on every device. (CUDA PyTorch turns division by a Python scalar
    into multiplication by its rounded reciprocal, which is off by one ulp for d = 448: the scales,
    and so the FP8 codes, then differ from the CPU's. Seen on an H200, torch 2.11.)"""
    return x / torch.full_like(x, d)


def fp8_block_quantize(w: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a 2-D weight `(out, in)` to FP8 with one scale per `block x block` tile.

    Returns `q` `(out, in)` in float8_e4m3fn and `scale_inv` `(ceil(out/block), ceil(in/block))`
    in float32, so that `w ≈ q * scale_inv` tile by tile (vLLM's `weight_scale_inv` layout).
    """
    if w.dim() != 2:
        raise ValueError(f"fp8_block_quantize: expected a 2-D weight, got shape {tuple(w.shape)}")
    out_f, in_f = w.shape
    nb_o, nb_i = _ceil_div(out_f, block), _ceil_div(in_f, block)
    padded = torch.zeros(nb_o * block, nb_i * block, dtype=torch.float32, device=w.device)
    padded[:out_f, :in_f] = w.float()
    tiles = padded.view(nb_o, block, nb_i, block)
    amax = tiles.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, _div_exact(amax, FP8_MAX), torch.ones_like(amax))
    q = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    q = q.view(nb_o * block, nb_i * block)[:out_f, :in_f].contiguous()
    return q, scale


def fp8_block_dequantize(q: torch.Tensor, scale_inv: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """Inverse of `fp8_block_quantize`: float32 `(out, in)` weight."""
    out_f, in_f = q.shape
    s = scale_inv.repeat_interleave(block, 0).repeat_interleave(block, 1)[:out_f, :in_f]
    return fp8_decode(q, torch.float32) * s


def fp8_round_activations(x: torch.Tensor, group: int = BLOCK) -> torch.Tensor:
    """Dynamic per-token activation quantization in 1 x `group` groups, returned dequantized.

    `x` `(..., features)`; each token's features are split into groups of `group`, scaled by
    group amax / 448, rounded to float8_e4m3fn and scaled back, in the input's dtype.
    """
    feats = x.shape[-1]
    ng = _ceil_div(feats, group)
    xf = x.float()
    if ng * group != feats:
        xf = torch.nn.functional.pad(xf, (0, ng * group - feats))
    g = xf.reshape(*x.shape[:-1], ng, group)
    amax = g.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, _div_exact(amax, FP8_MAX), torch.ones_like(amax))
    r = fp8_decode((g / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), torch.float32) * scale
    return r.reshape(*x.shape[:-1], ng * group)[..., :feats].to(x.dtype)


def fp8_round_attention(x: torch.Tensor) -> torch.Tensor:
    """An attention input (query, key or value) as vLLM's FP8 attention computes with it: one static
    scale of 1.0 for the whole tensor, i.e. x clamped to ±448 and rounded to float8_e4m3fn, returned
    in x's dtype (the query: QuantFP8 PER_TENSOR with `_q_scale` 1.0; key and value: the FP8 KV
    cache with k/v scales 1.0; see engine.py's docstring)."""
    return fp8_decode(x.float().clamp(-FP8_MAX, FP8_MAX).to(FP8), x.dtype)


def is_quantized_weight(name: str, tensor: torch.Tensor) -> bool:
    """Linear weights of the decoder layers are FP8; embeddings, lm_head and norms stay BF16."""
    return (
        tensor.dim() == 2
        and name.endswith(".weight")
        and ".layers." in name
        and "norm" not in name
        and "embed" not in name
    )


def fp8_emulated_state_dict(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The weights an FP8 engine computes with: each linear weight block-FP8 rounded, in `dtype`."""
    out = {}
    for name, t in state.items():
        if is_quantized_weight(name, t):
            out[name] = fp8_block_dequantize(*fp8_block_quantize(t)).to(dtype)
        else:
            out[name] = t.to(dtype)
    return out


def fp8_checkpoint_state_dict(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The weights in block-FP8 checkpoint layout, as vLLM's FP8 linear method loads them.

    Each decoder linear `X.weight` becomes `X.weight` (float8_e4m3fn) and `X.weight_scale_inv`
    (float32, one per 128x128 block); everything else stays in `dtype`. The same quantizer as the
    emulation: dequantizing this gives `fp8_emulated_state_dict` exactly (before its cast to `dtype`).
    """
    out = {}
    for name, t in state.items():
        if is_quantized_weight(name, t):
            q, s = fp8_block_quantize(t)
            out[name] = q
            out[name + "_scale_inv"] = s
        else:
            out[name] = t.to(dtype)
    return out


def check_block_aligned(hf_config) -> None:
    """vLLM's block-FP8 path needs every linear layer's output (and input) width to be a multiple
    of the block; raise naming the model config field that is not."""
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    widths = {
        "hidden_size": hf_config.hidden_size,
        "intermediate_size": hf_config.intermediate_size,
        "num_attention_heads * head_dim": hf_config.num_attention_heads * head_dim,
        "num_key_value_heads * head_dim": hf_config.num_key_value_heads * head_dim,
    }
    bad = {k: v for k, v in widths.items() if v % BLOCK}
    if bad:
        raise ValueError(
            f"native block-FP8 needs linear widths that are multiples of {BLOCK}; this model has {bad}. "
            "Use engine.fp8_backend=emulate for it."
        )
