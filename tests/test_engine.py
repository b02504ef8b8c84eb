"""The real vLLM-CPU engine on the tiny model: no mock anywhere."""

import json
import re

import pytest
import torch

from conftest import SMOKE
from dlcrepro.step import data
from dlcrepro.step.engine import SyncCheckError, VLLMEngine, linear_kernel
from dlcrepro.core.grid import SAMPLERS, get_sampler
from dlcrepro.step.model import build_tiny_model, load_model, load_tokenizer, make_token_batch, response_logits, token_logprobs

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def setup(tiny_model_dir, smoke_cfg):
    tok = load_tokenizer(tiny_model_dir)
    train, _ = data.load_problems(smoke_cfg.task)
    prompts = data.encode_prompts(tok, train[:16], "compact")
    model = load_model(tiny_model_dir).eval()
    bf16 = VLLMEngine(str(tiny_model_dir), smoke_cfg.engine, "bf16", seed=0, max_model_len=64)
    fp8 = VLLMEngine(str(tiny_model_dir), smoke_cfg.engine, "fp8", seed=0, max_model_len=64)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    bf16.load_weights(state, 0)
    fp8.load_weights(state, 0)
    return dict(tok=tok, prompts=prompts, model=model, bf16=bf16, fp8=fp8, state=state)


def scored_logp(model, prompts, responses):
    """The trainer's `(N,)` log-probs of the responses' tokens."""
    tb = make_token_batch(prompts, responses)
    with torch.no_grad():
        return token_logprobs(response_logits(model, tb), tb.tokens)


def trainer_logp(model, rollout):
    return scored_logp(model, rollout.prompt_ids, rollout.response_ids)


def test_engine_logprobs_match_trainer_within_bf16_tolerance_but_not_exactly(setup):
    r = setup["bf16"].generate(setup["prompts"], 8, seed=1)
    a = trainer_logp(setup["model"], r)
    delta = a - r.engine_logp
    assert len(r.response_ids) == 16 * 8 and r.engine_logp.shape == a.shape
    assert delta.abs().mean() < 0.05  # BF16 rounding of a ~0.8 M-parameter model
    assert delta.abs().max() > 0  # the discrepancy is real


def test_fp8_discrepancy_exceeds_bf16(setup):
    deltas = {}
    for name in ("bf16", "fp8"):
        r = setup[name].generate(setup["prompts"], 8, seed=2)
        deltas[name] = float((trainer_logp(setup["model"], r) - r.engine_logp).abs().mean())
    assert deltas["fp8"] > 1.5 * deltas["bf16"], deltas


def test_sample_command_reports_each_sampler_at_the_models_weights(tiny_model_dir, capsys):
    """`python -m dlcrepro sample`: one batch per sampler, scored by the trainer. At θ_0 a stale
    sampler has no lag, so it draws what its precision's fresh sampler draws (one engine per
    precision, one seed): the same numbers. FP8 sits further from the trainer than BF16."""
    from dlcrepro.run.cli import main

    assert main(["sample", "--config", str(SMOKE), "--model-dir", str(tiny_model_dir), "--prompts", "8", "--n", "4", "--seed",
                 "3"]) == 0
    rows = {r["sampler"]: r for r in json.loads(capsys.readouterr().out)}
    assert list(rows) == list(SAMPLERS)
    for r in rows.values():
        assert r["responses"] == 8 * 4 and r["tokens"] >= r["responses"]
        assert -1 <= r["reward_mean"] <= 1 and r["discrepancy_mean_abs"] > 0  # rewards are ±1
    assert rows["stale"] | {"sampler": "bf16"} == rows["bf16"]
    assert rows["fp8_stale"] | {"sampler": "fp8"} == rows["fp8"]
    assert rows["fp8"]["discrepancy_mean_abs"] > rows["bf16"]["discrepancy_mean_abs"], rows


