"""The corrections practitioners run (tis, seq_tis, seq_mis, geo_rs, icepop, decoupled_ppo,
center_tis), the one registry of names, and the corrections' diagnostics: exact gradients on
hand cases, and exact expectations by enumeration where a method is unbiased."""

import dataclasses
import math

import pytest
import torch
import yaml

from conftest import ROOT, SMOKE
from dlcrepro.report import analysis
from dlcrepro.core import registry
from dlcrepro.core.config import ConfigError, TrainConfig, build, load
from dlcrepro.step.corrections import (
    CORRECTIONS,
    CorrectionParams,
    TokenWeights,
    concat_weights,
    get_correction,
    weight_diagnostics,
)
from test_corrections import P, Z0, Z_T, REWARD, expected_grad, grad_of, seq_expected, terms

INF = dict(seq_clip_c=math.inf, seq_mis_low=0.0, seq_mis_high=math.inf, clip_c=math.inf, icepop_low=0.0, icepop_high=math.inf,
           behav_weight_cap=math.inf, geo_low=0.0, geo_high=math.inf)

# ----------------------------------------------------------------------------- one registry of names


def test_every_registered_name_has_one_function_and_the_same_flags():
    assert set(CORRECTIONS) == set(registry.CORRECTION_INFO)
    for name, c in CORRECTIONS.items():
        assert c.info is registry.CORRECTION_INFO[name]


def test_resync_list_config_check_and_schema_read_the_registry():
    assert set(analysis.RESYNC_CORRECTIONS) == {n for n, c in registry.CORRECTION_INFO.items() if c.resync}
    # the schema names no corrections: the torch-free config check does, from the registry
    schema = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
    items = schema["properties"]["grid"]["properties"]["corrections"]["items"]
    assert items == {"type": "string"}
    data = yaml.safe_load(SMOKE.read_text())
    data["grid"]["corrections"] = ["pg", "nope"]
    with pytest.raises(ConfigError, match=r"grid.corrections: unknown correction 'nope'; known: \['center', 'center_tis'"):
        build(data)
    # every registered correction is a valid grid entry, end to end through validate()
    assert load(SMOKE,
                {"grid.corrections": sorted(registry.CORRECTION_INFO)}).grid.corrections == sorted(registry.CORRECTION_INFO)


def test_every_threshold_is_a_train_key_with_the_same_default():
    params = {f.name for f in dataclasses.fields(CorrectionParams)}
    assert params <= {f.name for f in dataclasses.fields(TrainConfig)}
    assert CorrectionParams.from_train(TrainConfig()) == CorrectionParams()


def test_a_name_missing_from_the_registry_cannot_register():
    from dlcrepro.step.corrections import register_correction

    with pytest.raises(ValueError, match="no entry in registry.CORRECTION_INFO"):
        register_correction("not_listed")(lambda t, p: None)


# ----------------------------------------------------------------------------- exact two-token cases
# Trainer logits 0 (π = ½, ½) at every prefix, sampled y = 0, advantage 1: a token with weight w
# adds −w/N·(onehot(y) − π) = −w/N·[½, −½] to the gradient of the loss w.r.t. its logits.

STEP = torch.tensor([0.5, -0.5])


def engine(*q_y):
    """Engine logits at prefixes whose engine probability of token 0 is q_y each."""
    return torch.log(torch.tensor([[q, 1 - q] for q in q_y]))


def test_tis_truncates_the_token_ratio_at_c():
    g = grad_of("tis", terms(Z0, Z0, engine(0.2), [0], [1.0]))  # ρ = .5/.2 = 2.5 > C = 2
    assert torch.allclose(g, -2.0 * STEP)
    g = grad_of("tis", terms(Z0, Z0, engine(0.8), [0], [1.0]))  # ρ = .625, kept
    assert torch.allclose(g, -0.625 * STEP)


def test_seq_tis_weights_every_token_by_the_truncated_sequence_ratio():
    z = torch.zeros(2, 2)
    g = grad_of("seq_tis", terms(z, z, engine(0.8, 0.4), [0, 0], [1.0, 1.0], seq=[0, 0]))
    rho = (0.5 / 0.8) * (0.5 / 0.4)  # .78125
    assert torch.allclose(g, -rho / 2 * STEP.expand(2, -1))
    g = grad_of("seq_tis", terms(z, z, engine(0.2, 0.4), [0, 0], [1.0, 1.0], seq=[0, 0]))  # ρ = 3.125
    assert torch.allclose(g, -2.0 / 2 * STEP.expand(2, -1))


