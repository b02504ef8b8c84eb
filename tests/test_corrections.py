"""Corrections: exact hand cases, exact expectations on tabular softmax policies, Monte-Carlo."""

import dataclasses
import itertools
import math

import pytest
import torch

from dlcrepro.step.corrections import (
    CORRECTIONS,
    CorrectionParams,
    TokenTerms,
    engine_distribution,
    get_correction,
)
from dlcrepro.step.diagnostics import mismatch_metrics

P = CorrectionParams(clip_c=2.0, ppo_eps=0.2)


def terms(z_t, z_s, z_q, tokens, adv, z_old=None, seq=None):
    """TokenTerms for a tabular policy: row k of each `(N, V)` logit table is token k's prefix;
    each token its own sequence unless `seq` says which sequence each belongs to."""
    logits = z_t.clone().requires_grad_(True) if not z_t.requires_grad else z_t
    lq = torch.log_softmax(z_q, -1)
    ls = torch.log_softmax(z_s, -1)
    lo = torch.log_softmax(z_old if z_old is not None else z_t.detach(), -1)
    tok = torch.as_tensor(tokens)
    pick = lambda logp: logp.gather(-1, tok[:, None]).squeeze(-1)  # noqa: E731
    seq = torch.arange(len(tok)) if seq is None else torch.as_tensor(seq)
    return TokenTerms(logits=logits, tokens=tok, adv=torch.as_tensor(adv, dtype=torch.float32), e=pick(lq), a=pick(ls),
                      old=pick(lo), q=lq.exp(), logp_s_of=lambda: ls, seq=seq, num_seqs=int(seq.max()) + 1)


def grad_of(name, t, params=P):
    loss = get_correction(name).fn(t, params).loss
    (g,) = torch.autograd.grad(loss, t.logits)
    return g


# ----------------------------------------------------------------------------- registry


def test_unknown_correction_lists_the_known_ones():
    with pytest.raises(KeyError, match="known:.*dlc"):
        get_correction("dlcc")


def test_registry_holds_every_spec_correction():
    assert {"pg", "center", "is", "is_center", "ppo", "dlc", "is_resync"} <= set(CORRECTIONS)
    assert CORRECTIONS["dlc"].resync and CORRECTIONS["is_resync"].resync and not CORRECTIONS["is"].resync


def test_corrections_without_needs_q_never_read_the_engine_distribution():
    # the trainer passes q=None to them and their engine returns no top-k log-probs: a correction
    # that reads t.q must say so when it registers
    g = torch.Generator().manual_seed(0)
    z = lambda: torch.randn(5, 4, generator=g)  # noqa: E731
    t = terms(z(), z(), z(), [0, 1, 2, 3, 1], [1.0, -1.0, 0.5, 0.0, 2.0])
    assert {n for n, c in CORRECTIONS.items() if c.needs_q} >= {"center", "is_center", "dlc"}
    for name, c in CORRECTIONS.items():
        if not c.needs_q:
            full = c.fn(t, P).loss
            assert torch.equal(c.fn(dataclasses.replace(t, q=None), P).loss, full), name


# ----------------------------------------------------------------------------- exact two-token cases
# One token, V = 2, trainer logits 0 (π = ½, ½), sampled y = 0, advantage 1: the loss gradient
# with respect to the logits is −A·w·(onehot(y) − reference distribution).

Z0 = torch.zeros(1, 2)
ZQ = torch.log(torch.tensor([[0.8, 0.2]]))
ZS = torch.log(torch.tensor([[0.25, 0.75]]))


def test_pg_two_tokens():
    g = grad_of("pg", terms(Z0, Z0, ZQ, [0], [1.0]))
    assert torch.allclose(g, torch.tensor([[-0.5, 0.5]]))


def test_center_uses_the_engine_distribution():
    g = grad_of("center", terms(Z0, Z0, ZQ, [0], [1.0]))
    assert torch.allclose(g, torch.tensor([[-0.2, 0.2]]))  # −(onehot − q) = −([1,0] − [.8,.2])


