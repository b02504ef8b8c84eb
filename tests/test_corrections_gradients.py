"""Every correction's gradient against its formula, written out here per token (and per vocabulary
entry where it centres) in float64 from the raw inputs, never through the correction's surrogate;
on small random batches, with inputs on either side of each band edge, in the peers' orientation
(docs/method.md#corrections). The gradient is the loss's with respect to the trainer logits z,
where ∇_z log π(v) = onehot(v) − π."""

import dataclasses
import math

import pytest
import torch

from dlcrepro.step.corrections import CORRECTIONS, CorrectionParams, TokenTerms, get_correction

P = CorrectionParams()  # the defaults: the publications' thresholds
V = 5
LENGTHS = (3, 1, 4, 2)  # four sequences, ten tokens
ADV = (1.0, -1.0, 0.5, -0.5)  # per sequence: both signs, for the PPO clips


def per_token(values, lengths):
    """`(N,)` each sequence's value on each of its tokens."""
    return torch.tensor([v for v, n in zip(values, lengths) for _ in range(n)], dtype=torch.float32)


def spread(sums, lengths):
    """`(N,)` per-token values whose sum over each sequence is `sums`."""
    return per_token([s / n for s, n in zip(sums, lengths)], lengths)


def with_ratios(pi: torch.Tensor, ratios) -> torch.Tensor:
    """A distribution p over the row's V entries with pi[v] / p[v] = ratios[v] for the first
    len(ratios) entries, the last entry taking the rest of the mass."""
    p = pi.clone()
    k = len(ratios)
    p[:k] = pi[:k] / torch.tensor(ratios, dtype=pi.dtype)
    p[-1] = 1 - p[:-1].sum()
    assert k < len(pi) and p[-1] > 0
    return p


def batch(lengths=LENGTHS, adv=ADV, *, old_gap=None, engine_gap=None, seed=0, q_rows=None, s_rows=None) -> TokenTerms:
    """TokenTerms of sequences of `lengths` with random logits (trainer θ, engine and θ_s near θ).
    old_gap `(N,)`: b − old (θ has moved since θ_old); engine_gap `(N,)`: old − e (else e is the
    engine's own log-prob of the token). q_rows / s_rows: {token: distribution} to put in place of
    the engine's / θ_s's row at that token's prefix."""
    g = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    z = torch.randn(n, V, generator=g)
    tokens = torch.randint(V, (n,), generator=g)
    q = torch.softmax(z + 0.5 * torch.randn(n, V, generator=g), -1)
    p_s = torch.softmax(z + 0.5 * torch.randn(n, V, generator=g), -1)
    for rows, table in ((q_rows, q), (s_rows, p_s)):
        for i, row in (rows or {}).items():
            table[i] = row
    pick = lambda x: x.gather(-1, tokens[:, None]).squeeze(-1)  # noqa: E731
    b = pick(torch.log_softmax(z, -1))
    old = b - (old_gap if old_gap is not None else torch.zeros(n))
    e = old - engine_gap if engine_gap is not None else pick(torch.log(q))
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    return TokenTerms(logits=z.clone().requires_grad_(True), tokens=tokens, adv=per_token(adv, lengths), e=e,
                      a=pick(torch.log(p_s)), old=old, q=q, logp_s_of=lambda: torch.log(p_s), seq=seq, num_seqs=len(lengths))


def grad(name, t, p=P):
    (g,) = torch.autograd.grad(get_correction(name).fn(t, p).loss, t.logits)
    return g.double()


# ----------------------------------------------------------------------------- the formulas