def test_teacher_forced_logprobs_are_the_sampled_ones(setup):
    """Scoring given responses in one prefill gives the log-probs the engine reported while
    sampling them: what lets two engines be compared on the same sequences."""
    for engine in (setup["bf16"], setup["fp8"]):
        r = engine.generate(setup["prompts"][:4], 4, seed=2)
        forced = engine.teacher_forced_logp(r.prompt_ids, r.response_ids)
        assert [len(f) for f in forced] == [len(x) for x in r.response_ids]
        assert torch.allclose(torch.cat(forced), r.engine_logp, atol=1e-4)


def test_same_seed_same_samples_other_seed_other_samples(setup):
    e = setup["bf16"]
    r1, r2, r3 = (e.generate(setup["prompts"], 4, seed=s) for s in (7, 7, 8))
    assert r1.response_ids == r2.response_ids and torch.equal(r1.engine_logp, r2.engine_logp)
    assert r1.response_ids != r3.response_ids


def test_tokens_only_call_samples_the_same_tokens(setup):
    """Probes and evaluation ask for no log-probs (`logprobs=False`): the same responses as a call
    with them, in both precisions, since vLLM computes log-probs beside the sampling."""
    for engine in (setup["bf16"], setup["fp8"]):
        with_lp = engine.generate(setup["prompts"], 8, seed=9)
        tokens_only = engine.generate(setup["prompts"], 8, seed=9, logprobs=False)
        assert tokens_only.response_ids == with_lp.response_ids
        assert tokens_only.engine_logp is None and with_lp.engine_logp is not None
        assert torch.equal(tokens_only.group, with_lp.group)
        half = tokens_only.split(8)[1]  # a probe pair's second batch, cut without log-probs
        assert half.engine_logp is None and half.response_ids == with_lp.response_ids[64:]
    with pytest.raises(ValueError, match="logprobs=False"):
        setup["bf16"].generate(setup["prompts"], 2, seed=9, topk=8, logprobs=False)


