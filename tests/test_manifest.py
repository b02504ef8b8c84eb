"""The load manifest's fingerprints, by hand (no engine): dlcrepro/manifest.py."""

import torch

from dlcrepro import manifest


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