class Raw:
    """The batch in float64, recomputed from its logits: π, b, the score ∇_z ℓ(y) = onehot(y) − π,
    and each token's sequence, its length and the number of tokens and sequences."""

    def __init__(self, t: TokenTerms):
        self.z = t.logits.detach().double()
        self.pi = torch.softmax(self.z, -1)
        self.y = t.tokens
        self.onehot = torch.nn.functional.one_hot(t.tokens, V).double()
        self.score = self.onehot - self.pi
        self.b = torch.log(self.pi.gather(-1, self.y[:, None]).squeeze(-1))
        self.e, self.a, self.old, self.adv = (x.double() for x in (t.e, t.a, t.old, t.adv))
        self.q, self.logp_s = t.q.double(), t.logp_s.double()
        self.seq, self.n, self.num_seqs = t.seq, len(t.seq), t.num_seqs
        self.length = torch.bincount(t.seq, minlength=t.num_seqs).double()[t.seq]

    def seq_sum(self, x):
        """`(N,)` the sum of x over each token's sequence."""
        return torch.stack([x[self.seq == self.seq[i]].sum() for i in range(self.n)])

    def token_mean(self, w):
        """The gradient of −(1/N) Σ_t w_t · A_t · ℓ(y_t)."""
        return -(w * self.adv)[:, None] * self.score / self.n

    def unclipped(self, r, low, high):
        """PPO's clip does not bind: not (A > 0 and r > 1 + high), not (A < 0 and r < 1 − low)."""
        return ~(((self.adv > 0) & (r > 1 + high)) | ((self.adv < 0) & (r < 1 - low)))


def bound(x):
    return x.clamp(-20, 20)


def pg(r: Raw, p):
    return r.token_mean(torch.ones(r.n, dtype=torch.float64))


def importance_sampling(r: Raw, p):
    return r.token_mean(torch.exp(r.b - r.e))


def tis(r: Raw, p):
    return r.token_mean(torch.exp(bound(r.b - r.e)).clamp(max=p.clip_c))


def seq_tis(r: Raw, p):
    return r.token_mean(torch.exp(bound(r.seq_sum(r.b - r.e))).clamp(max=p.seq_clip_c))


def kept_mean(r: Raw, w, keep):
    """The gradient of −(1/n_kept) Σ_kept w·A·ℓ(y); 0 when nothing is kept (verl: 0/0)."""
    kept = int(keep.sum())
    return r.token_mean(w * keep) * r.n / kept if kept else torch.zeros(r.n, V, dtype=torch.float64)


def seq_mis(r: Raw, p):
    k1 = r.seq_sum(bound(r.e - r.b))  # verl's seq_sum_k1: rollout over trainer
    keep = (torch.exp(k1) >= p.seq_mis_low) & (torch.exp(k1) <= p.seq_mis_high)
    return kept_mean(r, torch.exp(bound(r.seq_sum(r.b - r.e))).clamp(max=p.seq_clip_c), keep)


def geo_rs(r: Raw, p):
    k1 = r.seq_sum(bound(r.e - r.b)) / r.length  # verl's seq_mean_k1
    return kept_mean(r, torch.ones(r.n, dtype=torch.float64), (torch.exp(k1) >= p.geo_low) & (torch.exp(k1) <= p.geo_high))


def ppo(r: Raw, p):
    ratio = torch.exp(r.b - r.old)
    return r.token_mean(ratio * r.unclipped(ratio, p.ppo_eps, p.ppo_eps))


def masked_ppo(r: Raw, p, low, high):
    """PPO's term times w = π_old/π_engine, w outside [low, high] dropped (it stays in the mean)."""
    w = torch.exp(r.old - r.e)
    ratio = torch.exp(r.b - r.old)
    return r.token_mean(w * ((w >= low) & (w <= high)) * ratio * r.unclipped(ratio, p.ppo_eps, p.ppo_eps))


def gspo(r: Raw, p):
    log_s = r.seq_sum(r.b - r.old) / r.length
    s = torch.exp(log_s.clamp(max=10))
    live = r.unclipped(s, p.gspo_clip_low, p.gspo_clip_high) & (log_s <= 10)  # the cap on log s has no gradient
    return -(r.adv * s * live / (r.num_seqs * r.length))[:, None] * r.score


def centred(r: Raw, w_y, q_tilde):
    """The gradient of −(1/N) Σ_t w_y · A · c(y), c(y) = ∇ℓ(y) − Σ_v q̃(v) ∇ℓ(v), summed entry by entry."""
    c = r.score.clone()
    for v in range(V):
        c -= q_tilde[:, v : v + 1] * (torch.nn.functional.one_hot(torch.tensor(v), V).double() - r.pi)
    return -(w_y * r.adv)[:, None] * c / r.n