def test_prompts_repeated_in_one_call_split_into_independent_batches(setup):
    """The two probe batches come from one engine call over the prompts twice."""
    p = setup["prompts"][:6]
    both = setup["bf16"].generate(p + p, 4, seed=5, topk=64)
    a, b = both.split(len(p))
    for part, half in ((a, slice(0, 24)), (b, slice(24, 48))):
        assert part.group.tolist() == [i // 4 for i in range(24)]
        assert part.response_ids == both.response_ids[half] and part.prompt_ids == both.prompt_ids[half]
        assert part.engine_logp.numel() == sum(map(len, part.response_ids)) == part.topk_ids.shape[0]
        assert (part.engine_logp - trainer_logp(setup["model"], part)).abs().mean() < 0.05  # aligned with its tokens
    assert torch.equal(torch.cat([a.engine_logp, b.engine_logp]), both.engine_logp)
    assert a.response_ids != b.response_ids  # independent seeds per request
    assert setup["bf16"].generate(p, 4, seed=5).split(len(p))[0].response_ids == both.response_ids[:24]


def test_full_vocabulary_topk_is_a_distribution_holding_the_sampled_token(setup):
    r = setup["bf16"].generate(setup["prompts"][:4], 2, seed=3, topk=64)
    v = setup["model"].config.vocab_size
    assert r.topk_ids.shape == (r.engine_logp.numel(), v)
    assert torch.allclose(r.topk_logp.exp().sum(-1), torch.ones(r.topk_ids.shape[0]), atol=1e-3)
    flat = torch.tensor([t for resp in r.response_ids for t in resp])
    pos = (r.topk_ids == flat[:, None]).float().argmax(-1)
    assert torch.allclose(r.topk_logp.gather(-1, pos[:, None]).squeeze(-1), r.engine_logp)


def test_after_a_sync_the_engine_samples_from_the_new_weights(setup, smoke_cfg):
    e = setup["bf16"]
    other = build_tiny_model(smoke_cfg.models["tiny"].arch, seed=123).eval()
    try:
        e.load_weights({k: v.detach() for k, v in other.state_dict().items()}, 1)
        assert e.version == 1
        r = e.generate(setup["prompts"], 4, seed=4)
        to_new = (trainer_logp(other, r) - r.engine_logp).abs().mean()
        to_old = (trainer_logp(setup["model"], r) - r.engine_logp).abs().mean()
        assert to_new < 0.05 < to_old
    finally:
        e.load_weights(setup["state"], 0)


def test_greedy_is_deterministic_and_ends_at_eos(setup):
    g1 = setup["bf16"].greedy(setup["prompts"])
    assert g1 == setup["bf16"].greedy(setup["prompts"])
    eos = setup["tok"].eos_token_id
    assert any(r and r[-1] == eos for r in g1)


def test_samplers_are_an_engine_precision_and_a_sync_schedule():
    assert get_sampler("fp8_stale").precision == "fp8" and not get_sampler("fp8_stale").always_synced
    stale = get_sampler("stale")
    assert [k for k in range(130) if stale.due(k, 64)] == [64, 128]
    assert all(get_sampler("bf16").due(k, 64) for k in range(5))
    with pytest.raises(KeyError, match="known"):
        get_sampler("int4")


def _fp8_representable(x: torch.Tensor) -> bool:
    return torch.equal(x, x.to(torch.float8_e4m3fn).to(x.dtype))


def _watch_attention_inputs(worker) -> int:
    """Record, at each attention layer, whether its query, key and value are FP8 values before the
    engine's own hooks run and after them."""
    from vllm.model_executor.layers.attention import Attention

    seen = {"before": [], "after": []}

    def record(where):
        return lambda _m, args: seen[where].append([_fp8_representable(x) for x in args[:3]])

    handles = []
    for m in worker.model_runner.model.modules():
        if isinstance(m, Attention):
            handles.append(m.register_forward_pre_hook(record("before"), prepend=True))
            handles.append(m.register_forward_pre_hook(record("after")))
    worker.attention_watch = (seen, handles)
    return len(handles) // 2


def _stop_watching(worker) -> dict:
    seen, handles = worker.attention_watch
    for h in handles:
        h.remove()
    return seen


@pytest.mark.parametrize("name", ["fp8", "bf16"])
def test_fp8_engine_attention_computes_with_fp8_query_key_and_value_as_flash_attention_3_does(setup, name):
    """The emulation rounds the attention's query, key and value to FP8 (scale 1.0), as vLLM's FA3
    backend does on an H200 with an FP8 KV cache (engine.py's docstring); the BF16 engine does not."""
    engine = setup[name]
    (layers,) = engine.llm.collective_rpc(_watch_attention_inputs)
    try:
        engine.generate(setup["prompts"][:2], 2, seed=9)
    finally:
        (seen,) = engine.llm.collective_rpc(_stop_watching)
    assert layers == 4 and len(seen["after"]) >= 4 * 2  # every layer, prefill and decode steps
    assert not any(all(row) for row in seen["before"])  # RoPE'd BF16 inputs are not FP8 values
    assert all(all(row) for row in seen["after"]) == (name == "fp8")


def trainer_logp_fn(model):
    return lambda prompts, responses: scored_logp(model, prompts, responses)


def _perturbed(state: dict[str, torch.Tensor], scale: float, seed: int) -> dict[str, torch.Tensor]:
    """`state` moved by noise; tensors that are one in `state` (tied embeddings) stay one, as in a
    trained model (the load manifest refuses two values for the one engine tensor they load into)."""
    g, moved = torch.Generator().manual_seed(seed), {}
    for v in state.values():
        if v.data_ptr() not in moved:
            moved[v.data_ptr()] = v + scale * v.abs().mean() * torch.randn(v.shape, generator=g)
    return {k: moved[v.data_ptr()] for k, v in state.items()}


@pytest.mark.parametrize("name", ["bf16", "fp8"])
def test_a_correct_sync_passes_the_check_on_responses_the_engine_draws(setup, name):
    """The check draws CHECK_SEQS short responses to the first prompts with the weights just loaded;
    drawn by the engine, nearly all their tokens are likely under the trainer too."""
    from dlcrepro.step.engine import CHECK_SEQS, CHECK_TOKENS

    engine = setup[name]
    drawn = engine.check_draw(setup["prompts"])
    assert drawn.prompt_ids == [list(p) for p in setup["prompts"][:CHECK_SEQS]] and drawn.version == 0
    assert all(1 <= len(r) <= min(CHECK_TOKENS, engine.cfg.max_tokens) for r in drawn.response_ids)
    d, n = engine.sync_discrepancy(trainer_logp_fn(setup["model"]), setup["prompts"])
    assert n >= 0.9 * sum(map(len, drawn.response_ids))
    assert engine.check_sync(trainer_logp_fn(setup["model"]), setup["prompts"]) == d
    assert 0 < d <= engine.precision.sync_bound


def test_the_checks_draw_is_seeded_by_the_version(setup):
    """The same version draws the same responses (a resumed run's check is the uninterrupted one's);
    the same weights pushed as another version draw others."""
    engine = setup["bf16"]
    a, b = engine.check_draw(setup["prompts"]), engine.check_draw(setup["prompts"])
    assert a.response_ids == b.response_ids and torch.equal(a.engine_logp, b.engine_logp)
    try:
        engine.load_weights(setup["state"], 1)
        other = engine.check_draw(setup["prompts"])
    finally:
        engine.load_weights(setup["state"], 0)
    assert other.response_ids != a.response_ids


@pytest.mark.parametrize("name", ["bf16", "fp8"])
def test_a_check_changes_no_training_sample(setup, name):
    """A training batch drawn without and with a sync check before it (a step's seed, the top-k a
    correction reads): the same tokens and log-probs. The check's requests carry seeds of their own and
    it leaves no prefix cache behind."""
    from dlcrepro.core.seeds import derive_seed

    engine, seed = setup[name], derive_seed(0, 1, "sample")
    without = engine.generate(setup["prompts"], 4, seed, topk=64)
    engine.check_sync(trainer_logp_fn(setup["model"]), setup["prompts"])
    after_check = engine.generate(setup["prompts"], 4, seed, topk=64)
    assert after_check.response_ids == without.response_ids
    assert torch.equal(after_check.engine_logp, without.engine_logp) and torch.equal(after_check.topk_logp, without.topk_logp)


@pytest.mark.parametrize("name", ["bf16", "fp8"])
@pytest.mark.parametrize("bad", ["zeros", "dummy", "another model"])  # not the previous version: see engine.py's bound
def test_a_broken_sync_fails_the_check_naming_engine_version_and_bound(setup, smoke_cfg, name, bad):
    """The engine is told version 1 but holds other weights than the trainer's θ_1."""
    engine, theta_0 = setup[name], setup["state"]
    theta_1 = _perturbed(theta_0, 0.5, seed=1)  # an update that moves log-probs by far more than rounding
    model_1 = build_tiny_model(smoke_cfg.models["tiny"].arch, seed=0).eval()
    model_1.load_state_dict(theta_1)
    pushed = {
        "zeros": {k: torch.zeros_like(v) for k, v in theta_1.items()},
        "dummy": {k: torch.rand(v.shape, generator=torch.Generator().manual_seed(2)).mul(2e-3).sub(1e-3)
                  for k, v in theta_1.items()},  # vLLM's dummy init: uniform in ±1e-3
        "another model": {k: v.detach() for k, v in build_tiny_model(smoke_cfg.models["tiny"].arch, seed=7).state_dict().items()},
    }[bad]
    try:
        engine.load_weights(pushed, 1)
        message = (rf"the {name}.* engine, given version 1, .*mean \|log q − log π\| = [0-9.]+ .* "
                   rf"under {engine.precision.sync_bound}\.")
        with pytest.raises(SyncCheckError, match=message):
            engine.check_sync(trainer_logp_fn(model_1), setup["prompts"])
        engine.load_weights(theta_1, 1)  # the right weights pass
        assert engine.check_sync(trainer_logp_fn(model_1), setup["prompts"]) <= engine.precision.sync_bound
    finally:
        engine.load_weights(theta_0, 0)


def test_a_correct_sync_of_a_sharpened_policy_passes_on_the_tokens_it_draws(setup, smoke_cfg):
    """What a collapsed run meets: the policy turned sharp (final norm x SHARPEN, so every logit grows
    that much). BF16 rounds a large logit coarsely, which puts an unlikely token's log q far from
    log π; the check draws its tokens from the sharp policy, so they are likely and the correct sync
    passes, while a zeroed load of the same version still fails."""
    SHARPEN = 40.0
    engine, theta_0 = setup["bf16"], setup["state"]
    sharp = {k: v * SHARPEN if k == "model.norm.weight" else v for k, v in theta_0.items()}
    model = build_tiny_model(smoke_cfg.models["tiny"].arch, seed=0).eval()
    model.load_state_dict(sharp)
    try:
        engine.load_weights(sharp, 1)
        d, n = engine.sync_discrepancy(trainer_logp_fn(model), setup["prompts"])
        assert n == sum(map(len, engine.check_draw(setup["prompts"]).response_ids))  # every drawn token likely
        assert engine.check_sync(trainer_logp_fn(model), setup["prompts"]) == d <= engine.precision.sync_bound
        engine.load_weights({k: torch.zeros_like(v) for k, v in sharp.items()}, 1)
        with pytest.raises(SyncCheckError, match="given version 1"):
            engine.check_sync(trainer_logp_fn(model), setup["prompts"])
    finally:
        engine.load_weights(theta_0, 0)


def test_a_training_sync_whose_weights_do_not_arrive_stops_the_run(tiny_model_dir, smoke_cfg, monkeypatch):
    """Every push of the training loop is checked: a load that leaves the engine zeroed (injected
    into the real engine's load) raises at the sync, from its load manifest, also after an update
    blew the weights up (a load fault is never the run's divergence); honest pushes are checked and
    recorded."""
    from dlcrepro.step.engine import WeightLoadError
    from dlcrepro.step.divergence import BLOWUP
    from dlcrepro.step.train import Cell, Trainer

    tr = Trainer(smoke_cfg, "tiny", "bf16", "pg", 0, tiny_model_dir)  # one engine: sampler and probe
    cell = Cell()
    tr.start_engines(cell)  # as a run starts: nothing sampled yet
    tr.engine.generate(tr.eval_prompts[:4], 2, seed=1)
    with torch.no_grad():
        for p in tr.params:  # an update
            p.add_(0.1 * p.abs().mean() * torch.randn_like(p))
    cell.step = 1
    tr.sync_sampler(cell)
    assert [(c["engine"], c["version"]) for c in tr.sync_checks] == [("bf16", 0), ("bf16", 1)]
    load = tr.engine.load_weights

    def zeroed(state, version, expected=None):
        return load({k: torch.zeros_like(v) for k, v in state.items()}, version, expected)

    monkeypatch.setattr(tr.engine, "load_weights", zeroed)
    cell.step = 2
    with pytest.raises(WeightLoadError,
                       match="the bf16 engine, given version 2: engine linear layers that do not compute the trainer's weights"):
        tr.sync_sampler(cell)
    with torch.no_grad():  # twice BLOWUP-fold since the last version the engine matched
        for p in tr.params:
            p.mul_(2 * BLOWUP)
    cell.step = 3
    with pytest.raises(WeightLoadError, match="given version 3"):
        tr.sync_sampler(cell)
    monkeypatch.setattr(tr.engine, "load_weights", load)
    monkeypatch.setattr(tr.cfg.engine, "sync_check", False)  # engine.sync_check: false: no statistical check
    cell.step = 4
    tr.sync_sampler(cell)
    assert tr.engine.version == 4 and len(tr.sync_checks) == 2


def test_bf16_linear_sums_the_bf16_products_in_float32_and_rounds_once():
    """The engine's BF16 product where vLLM-CPU has no BF16 kernel (dlcrepro/step/engine.py): every output
    is the exact sum (float64) rounded to BF16, within one BF16 unit (the float32 sum's own rounding),
    and within one unit of torch's BF16 F.linear, which sums the same products in another order."""
    from dlcrepro.step.engine import bf16_linear_fp32_sum

    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 256, generator=g).bfloat16()
    w = torch.randn(320, 256, generator=g).bfloat16()
    ours = bf16_linear_fp32_sum(x, w, None)
    assert ours.dtype == torch.bfloat16
    exact = (x.double() @ w.double().T)
    ulp = torch.finfo(torch.bfloat16).eps * exact.abs().clamp_min(1e-3)  # one BF16 unit at each output's size
    assert ((ours.double() - exact).abs() <= ulp).all()
    assert ((ours.double() - torch.nn.functional.linear(x, w).double()).abs() <= 2 * ulp).all()


