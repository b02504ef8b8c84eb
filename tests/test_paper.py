"""The paper's numbers have one home (dlcrepro/report/paper.py); the tables, figures, findings and scan print
them from there, and nothing reads a number back out of the text they print."""

import math

from dlcrepro.report import figures as G
from dlcrepro.report import findings as F
from dlcrepro.report import formats
from dlcrepro.report import paper as P
from dlcrepro.report import tables as T


def test_a_multiple_prints_as_the_paper_states_it():
    assert formats.paper_multiple(("fp8", "pg")) == "13x (F3)" and formats.paper_multiple(("stale", "is_center")) == "2.1x (F6)"
    assert formats.paper_multiple(("stale", "dlc")) == "<=2x; 0.6B: 1.9x (F8)" and formats.paper_multiple(("bf16", "pg")) == ""


def test_f8s_bound_prints_in_the_table_and_the_finding_from_one_home():
    assert formats.paper_multiple_short(("stale", "dlc")) == "<=2x (0.6B 1.9x)" == F.FINDINGS[
        [f.id for f in F.FINDINGS].index("F8")].paper
    assert formats.paper_multiple_short(("fp8", "pg")) == "13x"


def test_f11s_shares_print_in_the_table_and_the_finding_from_one_home():
    assert formats.paper_off_support() == "90 %, <=14 %, <=11 %"
    assert T.PAPER_OFF_SUPPORT == {"without": "~90 % at collapse, <=14 % before (F11)",
                                   "with": "<=11 % through step 40 (F11)"}
    assert next(f for f in F.FINDINGS if f.id == "F11").paper == formats.paper_off_support()


def test_a_bound_is_no_point_multiple_but_keeps_its_models_number():
    assert math.isnan(P.MULTIPLE["stale", "dlc"].point) and P.MULTIPLE["stale", "dlc"].value == 1.9
    assert P.MULTIPLE["stale", "is"].point == 115


def test_figures_and_findings_read_the_same_multiples():
    assert G.PAPER_M == {cell: m.value for cell, m in P.MULTIPLE.items()}
    by_id = {f.id: f for f in F.FINDINGS}
    assert by_id["F3"].paper_value == P.MULTIPLE["fp8", "pg"].value and by_id["F3"].paper == "PG 13x"
    assert by_id["F8"].paper == "<=2x (0.6B 1.9x)" and by_id["F10"].paper == "115x -> 2.6x"


def test_f2s_crossings_are_one_pair_of_numbers():
    f2 = next(f for f in F.FINDINGS if f.id == "F2")
    assert f2.paper == "11 vs 14 (1.7B)" and f2.paper_value == -3.0 and f2.derived.startswith("derived")
    assert [step for step, _ in G.PAPER_ESS_CROSSINGS] == [P.F2_ESS_CROSSING, P.F2_GAUSSIAN_CROSSING] == [11, 14]
    assert T.PAPER_ESS == "1.7B: ESS 11, Gaussian 14, IS leaves floor 11 (F2)"


def test_accuracies_print_to_a_tenth_of_a_point():
    assert [formats.paper_accuracy(c) for c in P.ACCURACY] == ["46.5 % (F4)", "12.2 % (F5)", "32.0 % (F6)"]
    assert formats.paper_accuracy(("bf16", "pg")) == "" and formats.paper_multiple_accuracy(("stale", "center")) == "32x, 12.2 %"


def test_a_share_prints_as_a_percentage_with_or_without_its_interval():
    assert formats.pct(0.465) == "46.5 %" and formats.pct(0.9, 0) == "90 %"
    assert formats.pct_interval(0.465, 0.401, 0.529) == "46.5 % [40.1, 52.9]"
    assert formats.pct_interval(float("nan"), 0.1, 0.2) == "n/a"
    assert formats.signed(2.7) == "+2.7" and formats.signed(-1.2) == "-1.2" and formats.signed(float("nan")) == "n/a"
    assert formats.fixed(31.44, 1, sign=True) == "+31.4" and formats.significant(0.0612, sign=True) == "+0.0612"
