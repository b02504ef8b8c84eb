"""The mismatch under the frameworks' names (`diagnostics.field_metrics`), each key against its
published formula worked by hand on a few tokens: one token, one sequence, sequences of unequal
length (where verl's token means and slime's sequence means part), log-ratios past the clamps, the
signs; and the step's three applications of it (total, discrepancy, lag)."""

import math

import pytest
import torch

from dlcrepro.step import diagnostics as d
from dlcrepro.step.divergence import check_finite
from dlcrepro.core.util import NonFiniteError

T = torch.float64


def metrics(trainer, engine, seq=None, num_seqs=None):
    trainer, engine = torch.tensor(trainer, dtype=T), torch.tensor(engine, dtype=T)
    seq = torch.zeros(len(trainer), dtype=torch.long) if seq is None else torch.tensor(seq)
    return d.field_metrics(trainer, engine, seq, num_seqs or int(seq.max()) + 1)


def test_it_returns_every_key_of_verl_slime_and_miles():
    verl = {"training_ppl", "training_log_ppl", "kl", "k3_kl", "rollout_ppl", "rollout_log_ppl", "log_ppl_diff",
            "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio", "chi2_token", "chi2_seq"}
    m = metrics([-1.0], [-1.5])
    assert set(m) == verl | {"train_rollout_logprob_abs_diff", "train_rollout_kl"} and tuple(m) == d.FIELD_METRICS


def test_one_token():
    m = metrics([-1.0], [-1.5])  # δ = 0.5: the trainer more confident than the engine
    want = {"training_ppl": math.e, "training_log_ppl": 1.0, "kl": -0.5, "k3_kl": math.exp(0.5) - 1.5,
            "rollout_ppl": math.exp(1.5), "rollout_log_ppl": 1.5, "log_ppl_diff": -0.5, "log_ppl_abs_diff": 0.5,
            "log_ppl_diff_max": -0.5, "log_ppl_diff_min": -0.5, "ppl_ratio": math.exp(-0.5),
            "chi2_token": math.e - 1, "chi2_seq": math.e - 1, "train_rollout_logprob_abs_diff": 0.5,
            "train_rollout_kl": math.exp(0.5) - 1.5}
    assert m == pytest.approx(want, rel=1e-12)


def test_one_sequence_sums_its_log_ratios_for_chi2_seq_and_averages_them_elsewhere():
    m = metrics([-1.0, -2.0, -0.5], [-1.2, -1.7, -0.5])  # δ = 0.2, −0.3, 0
    delta = [0.2, -0.3, 0.0]
    assert m["kl"] == pytest.approx(sum(-x for x in delta) / 3)
    assert m["k3_kl"] == pytest.approx(sum(math.exp(x) - 1 - x for x in delta) / 3)
    assert m["chi2_token"] == pytest.approx(sum(math.exp(2 * x) for x in delta) / 3 - 1)
    assert m["chi2_seq"] == pytest.approx(math.exp(2 * sum(delta)) - 1)
    assert m["training_ppl"] == pytest.approx(math.exp(3.5 / 3)) and m["rollout_ppl"] == pytest.approx(math.exp(3.4 / 3))
    assert m["log_ppl_diff"] == pytest.approx(-3.4 / 3 + 3.5 / 3) == m["log_ppl_diff_max"] == m["log_ppl_diff_min"]
    assert m["ppl_ratio"] == pytest.approx(math.exp(0.1 / 3))
    assert m["train_rollout_logprob_abs_diff"] == pytest.approx(0.5 / 3)


def test_verl_averages_over_tokens_where_slime_and_miles_average_over_sequences():
    # sequence 0: one token, δ = 1; sequence 1: three tokens, δ = 0
    m = metrics([-1.0, -1.0, -1.0, -1.0], [-2.0, -1.0, -1.0, -1.0], seq=[0, 1, 1, 1])
    assert m["kl"] == pytest.approx(-1 / 4)  # verl: a token mean
    assert m["k3_kl"] == pytest.approx((math.e - 2) / 4)
    assert m["chi2_token"] == pytest.approx((math.exp(2) + 3) / 4 - 1)
    assert m["train_rollout_logprob_abs_diff"] == pytest.approx(1 / 2)  # slime: per sequence, then over them
    assert m["train_rollout_kl"] == pytest.approx((math.e - 2) / 2)
    assert m["log_ppl_diff"] == pytest.approx(-1 / 2) and m["log_ppl_abs_diff"] == pytest.approx(1 / 2)
    assert (m["log_ppl_diff_max"], m["log_ppl_diff_min"]) == pytest.approx((0.0, -1.0))
    assert m["ppl_ratio"] == pytest.approx((math.exp(-1) + 1) / 2)
    assert m["training_ppl"] == pytest.approx(math.e) and m["rollout_ppl"] == pytest.approx((math.exp(2) + math.e) / 2)
    assert m["chi2_seq"] == pytest.approx((math.exp(2) + 1) / 2 - 1)


def test_log_ratios_past_the_clamps():
    up, down = metrics([-1.0], [-31.0]), metrics([-31.0], [-1.0])  # δ = +30 and −30
    assert up["k3_kl"] == pytest.approx(math.exp(30) - 31, rel=1e-12)  # verl's k3: no clamp
    assert down["k3_kl"] == pytest.approx(math.exp(-30) + 29, rel=1e-12)
    assert up["chi2_token"] == pytest.approx(math.exp(40) - 1, rel=1e-12)  # e^{2·20}: δ clamped to 20
    assert down["chi2_token"] == pytest.approx(math.exp(-40) - 1, rel=1e-12)
    assert up["train_rollout_kl"] == 10.0 and down["train_rollout_kl"] == 10.0  # miles' k3 clamped to 10
    # two tokens of δ = 15: each under the token clamp, their sum 30 over the sequence's
    m = metrics([-1.0, -1.0], [-16.0, -16.0])
    assert m["chi2_token"] == pytest.approx(math.exp(30) - 1, rel=1e-12)
    assert m["chi2_seq"] == pytest.approx(math.exp(40) - 1, rel=1e-12)
    assert m["train_rollout_kl"] == 10.0 and m["k3_kl"] == pytest.approx(math.exp(15) - 16, rel=1e-12)
    # just inside miles' clamps: δ = −5 gives e^−5 + 4 < 10, unclamped
    assert metrics([-6.0], [-1.0])["train_rollout_kl"] == pytest.approx(math.exp(-5) + 4)


