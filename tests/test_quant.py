import pytest
import torch

from dlcrepro.step import quant


def test_block_scale_is_block_amax_over_448():
    w = torch.zeros(256, 128)
    w[0, 0] = 896.0  # block (0, 0): amax 896 -> scale 2
    w[200, 5] = -44.8  # block (1, 0): amax 44.8 -> scale 0.1
    q, s = quant.fp8_block_quantize(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (256, 128)
    assert s.shape == (2, 1)
    assert torch.allclose(s, torch.tensor([[2.0], [0.1]]))
    assert float(q[0, 0].float()) == 448.0 and float(q[200, 5].float()) == -448.0


def test_scales_are_amax_over_448_correctly_rounded():
    """scale = amax / 448 rounded once (float64 division rounded to float32 is exact for this);
    CUDA PyTorch's division by a Python scalar is a multiply by 1/448 and misses by an ulp."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(512, 384, generator=g) * torch.logspace(-4, 3, 384)
    _, s = quant.fp8_block_quantize(w)
    amax = w.abs().reshape(4, 128, 3, 128).amax(dim=(1, 3))
    assert torch.equal(s, (amax.double() / 448).float())
    x = torch.randn(5, 256, generator=g) * 1e-3
    gx = x.reshape(5, 2, 128)
    ref = (gx / (gx.abs().amax(-1, keepdim=True).double() / 448).float()).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    ref = ref * (gx.abs().amax(-1, keepdim=True).double() / 448).float()
    assert torch.equal(quant.fp8_round_activations(x), ref.reshape(5, 256))


def test_all_zero_block_gets_scale_one():
    q, s = quant.fp8_block_quantize(torch.zeros(128, 300))
    assert s.shape == (1, 3) and torch.equal(s, torch.ones(1, 3))
    assert torch.equal(q.float(), torch.zeros(128, 300))


def test_values_representable_in_fp8_round_trip_exactly():
    # with amax 448 the scale is 1 and e4m3 values pass unchanged
    vals = torch.tensor([448.0, 1.0, 0.5, -3.5, 0.015625, 240.0])
    w = torch.zeros(130, 129)
    w[0, :6] = vals
    w[129, 128] = 448.0
    back = quant.fp8_block_dequantize(*quant.fp8_block_quantize(w))
    assert torch.equal(back[0, :6], vals)


def test_rounding_error_is_bounded_by_e4m3_precision():
    torch.manual_seed(0)
    w = torch.randn(384, 256)
    q, s = quant.fp8_block_quantize(w)
    back = quant.fp8_block_dequantize(q, s)
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normal values
    big = w.abs() > s.repeat_interleave(128, 0).repeat_interleave(128, 1) * 2**-6
    assert ((back - w).abs()[big] <= w.abs()[big] * 2**-4 + 1e-7).all()
    assert not torch.equal(back, w)


def test_activation_rounding_per_token_group():
    x = torch.zeros(2, 256)
    x[0, 0], x[0, 1] = 448.0, 1.06  # token 0, group 0: scale 1, 1.06 -> 1.0 (nearest e4m3: 1.0 or 1.125)
    x[1, 200] = 7.0  # token 1, group 1
    r = quant.fp8_round_activations(x)
    assert r[0, 0] == 448.0 and r[0, 1] == 1.0 and r[1, 200] == 7.0
    assert r.dtype == x.dtype


def test_attention_inputs_round_to_e4m3_with_scale_one_and_saturate_at_448():
    """vLLM's FP8 attention inputs (query, key, value) have no per-token scale: small values lose
    precision (or vanish below e4m3's smallest subnormal 2^-9) and large ones saturate."""
    x = torch.tensor([1.05, 0.3, -7.0, 500.0, -1000.0, 1e-4, 0.0029], dtype=torch.bfloat16)
    # 1.05 -> 1.0 (neighbours 1.0, 1.125); 0.3 -> 0.3125 (0.28125, 0.3125); below 2^-6 the steps are
    # 2^-9: 0.0029 -> 2^-9, 1e-4 -> 0
    want = torch.tensor([1.0, 0.3125, -7.0, 448.0, -448.0, 0.0, 2**-9], dtype=torch.bfloat16)
    r = quant.fp8_round_attention(x)
    assert r.dtype == torch.bfloat16 and torch.equal(r, want)
    assert torch.equal(quant.fp8_round_attention(r), r)  # an FP8 value rounds to itself


def test_only_decoder_linear_weights_are_quantized():
    sd = {
        "model.embed_tokens.weight": torch.randn(32, 128),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(128, 128),
        "model.layers.0.input_layernorm.weight": torch.randn(128),
        "model.layers.0.self_attn.q_norm.weight": torch.randn(32),
        "lm_head.weight": torch.randn(32, 128),
    }
    em = quant.fp8_emulated_state_dict(sd, torch.float32)
    assert torch.equal(em["model.embed_tokens.weight"], sd["model.embed_tokens.weight"])
    assert torch.equal(em["lm_head.weight"], sd["lm_head.weight"])
    assert torch.equal(em["model.layers.0.input_layernorm.weight"], sd["model.layers.0.input_layernorm.weight"])
    q = em["model.layers.0.self_attn.q_proj.weight"]
    assert not torch.equal(q, sd["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(q, quant.fp8_block_dequantize(*quant.fp8_block_quantize(sd["model.layers.0.self_attn.q_proj.weight"])))


def test_rejects_non_matrix():
    with pytest.raises(ValueError, match="2-D"):
        quant.fp8_block_quantize(torch.zeros(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fp8_decode_is_torchs_decoding_bit_for_bit(dtype):
    """The table lookup the CPU emulation decodes with gives torch's own `.to(dtype)` for every one
    of the 256 codes (NaN codes included, compared as bits), and for a tensor of any shape."""
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[dtype]
    assert torch.equal(quant.fp8_decode(codes, dtype).view(bits), codes.to(dtype).view(bits))
    q = (torch.randn(3, 5, 128, generator=torch.Generator().manual_seed(1)) * 50).to(torch.float8_e4m3fn)
    out = quant.fp8_decode(q, dtype)
    assert out.shape == q.shape and out.dtype == dtype
    assert torch.equal(out.view(bits), q.to(dtype).view(bits))
    assert torch.equal(quant.fp8_decode(q[:, 1], dtype), q[:, 1].to(dtype))  # a view that is not contiguous
    other = torch.randn(4, 256, generator=torch.Generator().manual_seed(2))  # not FP8: cast as it is
    assert torch.equal(quant.fp8_decode(other, dtype), other.to(dtype))
    assert torch.equal(quant.fp8_block_dequantize(torch.ones(4, 256), torch.tensor([[2.0, 3.0]])),
                       torch.tensor([2.0, 3.0]).repeat_interleave(128).expand(4, 256))
