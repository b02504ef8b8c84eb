"""The trainer side: the tiny Qwen3 model, its character tokenizer, and trainer log-probabilities.

The tiny model is a `transformers` `Qwen3ForCausalLM` built from the config file's `model`
section; its character-level tokenizer is saved as tokenizer.json so that both transformers
and vLLM load the directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Sequence

import torch

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
CHARS = "0123456789+-*/()=,>: "
# What the worked answer format adds: its `<answer>` tags' letters and its line break. Only a
# worked-answer tokenizer has them, so an expression-format model decodes exactly as before (its
# unused ids 24-31 decode to nothing; as letters they would change a sampled response's reward).
WORKED_CHARS = "answer<\n"


def build_tokenizer(answer_format: str = "expression"):
    """Character-level tokenizer: one id per character of CHARS (and WORKED_CHARS after them for
    the `worked` answer format), plus pad/eos/unk."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for c in CHARS + (WORKED_CHARS if answer_format == "worked" else ""):
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK, clean_up_tokenization_spaces=False
    )


def build_tiny_model(arch: dict, seed: int):
    """A randomly initialised `Qwen3ForCausalLM` from the `model.arch` section of the config."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok_len = len(CHARS) + 3
    if arch["vocab_size"] < tok_len:
        raise ValueError(f"model.arch.vocab_size={arch['vocab_size']} is below the tokenizer's {tok_len} tokens")
    cfg = Qwen3Config(
        **arch,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(cfg)


def save_model_dir(model, tokenizer, out: Path) -> None:
    """Write a model directory that transformers and vLLM both load (safetensors + tokenizer.json)."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    # vLLM reads the stop token from generation_config.json; make it explicit.
    gen = {"eos_token_id": model.config.eos_token_id, "pad_token_id": model.config.pad_token_id}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=1))


def load_model(path: str | Path, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


# ----------------------------------------------------------------------------- token batches


@dataclass
class TokenBatch:
    """Prompt+response sequences laid out for one trainer forward.

    input_ids: `(B, L)`, right-padded to the longest row. No attention mask: with causal attention
    no real token attends to the padding after it, and the model's default positions 0..L-1 are
    each row's; this holds only because padding comes after each row's real tokens.
    lengths: `(B,)` real tokens (prompt + response) of each row.
    rows, cols: `(N,)` where response token k sits: logits at `(rows[k], cols[k])` predict it.
    tokens: `(N,)` the response token ids; seq: `(N,)` which sequence each token belongs to.
    """

    input_ids: torch.Tensor
    lengths: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    tokens: torch.Tensor
    seq: torch.Tensor

    def to(self, device) -> "TokenBatch":
        return TokenBatch(*(getattr(self, f.name).to(device) for f in fields(self)))

    @property
    def num_seqs(self) -> int:
        return int(self.input_ids.shape[0])

    def chunks(self, max_seqs: int, max_tokens: int = 0) -> list[tuple["TokenBatch", slice]]:
        """Sub-batches of whole sequences in batch order, each with the slice of the batch's tokens
        it holds (tokens are laid out sequence by sequence), each cut to its own longest row.

        A chunk closes before it would hold more than `max_seqs` rows or, with `max_tokens` > 0,
        more than `max_tokens` padded tokens (rows × its longest row): activation memory grows with
        padded tokens, so one long response widens only its own chunk. A row longer than
        `max_tokens` is a chunk of its own."""
        lengths = self.lengths.tolist()
        counts = torch.bincount(self.seq, minlength=self.num_seqs).tolist()
        out, tok = [], 0
        for start, end in chunk_bounds(lengths, max_seqs, max_tokens):
            sl = slice(tok, tok + sum(counts[start:end]))
            width = max(lengths[start:end])
            if (start, end, width) == (0, self.num_seqs, self.input_ids.shape[1]):
                out.append((self, sl))  # the whole batch as it is: no copies
            else:
                out.append((TokenBatch(self.input_ids[start:end, :width], self.lengths[start:end], self.rows[sl] - start,
                                       self.cols[sl], self.tokens[sl], self.seq[sl] - start), sl))
            tok = sl.stop
        return out


def chunk_bounds(lengths: Sequence[int], max_seqs: int, max_tokens: int = 0) -> list[tuple[int, int]]:
    """`[(start, end), ...]` row ranges covering `lengths` in order, greedily: each range as long as
    it stays within `max_seqs` rows and (if `max_tokens` > 0) `(end − start) · max(lengths[start:end])`
    ≤ `max_tokens`; a single row is a range even when it alone exceeds `max_tokens`."""
    if max_seqs < 1 or max_tokens < 0:
        raise ValueError(f"chunk_bounds: max_seqs={max_seqs} must be >= 1 and max_tokens={max_tokens} >= 0")
    bounds, start, width = [], 0, 0
    for i, n in enumerate(lengths):
        rows, wider = i - start + 1, max(width, n)
        if i > start and (rows > max_seqs or (max_tokens and rows * wider > max_tokens)):
            bounds.append((start, i))
            start, wider = i, n
        width = wider
    if len(lengths):
        bounds.append((start, len(lengths)))
    return bounds


def make_token_batch(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int = 0) -> TokenBatch:
    if len(prompts) != len(responses):
        raise ValueError("make_token_batch: prompts and responses differ in length")
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    L = max(lengths)
    ids = torch.full((len(prompts), L), pad_id, dtype=torch.long)
    rows, cols, toks, seq = [], [], [], []
    for i, (p, r) in enumerate(zip(prompts, responses)):
        s = list(p) + list(r)
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        for j in range(len(r)):
            rows.append(i)
            cols.append(len(p) + j - 1)
            toks.append(r[j])
            seq.append(i)
    as_long = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    return TokenBatch(ids, as_long(lengths), as_long(rows), as_long(cols), as_long(toks), as_long(seq))


def response_logits(model, tb: TokenBatch, max_seqs: int = 1024, max_tokens: int = 0) -> torch.Tensor:
    """Trainer logits `(N, V)` in float32 at every response position (grad flows if enabled), one
    decoder forward per chunk of `tb.chunks(max_seqs, max_tokens)`.

    The output head runs on the response positions' hidden states only: prompt positions' logits
    are never formed (with Qwen3's V = 151,936 they would be a third of a step's head work).
    `use_cache=False`: a training forward needs no KV cache, which HF would otherwise fill."""
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    outs = []
    for sub, _ in tb.chunks(max_seqs, max_tokens):
        hidden = decoder(input_ids=sub.input_ids, use_cache=False).last_hidden_state
        outs.append(head(hidden[sub.rows, sub.cols]).float())
    return torch.cat(outs) if len(outs) > 1 else outs[0]


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log π(y|p) `(N,)` from logits `(N, V)` and tokens `(N,)`, with a float32 log-softmax."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