def test_the_signs_a_less_confident_trainer_gives():
    m = metrics([-2.0, -3.0], [-1.0, -1.5])  # the trainer gives the engine's tokens less probability: δ < 0
    assert m["kl"] > 0 and m["log_ppl_diff"] > 0 and m["ppl_ratio"] > 1  # k1 of KL(q‖π), verl's log_ppl_diff
    assert m["training_ppl"] > m["rollout_ppl"]
    assert m["chi2_token"] < 0  # E_q[ρ²] − 1 of one sample of ρ < 1: an estimate, not the divergence
    n = metrics([-1.0, -1.5], [-2.0, -3.0])
    assert n["kl"] == -m["kl"] < 0 and n["log_ppl_diff"] < 0  # k1 may be negative
    assert min(m["k3_kl"], n["k3_kl"], m["train_rollout_kl"], n["train_rollout_kl"]) > 0  # k3 never is
    assert m["train_rollout_logprob_abs_diff"] == n["train_rollout_logprob_abs_diff"]  # slime's is symmetric


def test_the_same_log_probs_read_as_no_mismatch():
    m = metrics([-1.0, -2.0, -0.5], [-1.0, -2.0, -0.5], seq=[0, 0, 1])
    zero = ("kl", "k3_kl", "log_ppl_diff", "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "chi2_token",
            "chi2_seq", "train_rollout_logprob_abs_diff", "train_rollout_kl")
    assert {k: m[k] for k in zero} == dict.fromkeys(zero, 0.0)
    assert m["ppl_ratio"] == 1.0 and m["training_ppl"] == m["rollout_ppl"] == pytest.approx((math.exp(1.5) + math.exp(0.5)) / 2)


def test_a_sequence_without_tokens_is_in_no_sequence_mean():
    with_empty = metrics([-1.0, -1.0], [-2.0, -1.0], seq=[0, 2], num_seqs=3)
    assert with_empty == metrics([-1.0, -1.0], [-2.0, -1.0], seq=[0, 1])


def test_an_overflowed_exp_is_infinite_and_not_a_fault():
    m = metrics([-1.0], [-801.0])  # δ = 800 nats: e^δ overflows float64
    assert m["k3_kl"] == math.inf and m["chi2_token"] == pytest.approx(math.exp(40) - 1)
    row = {d.mismatch_column("lag", "k3_kl"): math.inf}
    check_finite(3, row)  # +∞ there is a value
    for bad in ({d.mismatch_column("lag", "k3_kl"): -math.inf}, {"discrepancy_mean": math.inf},
                {d.mismatch_column("lag", "k3_kl"): math.nan}):
        with pytest.raises(NonFiniteError):
            check_finite(3, bad)


def test_total_discrepancy_and_lag_read_the_engine_and_the_trainer_at_the_right_weights():
    e = torch.tensor([-1.0, -2.0, -1.5], dtype=T)  # the engine at θ_s
    a = torch.tensor([-1.1, -1.9, -1.5], dtype=T)  # the trainer at θ_s
    b = torch.tensor([-0.7, -2.4, -1.0], dtype=T)  # the trainer at θ_t
    seq = torch.tensor([0, 0, 1])
    cols = d.mismatch_parts(e, a, b, seq, 2)
    for part, trainer, engine in (("total", b, e), ("discrepancy", a, e), ("lag", b, a)):
        want = d.field_metrics(trainer, engine, seq, 2)
        assert {k: cols[d.mismatch_column(part, k)] for k in d.FIELD_METRICS} == want
    assert cols["mismatch_discrepancy_kl"] == pytest.approx((0.1 - 0.1 + 0.0) / 3)
    assert cols["mismatch_lag_kl"] == pytest.approx((-0.4 + 0.5 - 0.5) / 3)
    # the k1's add up: total = discrepancy + lag (the k3's do not)
    assert cols["mismatch_total_kl"] == pytest.approx(cols["mismatch_discrepancy_kl"] + cols["mismatch_lag_kl"])
    # a synced sampler (θ_s = θ_t): no lag, and the total is the discrepancy
    synced = d.mismatch_parts(e, a, a, seq, 2)
    assert synced["mismatch_lag_k3_kl"] == 0.0 and synced["mismatch_lag_ppl_ratio"] == 1.0
    assert all(synced[d.mismatch_column("total", k)] == synced[d.mismatch_column("discrepancy", k)] for k in d.FIELD_METRICS)


def test_the_step_row_carries_every_part_of_every_key_and_keeps_its_other_columns():
    cols = d.metric_columns("batch")
    parts = [d.mismatch_column(p, k) for p, _, _ in d.MISMATCH_PARTS for k in d.FIELD_METRICS]
    assert len(parts) == 45 and [c for c in cols if c.startswith("mismatch_")] == parts
    assert {"ess_lag", "discrepancy_mean_abs", "lag_mean_abs", "kl_sampler"} <= set(cols)
    assert all(d.may_be_inf(c) and not d.may_be_nan(c) for c in parts) and not d.may_be_inf("ess_total")