def center(r: Raw, p):
    return centred(r, torch.ones(r.n, dtype=torch.float64), r.q)


def lag_weighted(r: Raw, ratio):
    """is_center's and dlc's term: the lag ratio of y, the score centred under q reweighted by it."""
    q_tilde = r.q * ratio / (r.q * ratio).sum(-1, keepdim=True)
    return centred(r, ratio.gather(-1, r.y[:, None]).squeeze(-1), q_tilde)


def is_center(r: Raw, p):
    return lag_weighted(r, torch.exp(torch.log(r.pi) - r.logp_s))


def dlc(r: Raw, p):
    return lag_weighted(r, torch.exp(torch.log(r.pi) - r.logp_s).clamp(max=p.clip_c))


def center_tis(r: Raw, p):
    """−(1/N) Σ_t A · [w(y)∇ℓ(y) − Σ_v q(v) w(v) ∇ℓ(v)], w = min(π/q, C), entry by entry; the sampled
    token's log ratio bounded to ±10 first (torchtitan's)."""
    w = (r.pi / r.q).clamp(max=p.clip_c)
    w_y = torch.exp((torch.log(r.pi) - torch.log(r.q)).gather(-1, r.y[:, None]).clamp(-10, 10)).clamp(max=p.clip_c)
    d = w_y * r.score
    for v in range(V):
        d -= (r.q[:, v] * w[:, v])[:, None] * (torch.nn.functional.one_hot(torch.tensor(v), V).double() - r.pi)
    return -r.adv[:, None] * d / r.n


REFERENCE = {
    "pg": pg, "center": center, "is": importance_sampling, "is_center": is_center, "ppo": ppo, "ppo_multi": ppo,
    "dlc": dlc, "is_resync": importance_sampling, "tis": tis, "seq_tis": seq_tis, "seq_mis": seq_mis, "geo_rs": geo_rs,
    "icepop": lambda r, p: masked_ppo(r, p, p.icepop_low, p.icepop_high),
    "decoupled_ppo": lambda r, p: masked_ppo(r, p, p.behav_weight_low, p.behav_weight_cap),
    "center_tis": center_tis, "gspo": gspo,
}


def check(name, t, p=P):
    """The correction's gradient is its formula's; returns the gradient."""
    got, want = grad(name, t, p), REFERENCE[name](Raw(t), p)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-7), f"{name}: largest gap {(got - want).abs().max():.3g}"
    return got


def live(g):
    """`(N,)` bool: the token's row of the gradient is not zero."""
    return g.abs().sum(-1) > 0


# ----------------------------------------------------------------------------- every correction, random inputs


def test_every_registered_correction_has_a_formula_here():
    assert set(REFERENCE) == set(CORRECTIONS)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_the_gradient_is_the_formula_on_a_random_batch(name):
    """θ has moved since θ_old (PPO-style corrections see r ≠ 1) and the engine and θ_s differ from θ."""
    gen = torch.Generator().manual_seed(7)
    t = batch(old_gap=0.3 * torch.randn(sum(LENGTHS), generator=gen), seed=1)
    # Geo-RS's 0.1 % band and GSPO's 3e-4/4e-4 clip would leave no random sequence a gradient
    wide = dataclasses.replace(P, geo_low=0.5, geo_high=2.0, gspo_clip_low=0.2, gspo_clip_high=0.2)
    assert live(check(name, t, wide)).any()


# ----------------------------------------------------------------------------- token IS


