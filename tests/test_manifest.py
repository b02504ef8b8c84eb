"""The load manifest by hand (no engine): fingerprints, and a linear layer read by what it computes
(dlcrepro/step/manifest.py)."""

import math

import pytest
import torch

from dlcrepro.step import manifest, quant


def test_a_fingerprint_is_u_dot_t_v_with_fixed_vectors():
    t = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    u, v = manifest._projection(2, 0), manifest._projection(2, 1)
    fp = manifest.fingerprints({"w": t})["w"]
    assert fp.value == float(u @ (t.double() @ v)) and fp.scale == float((u * (t.double() @ v)).abs().sum())
    assert manifest.fingerprints({"w": t.clone()})["w"] == fp  # the same values: the same in every call


def test_a_transposed_swapped_or_one_unit_changed_tensor_has_another_fingerprint():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(128, 128, generator=g).bfloat16()
    one_unit = w.clone()
    one_unit[5, 7] = (w[5, 7].float() * (1 + 2**-7)).bfloat16()  # about one BF16 unit up
    assert not torch.equal(one_unit, w)
    fp = manifest.fingerprints({"w": w})["w"]
    for other in (w.T.contiguous(), w.flip(0), torch.zeros_like(w), one_unit):
        assert not manifest.fingerprints({"w": other})["w"].matches(fp)