def test_is_weights_by_trainer_over_engine():
    g = grad_of("is", terms(Z0, Z0, ZQ, [0], [1.0]))
    assert torch.allclose(g, -0.625 * torch.tensor([[0.5, -0.5]]))  # exp(log .5 − log .8) = .625


def test_is_center_weights_by_lag_and_centres_under_reweighted_q():
    # λ_v = log π_t − log π_s = log(.5/.25), log(.5/.75) → ratios 2, 2/3; q̃ ∝ q·ratio = [1.6, 2/15]
    g = grad_of("is_center", terms(Z0, ZS, ZQ, [0], [1.0]))
    qt = torch.tensor([1.6, 2 / 15])
    qt = qt / qt.sum()
    assert torch.allclose(g, -2.0 * (torch.tensor([[1.0, 0.0]]) - qt), atol=1e-6)


def test_dlc_clips_lag_ratio_at_c():
    # π_s = [.1, .9] → ratios 5 and 5/9; clipped at C = 2: w(y=0) = 2, q̃ ∝ q·[2, 5/9]
    zs = torch.log(torch.tensor([[0.1, 0.9]]))
    g = grad_of("dlc", terms(Z0, zs, ZQ, [0], [1.0]))
    qt = torch.tensor([0.8 * 2, 0.2 * 5 / 9])
    qt = qt / qt.sum()
    assert torch.allclose(g, -2.0 * (torch.tensor([[1.0, 0.0]]) - qt), atol=1e-6)


def test_dlc_weight_never_exceeds_c():
    torch.manual_seed(0)
    n, v = 500, 5
    z_t, z_s = torch.randn(n, v) * 3, torch.randn(n, v) * 3
    tokens = torch.randint(v, (n,))
    t = terms(z_t, z_s, z_s, tokens, torch.ones(n))
    g = grad_of("dlc", t)
    # per row, g = −w/N·(onehot − q̃); the onehot entry is −w/N·(1 − q̃_y) so w = −N·g_y/(1 − q̃_y) ≤ C
    lam = torch.log_softmax(z_t, -1) - torch.log_softmax(z_s, -1)
    qt = t.q * lam.exp().clamp(max=P.clip_c)
    qt = qt / qt.sum(-1, keepdim=True)
    w = -n * g.gather(-1, tokens[:, None]).squeeze(-1) / (1 - qt.gather(-1, tokens[:, None]).squeeze(-1))
    assert w.max() <= P.clip_c + 1e-4
    assert (lam.gather(-1, tokens[:, None]).exp() > P.clip_c).any()  # the clip was needed


def test_ppo_at_first_update_is_pg_and_clips_afterwards():
    t = terms(Z0, Z0, ZQ, [0], [1.0])
    assert torch.allclose(grad_of("ppo", t), grad_of("pg", t))
    # θ moved so that the ratio is 0.9/0.5 > 1 + ε with A > 0: the clipped branch has no gradient.
    moved = torch.log(torch.tensor([[0.9, 0.1]]))
    t2 = terms(moved, Z0, ZQ, [0], [1.0], z_old=Z0)
    assert torch.allclose(grad_of("ppo", t2), torch.zeros(1, 2))


# ----------------------------------------------------------------------------- exact expectations


def enumerate_groups(q_logits, n):
    """All groups of n single-token draws from softmax(q_logits) `(V,)`, with their probabilities."""
    q = torch.softmax(q_logits, -1)
    for group in itertools.product(range(len(q)), repeat=n):
        yield list(group), float(torch.prod(q[list(group)]))