def test_tis_truncates_at_c_and_bounds_the_log_ratio_at_20():
    gap = torch.tensor([math.log(2) - 0.01, math.log(2) + 0.01, 25.0, -25.0, 0.3, 0, 0, 0, 0, 0])
    t = batch(engine_gap=gap)
    check("tis", t)
    assert get_correction("tis").fn(t, P).weights.clipped[:2].tolist() == [False, True]
    inf = dataclasses.replace(P, clip_c=math.inf)
    g = check("tis", t, inf)
    pi_y = Raw(t).pi.gather(-1, t.tokens[:, None]).squeeze(-1)
    w = -g.gather(-1, t.tokens[:, None]).squeeze(-1) * 10 / (t.adv.double() * (1 - pi_y))  # row y of −w·A·(onehot − π)/N
    assert w[2] == pytest.approx(math.exp(20), rel=1e-5) and w[3] == pytest.approx(math.exp(-20), rel=1e-4)


def test_seq_tis_truncates_the_sequence_ratio_at_c_seq_and_bounds_its_log_at_20():
    t = batch(engine_gap=spread([math.log(2) - 0.01, math.log(2) + 0.01, 25.0, -0.4], LENGTHS))
    check("seq_tis", t)
    clipped = get_correction("seq_tis").fn(t, P).weights.clipped
    assert [bool(clipped[t.seq == i].all()) for i in range(4)] == [False, True, True, False]
    check("seq_tis", t, dataclasses.replace(P, seq_clip_c=math.inf))


# ----------------------------------------------------------------------------- verl's rejections, its orientation


def kept_sequences(name, t, p=P):
    """The sequences whose tokens the correction kept (its gradient checked against the formula)."""
    g = check(name, t, p)
    out = get_correction(name).fn(t, p)
    kept = [bool(live(g)[t.seq == i].any()) for i in range(t.num_seqs)]
    assert kept == [not bool(out.weights.masked[t.seq == i].all()) for i in range(t.num_seqs)]
    assert out.mean_over == sum(n for n, k in zip(LENGTHS, kept) if k)
    return kept


def test_geo_rs_keeps_a_geometric_mean_within_a_tenth_of_a_percent():
    # mean log ratio b − e per sequence: ±0.0005 inside the band 0.999_1.001, ±0.0015 outside
    t = batch(engine_gap=per_token([0.0005, 0.0015, -0.0005, -0.0015], LENGTHS))
    assert kept_sequences("geo_rs", t) == [True, False, True, False]


def test_geo_rs_band_bounds_rollout_over_trainer_as_verl_writes_it():
    """verl's seq_mean_k1 band "0.8_1.1" bounds exp(mean(e − b)): a sequence whose geometric-mean
    trainer/engine ratio is e^0.15 = 1.16 is kept (1/1.16 = 0.86 ≥ 0.8), one at e^−0.15 = 0.86 is
    rejected (1/0.86 = 1.16 > 1.1): the other way round from a band on ρ itself."""
    p = dataclasses.replace(P, geo_low=0.8, geo_high=1.1)
    t = batch(engine_gap=per_token([0.15, -0.15, 0.25, -0.05], LENGTHS))
    assert kept_sequences("geo_rs", t, p) == [True, False, False, True]


def test_geo_rs_bounds_each_token_log_ratio_at_20_before_the_mean():
    """Token log ratios 25, −19.95, −4.95, 0.1: their mean 0.05 is inside the band 0.8_1.1, but verl
    clamps 25 to 20 first, a mean of −1.2, and rejects the sequence."""
    p = dataclasses.replace(P, geo_low=0.8, geo_high=1.1)
    t = batch(engine_gap=torch.tensor([0.0, 0, 0, 0.05, 25.0, -19.95, -4.95, 0.1, 0, 0]))
    assert kept_sequences("geo_rs", t, p) == [True, True, False, True]


def test_seq_mis_band_edges_at_verls_default():
    # Σ(b − e) per sequence around ±log 2: the band 0.5_2.0 is its own reciprocal
    sums = [math.log(2) - 0.01, math.log(2) + 0.01, -math.log(2) + 0.01, -math.log(2) - 0.01]
    t = batch(engine_gap=spread(sums, LENGTHS))
    assert kept_sequences("seq_mis", t) == [True, False, True, False]