def test_seq_mis_drops_a_sequence_outside_its_band_and_averages_over_the_kept_tokens():
    z = torch.zeros(4, 2)
    # sequence 0 (tokens 0, 1): ρ = .78125, kept; sequence 1 (tokens 2, 3): ρ = 3.125 > 2, dropped
    t = terms(z, z, engine(0.8, 0.4, 0.2, 0.4), [0, 0, 0, 0], [1.0] * 4, seq=[0, 0, 1, 1])
    out = get_correction("seq_mis").fn(t, P)
    (g,) = torch.autograd.grad(out.loss, t.logits)
    rho = 0.78125
    assert out.mean_over == 2
    assert torch.allclose(g[:2], -rho / 2 * STEP.expand(2, -1)) and torch.equal(g[2:], torch.zeros(2, 2))
    # below the lower bound (ρ = .5/.9 · .5/.9 = .31 < .5): dropped too
    t = terms(z[:2], z[:2], engine(0.9, 0.9), [0, 0], [1.0, 1.0], seq=[0, 0])
    out = get_correction("seq_mis").fn(t, P)
    assert out.mean_over == 0 and torch.equal(torch.autograd.grad(out.loss, t.logits)[0], torch.zeros(2, 2))
    d = weight_diagnostics(out.weights, t.seq, t.num_seqs)
    assert d["corr_masked_share"] == 1.0 and d["corr_masked_seq_share"] == 1.0


def test_geo_rs_keeps_a_sequence_only_within_a_tenth_of_a_percent():
    z = torch.zeros(4, 2)
    # sequence 0: engine = trainer exactly (geometric mean 1), kept with weight 1; sequence 1: ratio 1.25
    t = terms(z, z, engine(0.5, 0.5, 0.4, 0.4), [0, 0, 0, 0], [1.0] * 4, seq=[0, 0, 1, 1])
    out = get_correction("geo_rs").fn(t, P)
    (g,) = torch.autograd.grad(out.loss, t.logits)
    assert out.mean_over == 2 and torch.allclose(g[:2], -0.5 * STEP.expand(2, -1)) and torch.equal(g[2:], torch.zeros(2, 2))
    d = weight_diagnostics(out.weights, t.seq, t.num_seqs)
    assert d["corr_masked_share"] == 0.5 and d["corr_masked_seq_share"] == 0.5 and d["corr_weight_max"] == 1.0


def test_icepop_weights_kept_tokens_by_the_ratio_and_drops_the_rest():
    assert torch.allclose(grad_of("icepop", terms(Z0, Z0, engine(0.2), [0], [1.0])), -2.5 * STEP)  # k = 2.5 in [.5, 5]
    assert torch.equal(grad_of("icepop", terms(Z0, Z0, engine(0.05), [0], [1.0])), torch.zeros(1, 2))  # k = 10 > 5
    low = torch.log(torch.tensor([[0.2, 0.8]]))  # π(y) = .2, q(y) = .8: k = .25 < .5
    assert torch.equal(grad_of("icepop", terms(low, low, engine(0.8), [0], [1.0])), torch.zeros(1, 2))


def test_decoupled_ppo_first_update_is_capped_engine_is_and_later_updates_clip():
    assert torch.allclose(grad_of("decoupled_ppo", terms(Z0, Z0, engine(0.2), [0], [1.0])), -2.5 * STEP)
    assert torch.equal(grad_of("decoupled_ppo", terms(Z0, Z0, engine(0.05), [0], [1.0])), torch.zeros(1, 2))  # 10 > cap 5
    moved = torch.log(torch.tensor([[0.9, 0.1]]))  # u = .9/.5 > 1 + ε with A > 0: no gradient
    assert torch.equal(grad_of("decoupled_ppo", terms(moved, Z0, engine(0.2), [0], [1.0], z_old=Z0)), torch.zeros(1, 2))