def expected_grad(name, z_t, z_s, z_q, reward, n):
    """E over groups of n of the correction's gradient w.r.t. the shared logits z_t `(V,)`."""
    total = torch.zeros_like(z_t)
    for group, prob in enumerate_groups(z_q, n):
        r = reward[group]
        adv = r - r.mean()
        zt = z_t.clone().requires_grad_(True)
        t = terms(zt.expand(n, -1), z_s.expand(n, -1), z_q.expand(n, -1), group, adv)
        t.logits = zt.expand(n, -1)
        loss = get_correction(name).fn(t, P).loss
        (g,) = torch.autograd.grad(loss, zt)
        total += prob * g
    return total


Z_T = torch.tensor([0.3, -0.2, 0.5])
REWARD = torch.tensor([1.0, -1.0, 0.5])


def test_is_is_unbiased_under_lag_and_pg_is_not():
    z_s = torch.tensor([1.0, 0.4, -0.8])  # older weights: the sampler is lagged
    on_policy = expected_grad("pg", Z_T, Z_T, Z_T, REWARD, 3)
    is_ = expected_grad("is", Z_T, z_s, z_s, REWARD, 3)
    pg = expected_grad("pg", Z_T, z_s, z_s, REWARD, 3)
    assert torch.allclose(is_, on_policy, atol=1e-6)
    assert (pg - on_policy).norm() > 0.05


def test_is_center_is_unbiased_under_pure_lag():
    z_s = torch.tensor([1.0, 0.4, -0.8])
    on_policy = expected_grad("pg", Z_T, Z_T, Z_T, REWARD, 3)
    assert torch.allclose(expected_grad("is_center", Z_T, z_s, z_s, REWARD, 3), on_policy, atol=1e-6)


def test_decomposition_discrepancy_plus_lag_is_total_mismatch():
    torch.manual_seed(1)
    e, a, b = torch.randn(3, 1000, dtype=torch.float64)
    m = mismatch_metrics(e, a, b, torch.arange(1000) % 10, 10)
    # each against its definition (docs/method.md#notation): a swap of δ and λ fails here
    for name, x in (("discrepancy", a - e), ("lag", b - a)):
        assert math.isclose(m[f"{name}_mean"], float(x.mean()), rel_tol=1e-12)
        assert math.isclose(m[f"{name}_mean_abs"], float(x.abs().mean()), rel_tol=1e-12)
        assert math.isclose(m[f"{name}_std"], float(x.std(unbiased=False)), rel_tol=1e-12)
    assert math.isclose(m["discrepancy_mean"] + m["lag_mean"], float((b - e).mean()), rel_tol=1e-12)


# ----------------------------------------------------------------------------- sequences: centring


