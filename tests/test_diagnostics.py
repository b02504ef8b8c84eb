import math

import pytest
import torch

from dlcrepro.step import diagnostics as d
from dlcrepro.study.celldir import summarize
from dlcrepro.step.learner import advantages
from dlcrepro.step.train import Cell


def test_ess_of_equal_weights_is_one():
    assert math.isclose(d.ess(torch.zeros(10)), 1.0)


def test_ess_hand_case():
    # w = [1, 3]: (4)^2 / (2 * 10) = 0.8
    assert math.isclose(d.ess(torch.log(torch.tensor([1.0, 3.0], dtype=torch.float64))), 0.8, rel_tol=1e-12)


def test_ess_is_scale_free_and_does_not_overflow():
    lw = torch.tensor([1000.0, 1000.0 + math.log(3)], dtype=torch.float64)
    assert math.isclose(d.ess(lw), 0.8, rel_tol=1e-9)


def test_gaussian_ess_prediction():
    lag = torch.tensor([-1.0, 1.0])  # variance 1
    assert math.isclose(d.ess_gauss(lag), math.exp(-1), rel_tol=1e-12)


def test_sequence_ess_uses_summed_lags():
    lag = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    seq = torch.tensor([0, 0, 1, 1])
    m = d.mismatch_metrics(torch.zeros(4), torch.zeros(4), lag.float(), seq, 2)
    w = torch.tensor([math.e, 1.0])
    assert math.isclose(m["ess_lag_seq"], float(w.sum() ** 2 / (2 * (w * w).sum())), rel_tol=1e-6)


def test_kl_rows_hand_case():
    p = torch.log(torch.tensor([[0.5, 0.5]]))
    q = torch.log(torch.tensor([[0.25, 0.75]]))
    want = 0.5 * math.log(2) + 0.5 * math.log(0.5 / 0.75)
    assert math.isclose(float(d.kl_rows(p, q)[0]), want, rel_tol=1e-6)


def test_off_support_share():
    logp0 = torch.log(torch.tensor([1e-4, 0.5, 2e-3, 1e-5]))
    assert d.off_support_share(logp0, 1e-3) == 0.5


def test_dev_ratio_is_nan_on_zero_floor():
    assert math.isnan(d.dev_ratio(3.0, 0.0)) and d.dev_ratio(3.0, 1.5) == 2.0


def test_advantage_is_reward_minus_group_mean():
    r = torch.tensor([1.0, -1.0, -1.0, -1.0, 1.0, 1.0])
    g = torch.tensor([0, 0, 0, 1, 1, 1])
    assert torch.allclose(advantages(r, g, 2), torch.tensor([4 / 3, -2 / 3, -2 / 3, -4 / 3, 2 / 3, 2 / 3]))


def test_summary_multiple_is_nan_when_every_floor_is_zero():
    rows = [dict(step=k, dev=1.0, floor=0.0, dev_ratio=float("nan"), ess_lag=1.0, ess_lag_gauss=1.0,
                 test_accuracy=0.1) for k in (1, 2)]
    s = summarize(rows, Cell(), {}, {})
    assert math.isnan(s["noise_floor_multiple"])


def test_summary_multiple_is_ratio_of_sums_and_crossings_are_first_steps():
    nan = float("nan")
    rows = [
        dict(step=1, dev=1.0, floor=1.0, dev_ratio=1.0, ess_lag=0.9, ess_lag_presync=nan, ess_lag_gauss=0.6, test_accuracy=nan),
        dict(step=2, dev=5.0, floor=0.0, dev_ratio=nan, ess_lag=1.0, ess_lag_presync=0.4, ess_lag_gauss=0.3, test_accuracy=0.2),
        dict(step=3, dev=3.0, floor=1.0, dev_ratio=3.0, ess_lag=0.3, ess_lag_presync=nan, ess_lag_gauss=0.2, test_accuracy=0.1),
    ]
    s = summarize(rows, Cell(), {}, {})
    assert s["noise_floor_multiple"] == 4.0 / 2.0  # step 2's floor is 0: its dev adds nothing
    assert s["ess_crossing_step"] == 2 and s["ess_gauss_crossing_step"] == 2  # step 2's fresh batch, before its resync
    assert s["leave_floor_step"] is None  # moving averages 1, 1, 2
    assert s["final_test_accuracy"] == 0.1


def test_squared_distance_sliced_equals_whole_in_float64():
    g = torch.Generator().manual_seed(0)
    g1, g2 = torch.randn(10_001, generator=g), torch.randn(10_001, generator=g) * 1e-3
    whole = float(((g1.double() - g2.double()) ** 2).sum())
    assert d.squared_distance(g1, g2, chunk=97) == pytest.approx(whole, rel=1e-12)
    assert d.squared_distance(g1, g1) == 0.0