def test_vllms_cpu_dispatch_keeps_its_kernels_and_replaces_only_the_torch_fallback(setup):
    """After the engines started, vLLM's CPU linear dispatch is wrapped: a BF16 layer gets
    bf16_linear_fp32_sum exactly where vLLM itself would give the torch fallback (a CPU without AMX
    and without oneDNN BF16, such as AVX2 only), and vLLM's own kernel elsewhere."""
    import vllm.model_executor.layers.utils as layer_utils

    from dlcrepro.step.engine import _is_torch_fallback, bf16_linear_fp32_sum

    dispatch = layer_utils.dispatch_cpu_unquantized_gemm
    assert getattr(dispatch, "dlcrepro_wrapped", False)
    vllm_dispatch = dispatch.vllm_dispatch
    for dtype in (torch.bfloat16, torch.float32):
        theirs, ours = torch.nn.Linear(256, 512, bias=False), torch.nn.Linear(256, 512, bias=False)
        theirs.weight.data = theirs.weight.data.to(dtype)
        ours.weight.data = theirs.weight.data.clone()
        vllm_dispatch(theirs, remove_weight=False)
        dispatch(ours, remove_weight=False)
        if dtype == torch.bfloat16 and _is_torch_fallback(theirs.cpu_linear):
            assert ours.cpu_linear is bf16_linear_fp32_sum
        else:
            assert ours.cpu_linear is not bf16_linear_fp32_sum
        x = torch.randn(8, 256).to(dtype)
        assert ours.cpu_linear(x, ours.weight, None).shape == (8, 512)