def test_seq_mis_band_bounds_rollout_over_trainer_and_its_weight_is_truncated_at_c_seq():
    """Band "0.8_1.1" on exp(Σ(e − b)) and C_seq 1.2: ρ_seq = e^0.2 = 1.22 is kept (1/ρ = 0.82) and
    truncated to 1.2; e^−0.15 rejected (1/ρ = 1.16); e^0.25 rejected (1/ρ = 0.78); e^−0.05 kept."""
    p = dataclasses.replace(P, seq_mis_low=0.8, seq_mis_high=1.1, seq_clip_c=1.2)
    t = batch(engine_gap=spread([0.2, -0.15, 0.25, -0.05], LENGTHS))
    assert kept_sequences("seq_mis", t, p) == [True, False, False, True]
    w = get_correction("seq_mis").fn(t, p).weights
    assert torch.allclose(w.weight[t.seq == 0], torch.tensor(1.2)) and w.clipped[t.seq == 0].all()
    assert torch.allclose(w.weight[t.seq == 3], torch.tensor(math.exp(-0.05))) and not w.clipped[t.seq == 3].any()


def test_seq_mis_bounds_each_token_log_ratio_at_20_before_the_sum():
    """Token log ratios 25, −19.95, −4.95 sum to 0.1, inside the band; clamped first, to −4.9."""
    t = batch(engine_gap=torch.tensor([0.0, 0, 0, 0.05, 25.0, -19.95, -4.95, 0, 0, 0]))
    assert kept_sequences("seq_mis", t) == [True, True, False, True]


def test_every_sequence_rejected_is_no_update_where_verls_mean_is_0_over_0():
    t = batch(engine_gap=per_token([0.1, -0.1, 0.2, -0.2], LENGTHS))
    for name in ("geo_rs", "seq_mis"):
        p = dataclasses.replace(P, seq_mis_low=0.99, seq_mis_high=1.01)
        out = get_correction(name).fn(t, p)
        assert out.mean_over == 0 and float(out.loss.detach()) == 0.0 and not live(check(name, t, p)).any()


# ----------------------------------------------------------------------------- PPO and its token masks


def ppo_edges():
    """b − old per token either side of the clip 1 ± 0.2, with the advantage's sign that binds it
    (sequence 0: A > 0, tokens at r = 1.2·e^∓0.01, and r = 0.7 which never binds for A > 0;
    sequence 2: A > 0 too; sequences 1 and 3: A < 0 at r = 0.8·e^±0.01)."""
    up, down = math.log(1.2), math.log(0.8)
    return torch.tensor([up - 0.01, up + 0.01, math.log(0.7), down + 0.01, up - 0.01, up + 0.01, 0, 0, down - 0.01, 0.4])


@pytest.mark.parametrize("name", ["ppo", "ppo_multi"])
def test_ppo_clip_edges(name):
    g = check(name, batch(old_gap=ppo_edges()))
    assert live(g).tolist() == [True, False, True, True, True, False, True, True, False, True]


def band_edges(low, high):
    """log(π_old/π_engine) per token either side of [low, high], on tokens the PPO clip alone keeps:
    inside high (token 0), outside high (2), outside low (3), inside low (4)."""
    return torch.tensor([math.log(high) - 0.01, 0, math.log(high) + 0.01, math.log(low) - 0.01, math.log(low) + 0.01,
                         0, 0, 0, 0, 0])


def test_icepop_keeps_k_in_its_band_inclusive_and_clips_r():
    # k = exp(old − e) either side of α = 0.5 and β = 5 (slime's orientation); the PPO clip of r on top
    g = check("icepop", batch(old_gap=ppo_edges(), engine_gap=band_edges(0.5, 5)))
    assert live(g).tolist() == [True, False, False, False, True, False, True, True, False, True]


def test_decoupled_ppo_masks_the_behaviour_weight_outside_areals_bounds():
    # w = exp(old − e) either side of the cap 5 and of a lower bound 0.5 (AReaL's rejection_sampling
    # {level: token, action: mask, metric: ratio, lower: 0.5, upper: 5})
    t = batch(old_gap=ppo_edges(), engine_gap=band_edges(0.5, 5))
    g = check("decoupled_ppo", t, dataclasses.replace(P, behav_weight_low=0.5))
    assert live(g).tolist() == [True, False, False, False, True, False, True, True, False, True]
    assert live(check("decoupled_ppo", t))[3]  # no lower bound by default (AReaL's lower: null)


