"""The paper's numbers have one home (dlcrepro/report/paper.py); the tables, figures, findings and scan print
them from there, and nothing reads a number back out of the text they print."""

import math

from dlcrepro.report import figures as G
from dlcrepro.report import findings as F
from dlcrepro.report import paper as P
from dlcrepro.report import tables as T


def test_a_multiple_prints_as_the_paper_states_it():
    assert P.multiple_text(("fp8", "pg")) == "13x (F3)" and P.multiple_text(("stale", "is_center")) == "2.1x (F6)"
    assert P.multiple_text(("stale", "dlc")) == "<=2x; 0.6B: 1.9x (F8)" and P.multiple_text(("bf16", "pg")) == ""


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
    assert [P.accuracy_text(c) for c in P.ACCURACY] == ["46.5 % (F4)", "12.2 % (F5)", "32.0 % (F6)"]