def test_a_fused_parameters_rows_give_its_shards_fingerprints():
    """What the engine does with vLLM's qkv_proj: the rows of q, k and v sliced out of the fused
    tensor's row products give the fingerprints of q, k and v themselves."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(n, 64, generator=g).bfloat16() for n in (64, 32, 32))
    rows = manifest.row_products(torch.cat([q, k, v]))
    want = manifest.fingerprints({"q": q, "k": k, "v": v})
    for name, first, n in (("q", 0, 64), ("k", 64, 32), ("v", 96, 32)):
        assert manifest.fingerprint_of_rows(rows[first : first + n]).matches(want[name])


# --------------------------------------------------------------------------- a linear layer by what it computes


def _fp8_weight(seed: int, shape=(256, 256)) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-FP8 codes and scales of a random weight, with one block's first codes forced to zero."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(*shape, generator=g)
    w[:4, :8] = 0
    return quant.fp8_block_quantize(w)


def test_one_hot_rows_read_a_bf16_weight_back_exactly_in_chunks():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 130, generator=g).bfloat16()  # 130 inputs: chunks of 64, 64 and 2 rows
    got = manifest.layer_readback(lambda x: torch.nn.functional.linear(x, w), 130, torch.bfloat16, rows=64)
    assert got.dtype == torch.float32 and torch.equal(got, w.float())


def test_the_worst_error_is_in_units_of_two_bf16_roundings_of_the_expected_weight():
    expected = torch.tensor([[1.0, -2.0, 0.0]])
    assert manifest.worst_error(expected.clone(), expected) == 0
    assert manifest.worst_error(torch.tensor([[1.0 + 2**-8, -2.0, 0.0]]), expected) == 0.5  # one rounding of 1.0
    assert manifest.worst_error(torch.tensor([[1.0, -2.0 - 2**-6, 0.0]]), expected) == 1.0
    assert manifest.worst_error(torch.tensor([[1.0, -2.0, 1e-30]]), expected) == math.inf  # a zero must stay zero
    assert manifest.worst_error(torch.tensor([[math.nan, -2.0, 0.0]]), expected) == math.inf
    assert manifest.worst_error(expected.T.contiguous(), expected) == math.inf  # another shape
    # an FP8 zero code's block scale s widens the bound there to 2^-7 · 2s
    assert manifest.worst_error(torch.tensor([[1.0, -2.0, 2**-7 * 3.0]]), expected, torch.tensor([[0.0, 0.0, 3.0]])) == 0.5


def test_a_w8a16_kernel_passes_within_half_the_bound_and_one_fp8_step_fails_by_eight():
    """A kernel that dequantizes codes x scale to BF16 and multiplies (vLLM-CPU's W8A16 AMX path) reads
    back within one BF16 rounding of the dequantized reference; a single code moved by one FP8 step
    (2^-3 of its value for a normal code) is ≥ 8 bounds away."""
    q, s = _fp8_weight(1)
    kernel_weight = quant.fp8_block_dequantize(q, s).bfloat16()
    expected, sub = manifest.reference_weight({"w": q, "w_scale_inv": s}, "w")
    assert torch.equal(expected, quant.fp8_block_dequantize(q, s))
    assert torch.equal(sub[:4, :8], s[0, 0].expand(4, 8)) and int((sub != 0).sum()) >= 32
    got = manifest.layer_readback(lambda x: torch.nn.functional.linear(x, kernel_weight), 256, torch.bfloat16)
    assert manifest.worst_error(got, expected, sub) <= 0.5
    moved = q.clone()
    moved.view(torch.uint8)[100, 200] += 1  # the next FP8 code up (a normal code: the random weight's)
    assert moved.float()[100, 200].abs() >= manifest.FP8_MIN_NORMAL
    stale, stale_sub = manifest.reference_weight({"w": moved, "w_scale_inv": s}, "w")
    assert manifest.worst_error(got, stale, stale_sub) >= 8


def test_a_kernel_that_computes_zero_codes_as_a_small_value_passes_only_through_the_subnormal_term():
    """vLLM-CPU's AMX FP8 kernel computes code m ∈ 0..7 (zero and subnormals) as 2^-7·(1 + m/8)·scale:
    the bound's 2·S_sub term allows it; without it the zero codes would fail the check."""
    q, s = _fp8_weight(2)
    small = (q.view(torch.uint8) & 0x7F) < 8
    quirk = quant.fp8_block_dequantize(q, s)
    scale_at = quant.fp8_block_dequantize(torch.ones_like(q, dtype=torch.float32), s)
    m = (q.view(torch.uint8) & 0x7F).float()
    sign = torch.where(q.view(torch.uint8) >= 128, -1.0, 1.0)
    quirk = torch.where(small, sign * 2**-7 * (1 + m / 8) * scale_at, quirk).bfloat16()
    got = manifest.layer_readback(lambda x: torch.nn.functional.linear(x, quirk), 256, torch.bfloat16)
    expected, sub = manifest.reference_weight({"w": q, "w_scale_inv": s}, "w")
    assert manifest.worst_error(got, expected, sub) <= 1
    assert manifest.worst_error(got, expected) == math.inf


def _vllm_cpu_fp8_ops_or_skip():
    """vLLM's CPU FP8 ops, loaded; the test skipped, naming the CPU feature, where this vLLM build has
    none (vLLM loads them from `_C` on CPUs with AVX-512 BF16: AMX Xeons, Zen 4 and later)."""
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    if not (hasattr(torch.ops._C, "convert_weight_packed") and hasattr(torch.ops._C, "fp8_scaled_mm_cpu")):
        pytest.skip("needs AVX-512 BF16 (avx512_bf16): vLLM-CPU loads its FP8 ops "
                    f"(convert_weight_packed, fp8_scaled_mm_cpu) only there; this CPU: {torch.backends.cpu.get_cpu_capability()}")
    return torch.ops._C


@pytest.mark.engine
def test_a_weight_prepacked_by_vllms_op_fails_the_fingerprint_and_passes_the_computed_check():
    """vLLM's own VNNI packing (what its AMX FP8 kernel does to a weight after loading) moves the bytes:
    the stored tensor's fingerprint is no longer the checkpoint's, while vLLM's FP8 GEMM on the packed
    weight, read back on one-hot rows (4 at a time: its AVX-512 BF16 path), computes the reference
    within the bound, and a code moved by one step in the reference does not."""
    ops = _vllm_cpu_fp8_ops_or_skip()
    q, s = _fp8_weight(3)
    packed = ops.convert_weight_packed(q)
    assert packed.shape == q.shape
    assert not manifest.fingerprints({"w": packed.view(torch.uint8).float()})["w"].matches(
        manifest.fingerprints({"w": q.view(torch.uint8).float()})["w"])
    got = manifest.layer_readback(lambda x: ops.fp8_scaled_mm_cpu(x, packed, s, [128, 128], None, torch.bfloat16, True),
                                  256, torch.bfloat16, rows=4)
    expected, sub = manifest.reference_weight({"w": q, "w_scale_inv": s}, "w")
    assert manifest.worst_error(got, expected, sub) <= 1
    moved = q.clone()
    moved.view(torch.uint8)[100, 200] += 1
    assert manifest.worst_error(got, *manifest.reference_weight({"w": moved, "w_scale_inv": s}, "w")) >= 8