def test_gspo_clips_the_length_normalised_sequence_ratio_at_3e_4_and_4e_4():
    """s_i either side of 1 + 4e-4 (A > 0: sequences 0, 2) and 1 − 3e-4 (A < 0: sequences 1, 3);
    a clip that binds drops the whole sequence."""
    s = [math.log(1 + 3.9e-4), math.log(1 - 3.1e-4), math.log(1 + 4.1e-4), math.log(1 - 2.9e-4)]
    t = batch(old_gap=per_token(s, LENGTHS) + torch.tensor([1e-5, -1e-5, 0, 0, 0, 0, 0, 0, 2e-5, -2e-5]))
    g = check("gspo", t)
    assert [bool(live(g)[t.seq == i].all()) for i in range(4)] == [True, False, False, True]
    assert not live(g)[(t.seq == 1) | (t.seq == 2)].any()


def test_gspo_caps_the_log_ratio_at_10_and_weights_each_token_by_its_sequence_length():
    # A < 0 and s large: never clipped; log s = 9 keeps its gradient, 11 is capped (no gradient)
    t = batch(old_gap=per_token([0.0, 11.0, 9.0, 0.0], LENGTHS), adv=(1.0, -1.0, -1.0, 0.5))
    g = check("gspo", t)
    assert live(g)[t.seq == 2].all() and not live(g)[t.seq == 1].any()
    # at θ = θ_old: s = 1, a token's term is A·∇ℓ(y)/(B·|y_i|), a sequence mean of token means
    t = batch()
    assert torch.allclose(grad("gspo", t), REFERENCE["pg"](Raw(t), P) * 10 / (4 * Raw(t).length[:, None]), atol=1e-7)


# ----------------------------------------------------------------------------- centring, per vocabulary entry


def test_dlc_clips_each_vocabulary_entry_s_lag_ratio_at_c():
    """θ_s's row at token 0 puts exp(λ_v) at C·e^∓0.01 on entries 0 and 1 and at 1/2, 1 on 2, 3."""
    t = batch()
    pi = torch.softmax(t.logits.detach(), -1)
    t = batch(s_rows={0: with_ratios(pi[0], [2 * math.exp(-0.01), 2 * math.exp(0.01), 0.5, 1.0]),
                      4: with_ratios(pi[4], [2 * math.exp(0.01), 0.5])})
    check("dlc", t)
    check("is_center", t)  # the same inputs, untruncated


def test_center_tis_truncates_each_vocabulary_entry_s_ratio_to_the_engine_at_c():
    t = batch()
    pi = torch.softmax(t.logits.detach(), -1)
    t = batch(q_rows={0: with_ratios(pi[0], [2 * math.exp(-0.01), 2 * math.exp(0.01), 0.9, 1.1]),
                      5: with_ratios(pi[5], [2 * math.exp(0.01), 0.5])})
    check("center_tis", t)
    check("center", t)


def test_center_tis_bounds_the_sampled_token_s_log_ratio_at_10():
    """π(y)/q(y) = e^-20 at token 0: its weight is e^-10, as torchtitan bounds it (the expectation's
    q·w = min(π, C·q) is not bounded)."""
    t = batch()
    z = t.logits.detach().clone()
    z[0, t.tokens[0]] -= 25.0  # π(y) ≈ e^-25 of its former self
    t = dataclasses.replace(t, logits=z.requires_grad_(True))
    r = Raw(t)
    assert float(torch.log(r.pi[0, t.tokens[0]] / r.q[0, t.tokens[0]])) < -15
    g = check("center_tis", t)
    assert get_correction("center_tis").fn(t, P).weights.weight[0] == pytest.approx(math.exp(-10), rel=1e-5)
    assert live(g)[0]
