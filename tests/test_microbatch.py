"""Micro-batches: whole sequences in batch order, at most `micro_batch` sequences and
`micro_batch_tokens` padded tokens each, each cut to its own longest sequence. The chunking on
hand cases first, then the trainer's numbers unchanged by it on a small random Qwen3."""

import copy
import dataclasses
import weakref

import pytest
import torch

from dlcrepro.core.config import TrainConfig
from dlcrepro.run.gpu_check import paper_step_batch
from dlcrepro.step.model import build_tiny_model, chunk_bounds, make_token_batch, response_logits, token_logprobs
from dlcrepro.step.learner import KeptLogits, Learner

VOCAB = 32
ARCH = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=128, tie_word_embeddings=True)


def batch(resp_lens: list[int], prompt_len: int = 3):
    """A TokenBatch of one prompt of `prompt_len` tokens and responses of the given lengths."""
    prompt = list(range(3, 3 + prompt_len))
    return make_token_batch([prompt] * len(resp_lens), [[3 + (i + j) % 20 for j in range(n)] for i, n in enumerate(resp_lens)])


def widths(chunks) -> list[int]:
    return [sub.input_ids.shape[1] for sub, _ in chunks]


def moved_learner(model, correction: str, lagged: bool = True, **train) -> Learner:
    """A float32 CPU `Learner` of `correction` on a copy of `model`; `lagged`: θ_t moved away from θ_s
    (so dlc's ratios and q̃ are not trivial)."""
    learner = Learner(copy.deepcopy(model), TrainConfig(lr=0.1, **train), correction, "float32", torch.device("cpu"))
    if lagged:
        with torch.no_grad():
            for p in learner.params:
                p.add_(3e-2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    return learner


# ----------------------------------------------------------------------------- the chunking


def test_a_long_response_widens_only_its_own_micro_batch():
    short = [2, 1, 2, 2, 1, 2, 2, 1]  # prompt 3: rows of 4-5 tokens
    long = short[:5] + [20] + short[6:]  # one truncated-like response in the second micro-batch
    assert widths(batch(short).chunks(4)) == [5, 5]
    assert widths(batch(long).chunks(4)) == [5, 23]
    assert torch.equal(batch(short).chunks(4)[0][0].input_ids, batch(long).chunks(4)[0][0].input_ids)


def test_chunk_bounds_hand_cases():
    assert chunk_bounds([3, 3, 10, 3, 3], max_seqs=4) == [(0, 4), (4, 5)]
    assert chunk_bounds([3, 3, 10, 3, 3], max_seqs=4, max_tokens=12) == [(0, 2), (2, 3), (3, 5)]  # 3 rows × 10 > 12
    assert chunk_bounds([3, 3, 20, 3], max_seqs=4, max_tokens=12) == [(0, 2), (2, 3), (3, 4)]  # 20 > 12: alone
    assert chunk_bounds([3, 3, 3, 3], max_seqs=4, max_tokens=12) == [(0, 4)]  # exactly the budget fits


@pytest.mark.parametrize("max_seqs, max_tokens", [(4, 0), (1024, 60), (4, 60), (3, 7)])
def test_micro_batches_keep_both_budgets_and_close_only_when_the_next_row_breaks_one(max_seqs, max_tokens):
    lens = torch.randint(1, 30, (50,), generator=torch.Generator().manual_seed(0)).tolist()
    tb = batch(lens)
    chunks = tb.chunks(max_seqs, max_tokens)
    rows = [sub.num_seqs for sub, _ in chunks]
    assert sum(rows) == tb.num_seqs
    for (sub, _), width in zip(chunks, widths(chunks)):
        assert sub.num_seqs <= max_seqs
        assert width == int(sub.lengths.max())  # cut to its own longest row
        assert not max_tokens or sub.num_seqs == 1 or sub.input_ids.numel() <= max_tokens
    starts = [sum(rows[:i]) for i in range(len(rows))]
    for start, n in zip(starts[:-1], rows[:-1]):  # greedy: one row more would break a budget
        longest = 3 + max(lens[start : start + n + 1])  # prompt 3 + the longest response
        assert n + 1 > max_seqs or (max_tokens and (n + 1) * longest > max_tokens)
    if max_tokens == 7:  # every row is longer than the budget: one row per forward
        assert rows == [1] * tb.num_seqs


def test_each_micro_batch_holds_its_sequences_tokens_in_batch_order():
    tb = batch([2, 9, 1, 4, 4, 12, 1])
    for max_tokens in (0, 8, 20):
        chunks, start = tb.chunks(3, max_tokens), 0
        assert [sl.start for _, sl in chunks] == [0] + [sl.stop for _, sl in chunks[:-1]]
        assert chunks[-1][1].stop == tb.tokens.numel()
        for sub, sl in chunks:
            assert torch.equal(sub.tokens, tb.tokens[sl]) and torch.equal(sub.seq + start, tb.seq[sl])
            # the logits at (row, col) predict the token at col + 1 of the same row: no real token cut
            assert torch.equal(sub.input_ids[sub.rows, sub.cols + 1], sub.tokens)
            assert torch.equal(sub.input_ids, tb.input_ids[start : start + sub.num_seqs, : sub.input_ids.shape[1]])
            start += sub.num_seqs


# ----------------------------------------------------------------------------- the trainer's numbers


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(ARCH, 0)


def test_right_padding_of_any_width_and_content_leaves_log_probs_unchanged(model):
    """No attention mask is needed because every row's padding comes after its real tokens: junk
    in the padding, more padding columns, or trimming to each micro-batch's longest row change no
    log-prob."""
    g = torch.Generator().manual_seed(1)
    tb = batch(torch.randint(1, 30, (12,), generator=g).tolist(), prompt_len=5)
    logp = lambda b, *limits: token_logprobs(response_logits(model, b, *limits), b.tokens)  # noqa: E731
    with torch.no_grad():
        whole = logp(tb)
        ids = torch.cat([tb.input_ids, torch.zeros(tb.num_seqs, 17, dtype=torch.long)], 1)
        pad = torch.arange(ids.shape[1]) >= tb.lengths[:, None]
        ids[pad] = torch.randint(VOCAB, (int(pad.sum()),), generator=g)
        junk = logp(dataclasses.replace(tb, input_ids=ids))
        trimmed = logp(tb, 4, 60)
    assert len(tb.chunks(4, 60)) > 3 and len(set(widths(tb.chunks(4, 60)))) > 1  # several widths, some below the batch's
    assert torch.allclose(junk, whole, rtol=0, atol=1e-5), (junk - whole).abs().max()
    assert torch.allclose(trimmed, whole, rtol=0, atol=1e-5), (trimmed - whole).abs().max()


@pytest.mark.parametrize("correction", ["pg", "dlc"])
def test_token_budgeted_micro_batches_give_the_one_forward_numbers(model, correction):
    """The trainer's log-probs, sampler KL, probe gradient and correction gradient over trimmed,
    token-budgeted micro-batches equal those of the whole batch in one forward (a stale θ_s, so
    dlc's ratios and q̃ are not trivial)."""
    s, rollout = paper_step_batch(16, 4, prompt_len=4, resp_len=(1, 40), vocab=VOCAB, topk=8, seed=0)
    learner = moved_learner(model, correction)
    results = {}
    for limits in ((1024, 0), (4, 32)):
        learner.tcfg = dataclasses.replace(learner.tcfg, micro_batch=limits[0], micro_batch_tokens=limits[1])
        batch = learner.batch(rollout, s, synced=False)
        lp = batch.trainer_logp
        g_c, diag = learner.correction_grad(batch)
        results[limits] = (lp.a, lp.b, lp.kl_sampler, g_c, learner.pg_grad(s), learner.token_logp(learner.initial_model, s.tb),
                           *diag.values())
    chunks = learner.micro_batches(s.tb)
    assert len(chunks) > 4 and min(widths(chunks)) < s.tb.input_ids.shape[1]  # really split, and trimmed
    assert any(sub.num_seqs == 1 and sub.input_ids.numel() > 32 for sub, _ in chunks)  # a row over budget, alone
    whole, chunked = results[(1024, 0)], results[(4, 32)]
    assert whole[3].abs().max() > 0
    for x, y in zip(whole, chunked):
        if isinstance(x, float):
            assert abs(x - y) <= 1e-5 * max(1.0, abs(x)), (x, y)
        else:
            assert torch.allclose(x, y, rtol=1e-4, atol=1e-6), (x - y).abs().max()


@pytest.mark.parametrize("synced", [False, True])
@pytest.mark.parametrize("correction", ["ppo_multi", "dlc"])
def test_later_sgd_steps_reading_the_kept_sampler_distribution_move_theta_as_recomputing_it(model, synced, correction):
    """A batch's later SGD steps (PPO's epochs) on a one-micro-batch batch read θ_s's
    log-distribution the first pass kept (`Batch.sampler_distribution`) instead of θ_s's forward
    again: the same θ after four steps. `dlc` reads it (its q̃ and lag ratios; four steps forced
    here), `ppo_multi` does not. Lagged: the kept one is θ_s's own no-grad forward, so equal bit for
    bit. Synced: it is θ_t's forward with its graph, which equals the sampler copy's no-grad forward
    in value (bit for bit in the tiny study's cells on an AVX-512 EPYC and an AMX Xeon, docs/measurements.md;
    compared here to float32 noise)."""
    s, rollout = paper_step_batch(16, 4, prompt_len=4, resp_len=(1, 20), vocab=VOCAB, topk=8, seed=3)
    after = {}
    for reuse in (False, True):
        learner = moved_learner(model, correction, lagged=not synced)
        batch = learner.batch(rollout, s, synced=synced)
        assert batch.sampler_distribution is not None  # one micro-batch: the first pass keeps θ_s's distribution
        g, _ = learner.correction_grad(batch)
        if not reuse:
            batch.release_sampler_distribution()
        direction = learner.update(batch, g, updates=4)
        after[reuse] = (direction, torch.cat([p.detach().reshape(-1) for p in learner.params]))
    for x, y in zip(after[False], after[True]):
        if synced:
            assert torch.allclose(x, y, rtol=1e-5, atol=1e-7), (x - y).abs().max()
        else:
            assert torch.equal(x, y)
    assert after[True][0].abs().max() > 0


@pytest.mark.parametrize("updates", [1, 4])
def test_the_batch_spends_its_kept_logits_in_the_first_pass_and_frees_its_sampler_distribution_after_the_update(
        model, updates):
    """A one-micro-batch batch keeps θ_t's logits and θ_s's distribution from its log-probs' pass:
    the first correction pass spends the logits (its backward frees their graph), the distribution
    stays for PPO's later epochs, and once the update is done the batch holds neither and the
    distribution's tensor is freed."""
    s, rollout = paper_step_batch(16, 4, prompt_len=4, resp_len=(1, 20), vocab=VOCAB, topk=8, seed=3)
    learner = moved_learner(model, "dlc")
    batch = learner.batch(rollout, s, synced=False)
    assert batch.kept is not None and batch.kept.logits_t is not None
    freed = weakref.ref(batch.sampler_distribution)
    g, _ = learner.correction_grad(batch)
    assert batch.kept.logits_t is None and batch.sampler_distribution is not None
    learner.update(batch, g, updates=updates)
    assert batch.kept is None and batch.sampler_distribution is None
    assert freed() is None


@pytest.mark.parametrize("correction, reads_theta_s", [("pg", False), ("ppo_multi", False), ("is", False),
                                                        ("center", True), ("dlc", True)])
def test_theta_s_forward_in_micro_batches_runs_only_for_a_correction_that_reads_its_distribution(model, correction,
                                                                                                  reads_theta_s):
    """A lagged batch in several micro-batches: the correction's pass computes θ_s's `(n, V)`
    distribution per micro-batch only where it is read (`TokenTerms.logp_s`: q̃'s spread for the
    centred ones, λ for dlc), once per micro-batch; `pg`, `is` and PPO's steps never read it, and no
    θ_s forward runs for them. The gradient is the one a given distribution gives."""
    s, rollout = paper_step_batch(16, 4, prompt_len=4, resp_len=(1, 20), vocab=VOCAB, topk=8, seed=5)
    learner = moved_learner(model, correction, micro_batch=4)
    batch = learner.batch(rollout, s, synced=False)
    assert batch.kept is None and len(learner.micro_batches(s.tb)) == 4
    forwards = []
    hook = learner.sampler_model.get_decoder().register_forward_hook(lambda *_: forwards.append(1))  # what response_logits runs
    try:
        lazy, _ = learner.correction_grad(batch)
    finally:
        hook.remove()
    assert len(forwards) == (4 if reads_theta_s else 0)
    with torch.no_grad():
        given = torch.log_softmax(learner.logits(learner.sampler_model, s.tb), -1)
    batch.kept = KeptLogits(logits_t=None, logp_s=given)
    eager, _ = learner.correction_grad(batch)
    assert lazy.abs().max() > 0 and torch.allclose(lazy, eager, rtol=1e-4, atol=1e-6), (lazy - eager).abs().max()
