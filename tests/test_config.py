import pytest

from dlcrepro.config import ConfigError, load
from conftest import ROOT, SMOKE


@pytest.mark.parametrize(
    "key,value",
    [
        ("engine.top_p", 0.9),
        ("engine.top_k", 50),
        ("engine.temperature", 0.7),
        ("engine.min_p", 0.05),
        ("engine.repetition_penalty", 1.1),
        ("engine.retokenize", True),
        ("engine.filter_by_reward", True),
    ],
)
def test_alignment_breaking_values_are_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load(SMOKE, {key: value})


def test_unknown_key_is_refused_with_the_known_ones():
    with pytest.raises(ConfigError, match=r"train: unknown key\(s\) \['lrr'\]"):
        load(SMOKE, {"train.lrr": 0.1})


def test_unknown_grid_values_name_the_allowed_ones():
    with pytest.raises(ConfigError, match="unknown correction 'dlcc'.*known"):
        load(SMOKE, {"grid.corrections": ["dlcc"]})
    with pytest.raises(ConfigError, match="unknown sampler 'fp4'"):
        load(SMOKE, {"grid.samplers": ["fp4"]})


def test_engine_topk_is_required_by_corrections_that_read_the_engine_distribution():
    with pytest.raises(ConfigError, match=r"engine\.topk=0: \['dlc'\]"):
        load(SMOKE, {"engine.topk": 0, "grid.corrections": ["pg", "dlc"]})
    assert load(SMOKE, {"engine.topk": 0, "grid.corrections": ["pg", "is"]}).engine.topk == 0


def test_eval_every_must_be_a_multiple_of_probe_every():
    with pytest.raises(ConfigError, match="eval_every"):
        load(SMOKE, {"train.probe_every": 3, "train.eval_every": 4})


def test_per_model_train_overrides():
    cfg = load(SMOKE, {"models.tiny.train": {"lr": 0.05}})
    assert cfg.train_for("tiny").lr == 0.05 and cfg.train.lr == 0.3


def test_shipped_configs_load():
    for name in ("tiny", "smoke", "paper"):
        load(ROOT / "configs" / f"{name}.yaml")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "nope.yaml")


def test_hf_model_missing_from_cache_says_how_to_fetch_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    cfg = load(ROOT / "configs" / "paper.yaml")
    with pytest.raises(ConfigError, match=r"models\.qwen3-0\.6b\.path='Qwen/Qwen3-0\.6B'.*huggingface-cli download Qwen/Qwen3-0\.6B"):
        cfg.model_dir("qwen3-0.6b")


def test_hf_model_and_dataset_found_in_the_cache(tmp_path, monkeypatch):
    from dlcrepro.data import resolve_dataset_path

    hub = tmp_path / "hub"
    snap = hub / "models--Qwen--Qwen3-0.6B" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    data = hub / "datasets--Jiayi-Pan--Countdown-Tasks-3to4" / "snapshots" / "def456"
    data.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    cfg = load(ROOT / "configs" / "paper.yaml")
    assert cfg.model_dir("qwen3-0.6b") == snap
    assert resolve_dataset_path(cfg.task.path) == data


def test_missing_dataset_says_how_to_fetch_it(tmp_path, monkeypatch):
    from dlcrepro.data import resolve_dataset_path

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match="--repo-type dataset Jiayi-Pan/Countdown-Tasks-3to4"):
        resolve_dataset_path("Jiayi-Pan/Countdown-Tasks-3to4")


# The generation-prompt part of Qwen3's chat template (ChatML turns; with thinking disabled the
# template itself closes an empty <think> block).
QWEN3_STYLE_TEMPLATE = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def test_chat_prompt_is_the_instruction_through_the_template_with_thinking_disabled():
    from dlcrepro import data
    from dlcrepro.countdown import Problem
    from dlcrepro.model import build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = QWEN3_STYLE_TEMPLATE
    text = data.prompt_text(tok, Problem((3, 7, 25), 46), "chat")
    assert text.startswith("<|im_start|>user\nUsing the numbers [3, 7, 25], create an equation that equals 46.")
    assert "<answer>" in text and text.endswith("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # the template's own markers are the only special text: the tokenizer adds none (no BOS/EOS)
    ids = data.encode_prompts(tok, [Problem((3, 7, 25), 46)], "chat")[0]
    assert ids == tok(text, add_special_tokens=False).input_ids and tok.eos_token_id not in ids
