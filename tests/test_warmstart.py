import math

import pytest

from dlcrepro.core.config import ConfigError, load
from dlcrepro.study.warmstart import lr_factor


def test_lr_schedule_warms_up_linearly_then_follows_the_cosine_to_lr_final():
    assert lr_factor(0, 0.0, 0.1, 50) == pytest.approx(1 / 50)
    assert lr_factor(24, 0.0, 0.1, 50) == pytest.approx(25 / 50)
    assert lr_factor(49, 0.0, 0.1, 50) == pytest.approx(1.0)
    assert lr_factor(500, 0.5, 0.1, 50) == pytest.approx(0.55)  # half way down the cosine
    assert lr_factor(900, 1.0, 0.1, 50) == pytest.approx(0.1)
    assert lr_factor(0, 0.0, 0.1, 0) == 1.0  # no warm-up
    # the warm-up scales the cosine: a budget that runs out during warm-up still ends at lr_final x ramp
    assert lr_factor(9, 1.0, 0.1, 50) == pytest.approx(0.1 * 10 / 50)
    assert all(math.isfinite(lr_factor(s, s / 100, 0.0, 10)) for s in range(101))


def test_warmup_steps_is_a_typed_config_key(tmp_path):
    from conftest import ROOT

    cfg = load(ROOT / "configs" / "tiny.yaml")
    assert cfg.models["tiny"].warmstart.warmup_steps >= 0
    with pytest.raises(ConfigError, match="warmup_steps"):
        load(ROOT / "configs" / "tiny.yaml", {"models.tiny.warmstart.warmup_steps": "fifty"})


def test_the_worked_format_round_trips_through_the_tiny_tokenizer_and_scores_plus_one():
    """The tiny model can write what its warm start teaches: every character of a worked answer
    has an id of its own (no <unk>), the text decodes unchanged, and it scores +1. The expression
    format's tokenizer is the one it was before the worked format existed: 24 entries, its unused
    ids decoding to nothing, so the committed study's rewards do not change."""
    from dlcrepro.step import countdown
    from dlcrepro.step.countdown import Problem
    from dlcrepro.step.model import build_tokenizer
    from dlcrepro.study.warmstart import answer_text

    tok = build_tokenizer("worked")
    assert len(tok) == 32  # the tiny arch's vocab_size
    p = Problem(numbers=(10, 15, 12), target=13)
    worked = answer_text(p, "worked")
    assert worked == "10+15=25, 25-12=13\n<answer>(10+15)-12</answer>"
    ids = tok(worked, add_special_tokens=False).input_ids
    assert tok.unk_token_id not in ids and tok.decode(ids) == worked
    assert countdown.score(worked, p.numbers, p.target) == countdown.REWARD_CORRECT
    assert answer_text(p, "expression") == "(10+15)-12"
    assert tok("0123456789+-*/()=,>: ", add_special_tokens=False).input_ids == list(range(3, 24))
    expression = build_tokenizer()
    assert len(expression) == 24 and expression.decode([6, 24, 7, 31]) == "34"