def test_center_tis_is_truncated_is_minus_its_expectation_under_the_engine():
    # V = 2, π = ½ ½, q = [.2, .8]: w = min(π/q, 2) = [2, .625]; m = q·w = [.4, .5], Σm = .9
    # direction for y = 0: w_y·onehot − m − (w_y − Σm)·π = [2, 0] − [.4, .5] − 1.1·[.5, .5]
    g = grad_of("center_tis", terms(Z0, Z0, engine(0.2), [0], [1.0]))
    assert torch.allclose(g, -torch.tensor([[2 - 0.4 - 0.55, -0.5 - 0.55]]), atol=1e-6)
    # the engine equal to the trainer: w = 1, and it is pg's gradient
    t = terms(Z_T[None], Z_T[None], Z_T[None], [2], [1.0])
    assert torch.allclose(grad_of("center_tis", t), grad_of("pg", t), atol=1e-6)


def test_unbounded_thresholds_reduce_to_untruncated_importance_sampling():
    inf = CorrectionParams(**INF)
    t = terms(torch.randn(6, 4, generator=torch.Generator().manual_seed(3)), torch.zeros(6, 4),
              torch.randn(6, 4, generator=torch.Generator().manual_seed(4)), [0, 1, 2, 3, 1, 0], [1.0, -1, 0.5, 0, 2, -0.5])
    for name in ("tis", "icepop", "decoupled_ppo"):
        assert torch.allclose(grad_of(name, t, inf), grad_of("is", t), atol=1e-7), name


# ----------------------------------------------------------------------------- exact expectations

Z1 = torch.tensor([0.2, -0.3])
Z2 = torch.tensor([[0.5, -0.5], [-1.0, 0.7]])
OFFSET = torch.tensor([0.6, -0.6])  # engine logits = trainer logits + this, at both steps
SEQ_REWARD = {(0, 0): 1.0, (0, 1): -1.0, (1, 0): -1.0, (1, 1): 1.0}


def trainer_objective_grad(n=2):
    """(1 − 1/n) ∇ E_π[r] / 2 under the trainer's own policy: what an unbiased correction targets."""
    p1, p2 = Z1.clone().requires_grad_(True), Z2.clone().requires_grad_(True)
    q1, q2 = torch.softmax(p1, -1), torch.softmax(p2, -1)
    j = sum(q1[a] * q2[a, b] * SEQ_REWARD[(a, b)] for a in range(2) for b in range(2))
    g1, g2 = torch.autograd.grad(-(1 - 1 / n) * j / 2, (p1, p2))
    return torch.cat([g1, g2.reshape(-1)])


def test_sequence_is_is_unbiased_on_sequences_and_token_is_is_not():
    target = trainer_objective_grad()
    inf = CorrectionParams(**INF)
    for name in ("seq_tis", "seq_mis"):  # C = ∞ (and no lower bound): sequence-level IS
        assert torch.allclose(seq_expected(name, Z1, Z2, OFFSET, SEQ_REWARD, params=inf), target, atol=1e-6), name
    token_is = seq_expected("is", Z1, Z2, OFFSET, SEQ_REWARD)
    assert (token_is - target).norm() > 0.05 * target.norm()


def test_center_tis_without_truncation_is_unbiased_under_a_discrepancy():
    on_policy = expected_grad("pg", Z_T, Z_T, Z_T, REWARD, 3)
    zq = Z_T + torch.tensor([0.4, -0.1, -0.3])  # the engine's numerics differ from the trainer's
    import test_corrections

    old, test_corrections.P = test_corrections.P, CorrectionParams(**INF)
    try:
        got = expected_grad("center_tis", Z_T, Z_T, zq, REWARD, 3)
    finally:
        test_corrections.P = old
    assert torch.allclose(got, on_policy, atol=1e-6)
    assert (expected_grad("pg", Z_T, Z_T, zq, REWARD, 3) - on_policy).norm() > 0.01


# ----------------------------------------------------------------------------- diagnostics


def test_diagnostics_of_a_batch_in_two_micro_batches():
    first = TokenWeights(torch.tensor([1.0, 2.0, 0.0]), clipped=torch.tensor([False, True, False]),
                         masked=torch.tensor([False, False, True]))
    second = TokenWeights(torch.tensor([0.0, 0.0, float("inf")]))  # no flags: nothing clipped or masked
    w = concat_weights([first, second])
    seq = torch.tensor([0, 0, 1, 2, 2, 3])
    d = weight_diagnostics(w, seq, 4)
    assert d == {"corr_weight_mean": 0.6, "corr_weight_max": 2.0, "corr_clipped_share": 1 / 6,
                 "corr_masked_share": 1 / 6, "corr_masked_seq_share": 0.25, "corr_nonfinite": 1.0}
