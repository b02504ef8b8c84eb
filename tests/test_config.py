import copy
import dataclasses
import re
import shutil
import typing

import pytest
import yaml

from dlcrepro.core.config import (
    _ALIGNMENT,
    Config,
    ConfigError,
    EngineConfig,
    GridConfig,
    ModelConfig,
    Range,
    TaskConfig,
    TrackingConfig,
    TrainConfig,
    WarmstartConfig,
    build,
    literal_choices,
    load,
)
from dlcrepro.core.paths import model_dir, resolve_dataset_path, resolve_local
from conftest import ROOT, SMOKE, cache_repo

SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"


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


@pytest.mark.parametrize(
    "overrides,says",
    [
        ({"task": 3}, "task: expected a mapping, got int"),
        ({"task.number_range": [1, 2, 3]}, "task.number_range: expected a pair [low, high], got [1, 2, 3]"),
        ({"task.number_range": [1, "x"]}, "task.number_range[1]: expected int, got 'x'"),
        ({"task.source": "parquet"}, "task.path is required when task.source is 'parquet'"),
        ({"models.tiny.kind": "hf"}, "models.tiny.path is required for kind 'hf'"),
        ({"train.eval_on": "pool", "train.pool_size": 0}, "train.eval_on='pool' needs train.pool_size >= 1"),
        ({"train.pool_size": 10**6}, "train.pool_size=1000000: must be in [0, task.n_train="),
        ({"grid.models": ["huge"]}, "grid.models: unknown model 'huge'; known: ['tiny']"),
        ({"tracking.backends": ["csv", "csv"]}, "tracking.backends: expected a list of distinct names, got ['csv', 'csv']"),
    ],
    ids=["section-not-a-mapping", "pair-of-three", "pair-item-not-int", "parquet-without-path", "hf-without-path",
         "pool-eval-without-pool", "pool-above-n-train", "unknown-model", "repeated-backend"],
)
def test_a_config_that_cannot_work_is_refused_naming_the_key(overrides, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        load(SMOKE, overrides)


def test_a_base_that_is_not_a_path_is_refused(tmp_path):
    (tmp_path / "overlay.yaml").write_text("base: 7\nname: overlay\n")
    with pytest.raises(ConfigError, match="base: expected the path of a config file, got 7"):
        load(tmp_path / "overlay.yaml")


def test_engine_topk_is_required_by_corrections_that_read_the_engine_distribution():
    with pytest.raises(ConfigError, match=r"engine\.topk=0: \['dlc'\]"):
        load(SMOKE, {"engine.topk": 0, "grid.corrections": ["pg", "dlc"]})
    assert load(SMOKE, {"engine.topk": 0, "grid.corrections": ["pg", "is"]}).engine.topk == 0


def test_eval_every_must_be_a_multiple_of_probe_every():
    with pytest.raises(ConfigError, match="eval_every"):
        load(SMOKE, {"train.probe_every": 3, "train.eval_every": 4})


# ----------------------------------------------------------------------------- numeric ranges


def _numeric_keys(cls=Config, prefix=""):
    """(dotted key, field) of every numeric field, a model's under `models.*`."""
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        if dataclasses.is_dataclass(f.default_factory):
            yield from _numeric_keys(f.default_factory, key + ".")
        elif cls is Config and f.name == "models":
            yield from _numeric_keys(ModelConfig, "models.*.")
        elif re.search(r"\b(int|float)\b", f.type):
            yield key, f


RANGED = {key: f for key, f in _numeric_keys() if "range" in f.metadata}


def _outside(key):
    """(value, whether JSON schema can refuse it): config values of `key` just outside each bound of
    its range, and for a pair the pair inverted (low <= high is beyond JSON schema)."""
    f, rng = RANGED[key], RANGED[key].metadata["range"]
    bad = [b - 1 for b in (rng.ge,) if b is not None] + [b for b in (rng.gt, rng.lt) if b is not None]
    bad += [b + 1 for b in (rng.le,) if b is not None]
    for v in bad:
        if f.type.startswith("tuple"):
            yield [v, f.default[1]], True
        elif f.type.startswith("list[list"):
            yield [[v]], True
        elif f.type.startswith("list"):
            yield [v], True
        else:
            yield v, True
    if rng.pair:
        yield list(f.default[::-1]), False


OUTSIDE = [(key.replace("*", "tiny"), v, in_schema) for key in RANGED for v, in_schema in _outside(key)]


def _set(data, dotted, value):
    node = data
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return data


def _schema_node(schema, key):
    """The schema of `key`'s value (of its innermost items, for a list or pair)."""
    node = schema
    for part in key.split("."):
        node = node["additionalProperties"] if part == "*" else node["properties"][part]
    while "items" in node:
        node = node["items"]
    return node


def _schema_bounds(node, key=""):
    """{dotted key: its bounds} for every numeric bound anywhere in the schema."""
    out = {}
    bounds = {k: node[k] for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum") if k in node}
    if bounds:
        out[key] = bounds
    for name, sub in node.get("properties", {}).items():
        out |= _schema_bounds(sub, f"{key}.{name}".lstrip("."))
    if isinstance(node.get("additionalProperties"), dict):
        out |= _schema_bounds(node["additionalProperties"], f"{key}.*")
    if "items" in node:
        out |= _schema_bounds(node["items"], key)
    return out


def _as_schema(rng: Range) -> dict:
    names = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}
    return {names[k]: getattr(rng, k) for k in names if getattr(rng, k) is not None}


def test_every_numeric_key_has_a_range():
    unranged = [key for key, f in _numeric_keys() if "range" not in f.metadata and key.removeprefix("engine.") not in _ALIGNMENT]
    assert unranged == []


def test_the_workflow_schema_has_the_config_ranges():
    """The ranges are given once, in dlcrepro/core/config.py; the schema's copy must say the same."""
    schema = yaml.safe_load(SCHEMA.read_text())
    want = {key: _as_schema(f.metadata["range"]) for key, f in RANGED.items()}
    assert _schema_bounds(schema) == {k: v for k, v in want.items() if v}
    for key, f in RANGED.items():
        assert _schema_node(schema, key)["type"] == ("number" if "float" in f.type else "integer"), key
    for key, value in _ALIGNMENT.items():
        assert _schema_node(schema, f"engine.{key}")["const"] == value, key
    assert _schema_node(schema, "models.*.train")["$ref"] == "#/properties/train"  # a model's overrides: the same bounds


@pytest.mark.parametrize("key,value,in_schema", OUTSIDE)
def test_a_number_outside_its_range_is_refused_naming_the_key(key, value, in_schema):
    with pytest.raises(ConfigError, match=re.escape(key) + r"[=\[:]") as e:
        load(SMOKE, {key: value})
    assert "must be" in str(e.value)


@pytest.mark.parametrize("key,value,in_schema", OUTSIDE)
def test_the_workflow_refuses_a_number_outside_its_range_naming_the_key(key, value, in_schema):
    """Snakemake checks the schema, then builds the typed config (workflow/rules/common.smk): a
    bound fails in the first, an inverted pair (which JSON schema cannot say) in the second."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    data = _set(yaml.safe_load(SMOKE.read_text()), key, copy.deepcopy(value))
    if not in_schema:
        validate(copy.deepcopy(data), str(SCHEMA))
        with pytest.raises(ConfigError, match=re.escape(key) + "="):
            build(data)
        return
    path = "".join(f"['{p}']" for p in key.split("."))
    with pytest.raises(WorkflowError, match=re.escape(f"On instance{path}")):
        validate(data, str(SCHEMA))


def test_a_per_model_train_override_is_range_checked_at_both_doors():
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    with pytest.raises(ConfigError, match=r"models\.tiny\.train\.probe_every=0: must be >= 1"):
        load(SMOKE, {"models.tiny.train": {"probe_every": 0}})
    with pytest.raises(WorkflowError, match=re.escape("On instance['models']['tiny']['train']['probe_every']")):
        validate(_set(yaml.safe_load(SMOKE.read_text()), "models.tiny.train", {"probe_every": 0}), str(SCHEMA))


@pytest.mark.parametrize(
    "value,message", [(float("inf"), "a finite number > 0"), (float("nan"), "a finite number > 0"), (True, "expected float")]
)
def test_a_number_that_is_not_finite_or_not_a_number_is_refused(value, message):
    with pytest.raises(ConfigError, match=f"train.lr.*{message}"):
        load(SMOKE, {"train.lr": value})


def test_an_exponent_yaml_reads_as_text_is_refused_saying_how_to_write_it(tmp_path):
    """`lr: 1e-3` is a string to YAML 1.1 (PyYAML, Snakemake): `config.load`'s error names the key
    and the fix (in the workflow the schema check refuses it first, naming the key)."""
    cfg, data = tmp_path / "c.yaml", yaml.safe_load(SMOKE.read_text())
    data["train"]["lr"] = "PLACEHOLDER"
    cfg.write_text(yaml.safe_dump(data).replace("PLACEHOLDER", "1e-3"))
    with pytest.raises(ConfigError,
                       match=re.escape("train.lr: expected float, got '1e-3' (YAML reads 1e-3 as text: write 1.0e-3)")):
        load(cfg)
    cfg.write_text(yaml.safe_dump(data).replace("PLACEHOLDER", "2e2"))  # no sign: text too
    with pytest.raises(ConfigError, match=re.escape("write 2.0e+2")):
        load(cfg)
    cfg.write_text(yaml.safe_dump(data).replace("PLACEHOLDER", "1.0e-3"))
    assert load(cfg).train.lr == 1e-3


def test_per_model_train_overrides():
    cfg = load(SMOKE, {"models.tiny.train": {"lr": 0.05}})
    assert cfg.train_for("tiny").lr == 0.05 and cfg.train.lr == 0.3


def test_shipped_configs_load(monkeypatch):
    monkeypatch.chdir(ROOT)  # an overlay's `base` is a path from the repository root
    shipped = sorted((ROOT / "configs").rglob("*.yaml"))
    assert {"tiny.yaml", "paper.yaml", "heldout_worked.yaml"} <= {p.name for p in shipped}
    for path in shipped:
        load(path)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "nope.yaml")


def test_hf_model_missing_from_cache_says_how_to_fetch_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    cfg = load(ROOT / "configs" / "paper.yaml")
    with pytest.raises(ConfigError,
                       match=r"models\.qwen3-0\.6b\.path='Qwen/Qwen3-0\.6B'.*huggingface-cli download Qwen/Qwen3-0\.6B"):
        model_dir(cfg, "qwen3-0.6b")


def test_hf_model_and_dataset_found_in_the_cache(tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    snap = hub / "models--Qwen--Qwen3-0.6B" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    data = hub / "datasets--Jiayi-Pan--Countdown-Tasks-3to4" / "snapshots" / "def456"
    data.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    cfg = load(ROOT / "configs" / "paper.yaml")
    assert model_dir(cfg, "qwen3-0.6b") == snap
    assert resolve_dataset_path(cfg.task.path) == data


QWEN = "Qwen/Qwen3-0.6B"
QWEN_REPO = "models--Qwen--Qwen3-0.6B"
OLD, NEW = "f" * 40, "1" * 40  # the newer download's commit sorts first


def test_refs_main_chooses_the_snapshot(tmp_path, monkeypatch):
    """A cache that fetched main twice keeps the old snapshot; refs/main names the one fetched last."""
    cache_repo(tmp_path, QWEN_REPO, {"config.json": b"{}"}, commit=OLD)
    new = cache_repo(tmp_path, QWEN_REPO, {"config.json": b"{}"}, commit=NEW)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert resolve_local(QWEN, "model", "models.m.path") == new


def test_without_refs_main_several_snapshots_are_an_error_naming_them(tmp_path, monkeypatch):
    for commit in (OLD, NEW):
        cache_repo(tmp_path, QWEN_REPO, {"config.json": b"{}"}, commit=commit, ref=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match=f"no refs/main and 2 snapshots \\({NEW}, {OLD}\\).*huggingface-cli download {QWEN}"):
        resolve_local(QWEN, "model", "models.m.path")


def test_a_snapshot_still_being_laid_out_is_not_one(tmp_path, monkeypatch):
    """rehearsal.write_snapshot builds snapshots/.<commit>.tmp, then renames it and writes refs/main."""
    snap = cache_repo(tmp_path, QWEN_REPO, {"config.json": b"{}"}, commit=OLD, ref=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    (snap.parent / f".{NEW}.tmp").mkdir()
    assert resolve_local(QWEN, "model", "models.m.path") == snap
    shutil.rmtree(snap)
    with pytest.raises(ConfigError, match="not in the Hugging Face cache"):
        resolve_local(QWEN, "model", "models.m.path")


def test_refs_main_naming_a_missing_snapshot_is_an_interrupted_download(tmp_path, monkeypatch):
    repo = cache_repo(tmp_path, QWEN_REPO, {"config.json": b"{}"}, commit=OLD).parents[1]
    (repo / "refs" / "main").write_text(NEW + "\n")  # the ref is written before the files arrive
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match=f"names commit {NEW}, but .* has no such snapshot \\(has: {OLD}\\)"):
        resolve_local(QWEN, "model", "models.m.path")


def test_missing_dataset_says_how_to_fetch_it(tmp_path, monkeypatch):
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
    from dlcrepro.step import data
    from dlcrepro.step.countdown import Problem
    from dlcrepro.step.model import build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = QWEN3_STYLE_TEMPLATE
    text = data.prompt_text(tok, Problem((3, 7, 25), 46), "chat")
    assert text.startswith("<|im_start|>user\nUsing the numbers [3, 7, 25], create an equation that equals 46.")
    assert "<answer>" in text and text.endswith("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # the template's own markers are the only special text: the tokenizer adds none (no BOS/EOS)
    ids = data.encode_prompts(tok, [Problem((3, 7, 25), 46)], "chat")[0]
    assert ids == tok(text, add_special_tokens=False).input_ids and tok.eos_token_id not in ids


SECTIONS = {  # the schema's node of each config dataclass
    (): Config,
    ("task",): TaskConfig,
    ("engine",): EngineConfig,
    ("train",): TrainConfig,
    ("grid",): GridConfig,
    ("models", "*"): ModelConfig,
    ("models", "*", "warmstart"): WarmstartConfig,
    ("tracking",): TrackingConfig,
}


@pytest.mark.parametrize("path", list(SECTIONS), ids=lambda p: ".".join(p) or "top")
def test_schema_and_dataclasses_have_the_same_keys_and_choices(path):
    """Every field of a config dataclass is a key of the schema's section and the other way round,
    and a `Literal` field's choices are the schema's enum: the two cannot drift apart."""
    cls = SECTIONS[path]
    node = yaml.safe_load(SCHEMA.read_text())
    for part in path:
        node = node["additionalProperties"] if part == "*" else node["properties"][part]
    fields = {f.name for f in dataclasses.fields(cls)}
    assert set(node["properties"]) == fields, (sorted(fields - set(node["properties"])), sorted(set(node["properties"]) - fields))
    hints = typing.get_type_hints(cls)
    for name in fields:
        choices = literal_choices(hints[name])
        if choices is not None:
            assert sorted(node["properties"][name]["enum"]) == sorted(choices), name


def test_an_overlay_stands_on_its_own_through_its_base(tmp_path, monkeypatch):
    """configs/zoo.yaml names configs/tiny.yaml as its base: alone or after tiny.yaml it is the same
    config; a missing base or a cycle is an error naming the file."""
    from dlcrepro.core.config import read_layers

    monkeypatch.chdir(ROOT)
    alone, layered = read_layers(["configs/zoo.yaml"]), read_layers(["configs/tiny.yaml", "configs/zoo.yaml"])
    assert alone == layered and "base" not in alone
    cfg = load(ROOT / "configs" / "zoo.yaml")
    tiny = load(ROOT / "configs" / "tiny.yaml")
    assert len(cfg.grid.corrections) == 16 and cfg.train == tiny.train and cfg.committed_tables_dir == "paper_tables/zoo"
    assert cfg.tables_dir == "results/zoo/paper_tables" and tiny.tables_dir == ""  # a run writes under results/
    assert load(ROOT / "configs" / "replicate.yaml").grid.seeds == [0, 1, 2, 3, 4, 5]
    # two overlays: merged first, the base laid under them once (as the Snakefile does)
    both = read_layers(["configs/zoo.yaml", "configs/replicate.yaml"])
    assert len(both["grid"]["corrections"]) == 16 and both["grid"]["seeds"] == [0, 1, 2, 3, 4, 5]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match=r"base: b.yaml is its own base \(b.yaml -> a.yaml -> b.yaml\)"):
        read_layers(["a.yaml"])
    (tmp_path / "c.yaml").write_text("base: configs/nope.yaml\n")
    with pytest.raises(ConfigError, match="base: config file configs/nope.yaml does not exist"):
        read_layers(["c.yaml"])


def test_a_rejection_band_that_keeps_nothing_is_refused():
    with pytest.raises(ConfigError, match=r"train.behav_weight_low=6 is above train.behav_weight_cap=5.0: the band keeps"):
        load(SMOKE, {"train.behav_weight_low": 6})
    # seq_tis's and seq_mis's truncation C_seq is no end of seq_mis's band (verl's rollout_is_threshold)
    assert load(SMOKE, {"train.seq_clip_c": 0.5, "train.seq_mis_low": 0.9}).train.seq_mis_high == 2.0
