from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcrepro.step import countdown
from dlcrepro.step.countdown import Problem, score


# ----------------------------------------------------------------------------- hand cases


@pytest.mark.parametrize(
    "response,numbers,target,want",
    [
        ("(3*5)-2", (3, 5, 2), 13, 1),
        ("3*5-2", (3, 5, 2), 13, 1),  # precedence without parentheses
        ("2-3*5", (3, 5, 2), -13, 1),
        ("(8/3)*3+1", (8, 3, 3, 1), 9, 1),  # exact rationals: 8/3*3 is 8, not 7.999…
        ("12/(5-5)", (12, 5, 5), 0, -1),  # division by zero is just wrong
        ("3*5", (3, 5, 2), 15, -1),  # a number unused
        ("3*5-2-2", (3, 5, 2), 11, -1),  # a number used twice
        ("(3*5)-2", (3, 5, 2), 14, -1),  # wrong value
        ("(3*5-2", (3, 5, 2), 13, -1),  # unbalanced
        ("-2+3*5", (3, 5, 2), 13, -1),  # no unary minus: numbers are used as given
        ("3**5", (3, 5), 243, -1),
        ("__import__('os')", (1,), 1, -1),
        ("", (1, 2), 3, -1),
        ("<answer> (1 + 2) * 3 </answer>", (1, 2, 3), 9, 1),
        ("<answer>1+2</answer> then <answer> 1*2+3 </answer>", (1, 2, 3), 5, 1),  # the last answer counts
        ("<answer> 1 + 2 + 3 = 6 </answer>", (1, 2, 3), 6, 1),
        ("<answer> 1 + 2 + 3 = 7 </answer>", (1, 2, 3), 6, -1),
        ("1 × 2 − 3 ÷ 3", (1, 2, 3, 3), 1, 1),
        ("03+4", (3, 4), 7, -1),
    ],
)
def test_score_hand_cases(response, numbers, target, want):
    assert score(response, numbers, target) == want


@pytest.mark.parametrize("three", ["\uff13", "\u0663", "\u00b3"], ids=["full-width", "arabic-indic", "superscript"])
def test_score_counts_only_ascii_digits(three):
    """int() and str.isdigit() take any Unicode digit; the reward counts the numbers as written in ASCII."""
    assert score("<answer> (3*5)-2 = 13 </answer>", (3, 5, 2), 13) == 1
    assert score(f"<answer> ({three}*5)-2 = 13 </answer>", (3, 5, 2), 13) == -1
    assert score(f"<answer> (3*5)-2 = 1{three} </answer>", (3, 5, 2), 13) == -1


def test_score_rejects_deep_nesting_without_recursion_error():
    deep = "(" * 500 + "1+2" + ")" * 500
    assert score(deep, (1, 2), 3) == -1


def test_score_rejects_huge_input_quickly():
    assert score("1+" * 100_000 + "1", (1, 1), 2) == -1


def test_evaluate_is_exact():
    value, used = countdown.evaluate("(1/3)+(2/3)")
    assert value == Fraction(1) and sorted(used) == [1, 2, 3, 3]


# ----------------------------------------------------------------------------- solver and generator


def test_solve_finds_a_correct_expression():
    expr = countdown.solve((25, 50, 75, 100), 125)
    assert expr is not None and score(expr, (25, 50, 75, 100), 125) == 1


def test_solve_reports_unsolvable():
    assert countdown.solve((1, 1), 7) is None


def test_generate_is_deterministic_distinct_and_solvable():
    a = countdown.generate(200, seed=3)
    b = countdown.generate(200, seed=3)
    assert a == b
    assert len({p.key for p in a}) == 200
    for p in a:
        assert 1 <= p.target <= 100 and all(1 <= n <= 20 for n in p.numbers)
        assert score(countdown.solve(p.numbers, p.target), p.numbers, p.target) == 1
    assert countdown.generate(200, seed=4) != a


def test_split_is_disjoint():
    train, test = countdown.split(countdown.generate(300, seed=0), 50)
    assert len(train) == 250 and len(test) == 50
    assert not {p.key for p in train} & {p.key for p in test}


def test_generate_fails_clearly_when_the_space_is_too_small():
    with pytest.raises(ValueError, match="cannot draw"):
        countdown.generate(100, seed=0, num_numbers=2, number_range=(1, 2), target_range=(1, 4))


def test_parquet_split_takes_first_rows_for_train_and_next_for_test(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    nums = [[i, i + 1, i + 2] for i in range(30)]
    targets = [3 * i + 3 for i in range(30)]
    pq.write_table(pa.table({"nums": nums, "target": targets}), tmp_path / "train-00000.parquet")
    train, test = countdown.load_parquet(tmp_path, n_train=20, n_test=5)
    assert train[0] == Problem((0, 1, 2), 3) and len(train) == 20
    assert test[0] == Problem((20, 21, 22), 63) and len(test) == 5
    with pytest.raises(ValueError, match="need n_train"):
        countdown.load_parquet(tmp_path, n_train=30, n_test=5)


def test_compact_prompt():
    assert countdown.compact_prompt(Problem((3, 5, 2), 13)) == "3,5,2=>13:"


# ----------------------------------------------------------------------------- properties

numbers_st = st.lists(st.integers(1, 30), min_size=2, max_size=4)


@settings(max_examples=60, deadline=None)
@given(numbers_st, st.integers(1, 100))
def test_solver_solutions_always_score_plus_one(numbers, target):
    expr = countdown.solve(numbers, target)
    if expr is not None:
        assert score(expr, numbers, target) == 1
        assert score(f"<answer>{expr}</answer>", numbers, target) == 1


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200), numbers_st, st.integers(-50, 200))
def test_score_never_raises_and_is_plus_or_minus_one(text, numbers, target):
    assert score(text, numbers, target) in (-1, 1)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789+-*/() ", max_size=60), numbers_st, st.integers(-50, 200))
def test_score_on_arithmetic_looking_text(text, numbers, target):
    assert score(text, numbers, target) in (-1, 1)


@settings(max_examples=60, deadline=None)
@given(numbers_st, st.integers(1, 100), st.integers(1, 30))
def test_extra_number_makes_a_solution_wrong(numbers, target, extra):
    expr = countdown.solve(numbers, target)
    if expr is not None:
        assert score(f"({expr})*{extra}", numbers, target * extra) == -1


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=2, max_size=3), st.integers(-20, 150))
def test_reachable_targets_agree_with_the_solver(numbers, target):
    assert (target in countdown.reachable_targets(numbers)) == (countdown.solve(numbers, target) is not None)


def test_working_steps_write_each_operation_innermost_first_with_its_value():
    assert countdown.working_steps("(3*5)+4") == ["3*5=15", "15+4=19"]
    assert countdown.working_steps("(2+3)*(7-4)") == ["2+3=5", "7-4=3", "5*3=15"]
    assert countdown.working_steps("3-((25+75)/50)") == ["25+75=100", "100/50=2", "3-2=1"]


def test_a_worked_answer_scores_by_its_final_equation_only():
    worked = countdown.worked_answer((3, 5, 4), 19)
    assert worked == "3*5=15, 15+4=19\n<answer>(3*5)+4</answer>"
    assert countdown.score(worked, (3, 5, 4), 19) == countdown.REWARD_CORRECT
    # right working, wrong final answer: the working earns nothing
    assert countdown.score("3*5=15, 15+4=19\n<answer>(3*5)-4</answer>", (3, 5, 4), 19) == countdown.REWARD_WRONG
    assert countdown.score("3*5=15, 15+4=19", (3, 5, 4), 19) == countdown.REWARD_WRONG