def seq_expected(name, z1, z2, offset, reward, n=2, params=P):
    """E over groups of n two-token sequences sampled from the engine (trainer logits + offset)."""
    seqs = list(itertools.product(range(2), repeat=2))

    def logq(y1, y2):
        return float(torch.log_softmax(z1 + offset, -1)[y1] + torch.log_softmax(z2[y1] + offset, -1)[y2])

    g1, g2 = torch.zeros_like(z1), torch.zeros_like(z2)
    for group in itertools.product(range(len(seqs)), repeat=n):
        prob = math.exp(sum(logq(*seqs[i]) for i in group))
        r = torch.tensor([reward[seqs[i]] for i in group])
        adv = r - r.mean()
        p1 = z1.clone().requires_grad_(True)
        p2 = z2.clone().requires_grad_(True)
        rows, toks, advs = [], [], []
        for i, gi in enumerate(group):
            y1, y2 = seqs[gi]
            rows += [p1, p2[y1]]
            toks += [y1, y2]
            advs += [adv[i], adv[i]]
        logits = torch.stack(rows)
        zq = logits.detach() + offset
        t = terms(logits.detach(), logits.detach(), zq, toks, torch.stack(advs), seq=[i // 2 for i in range(2 * n)])
        t.logits = logits
        loss = get_correction(name).fn(t, params).loss
        a1, a2 = torch.autograd.grad(loss, (p1, p2))
        g1 += prob * a1
        g2 += prob * a2
    return torch.cat([g1, g2.reshape(-1)])


def engine_objective_grad(z1, z2, offset, reward, n=2):
    """(1 − 1/n) ∇_z E_{q_z}[r] / 2: what an unbiased estimator from the engine's samples targets
    (the loss is a mean over tokens, two per sequence)."""
    p1 = z1.clone().requires_grad_(True)
    p2 = z2.clone().requires_grad_(True)
    q1 = torch.softmax(p1 + offset, -1)
    q2 = torch.softmax(p2 + offset, -1)
    j = sum(q1[y1] * q2[y1, y2] * reward[(y1, y2)] for y1, y2 in itertools.product(range(2), repeat=2))
    a1, a2 = torch.autograd.grad(-(1 - 1 / n) * j / 2, (p1, p2))  # a loss gradient, like the corrections'
    return torch.cat([a1, a2.reshape(-1)])


def test_center_removes_the_baseline_induced_bias_of_a_constant_discrepancy():
    z1 = torch.tensor([0.2, -0.3])
    z2 = torch.tensor([[0.5, -0.5], [-1.0, 0.7]])
    offset = torch.tensor([0.6, -0.6])  # constant logit offset engine vs trainer (the discrepancy)
    reward = {(0, 0): 1.0, (0, 1): -1.0, (1, 0): -1.0, (1, 1): 1.0}
    target = engine_objective_grad(z1, z2, offset, reward)
    center = seq_expected("center", z1, z2, offset, reward)
    pg = seq_expected("pg", z1, z2, offset, reward)
    assert torch.allclose(center, target, atol=1e-6)
    assert (pg - target).norm() > 0.05 * target.norm()  # pg keeps E[A·Σ_t (q_t − π_t)], the baseline-induced term


@pytest.mark.slow
def test_monte_carlo_center_matches_its_exact_expectation():
    """Sampled groups of the tabular bandit: the Monte-Carlo mean is within 4 standard errors."""
    gen = torch.Generator().manual_seed(0)
    offset = torch.tensor([0.4, -0.1, -0.3])
    zq = Z_T + offset
    exact = expected_grad("center", Z_T, Z_T, zq, REWARD, 3)
    draws = []
    for _ in range(4000):
        group = torch.multinomial(torch.softmax(zq, -1), 3, replacement=True, generator=gen)
        r = REWARD[group]
        zt = Z_T.clone().requires_grad_(True)
        t = terms(zt.expand(3, -1), Z_T.expand(3, -1), zq.expand(3, -1), group, r - r.mean())
        t.logits = zt.expand(3, -1)
        (g,) = torch.autograd.grad(get_correction("center").fn(t, P).loss, zt)
        draws.append(g)
    d = torch.stack(draws)
    se = d.std(0) / math.sqrt(len(d))
    assert ((d.mean(0) - exact).abs() <= 4 * se + 1e-6).all()


# ----------------------------------------------------------------------------- engine distribution


def test_engine_distribution_full_vocabulary_is_the_engine_distribution():
    lq = torch.log_softmax(torch.tensor([[0.1, 2.0, -1.0]]), -1)
    ids = torch.tensor([[1, 0, 2]])
    q = engine_distribution(ids, lq[:, [1, 0, 2]], torch.log_softmax(torch.zeros(1, 3), -1))
    assert torch.allclose(q, lq.exp(), atol=1e-6)


def test_engine_distribution_spreads_the_rest_like_the_trainer():
    # top-1 = token 0 with q = .5; the other .5 goes to tokens 1, 2 in proportion .3 : .1
    ps = torch.log(torch.tensor([[0.6, 0.3, 0.1]]))
    q = engine_distribution(torch.tensor([[0]]), torch.log(torch.tensor([[0.5]])), ps)
    assert torch.allclose(q, torch.tensor([[0.5, 0.375, 0.125]]), atol=1e-6)