def test_vllms_linear_kernels_here_are_the_ones_the_kernel_path_names(setup):
    """What vLLM's CPU dispatch gives a BF16 layer, small (sgl-kernel's AMX GEMM where there is AMX) or
    large (oneDNN), is what `kernels.kernel_path` names for this machine: the shared files' record of
    the node's kernels is what its engines run (every engine start compares the same and logs a mismatch)."""
    import vllm.model_executor.layers.utils as layer_utils

    from dlcrepro.step import kernels

    path = kernels.kernel_path("bfloat16")
    if not path.startswith("cpu:") or path.startswith("cpu:other:"):
        pytest.skip(f"kernel path {path}: no CPU linear dispatch to compare")
    chosen = {}
    for n, k in ((512, 256), (2048, 1024)):  # 256 KiB and 4 MiB of BF16 weights: either side of sgl-kernel's 1 MiB
        layer = torch.nn.Linear(k, n, bias=False).to(torch.bfloat16)
        layer_utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
        family = linear_kernel(layer.cpu_linear)
        chosen[family] = chosen.get(family, 0) + 1
        assert layer.cpu_linear(torch.randn(4, k).bfloat16(), layer.weight, None).shape == (4, n)
    assert "other" not in chosen, chosen
    assert kernels.linear_kernel_mismatch(path, chosen) is None
    other = "zentorch" if ":zentorch:" not in path else "onednn"
    wrong = kernels.linear_kernel_mismatch(path, {other: 1})
    assert re.match(rf"kernel path '{re.escape(path)}' .* and vLLM chose {other} for 1", wrong)
