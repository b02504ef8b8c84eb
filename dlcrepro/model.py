"""The trainer side: the tiny Qwen3 model, its character tokenizer, and trainer log-probabilities.

The tiny model is a `transformers` `Qwen3ForCausalLM` built from the config file's `model`
section; its character-level tokenizer is saved as tokenizer.json so that both transformers
and vLLM load the directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
CHARS = "0123456789+-*/()=,>: "


def build_tokenizer():
    """Character-level tokenizer: one id per character of CHARS, plus pad/eos/unk."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for c in CHARS:
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
    """Prompt+response sequences laid out for trainer forwards, packed into rows.

    input_ids, position_ids: `(R, L)`. Each row holds one or more whole sequences back to back,
    each with positions from 0, then padding; causal attention stays inside each sequence
    (transformers builds the block-causal mask from the positions), and padding at a row's end
    is never attended by a real token. One sequence per row when packing is off.
    rows, cols: `(N,)` where response token k sits: the logits at `(rows[k], cols[k])` predict it.
    tokens: `(N,)` the response token ids; seq: `(N,)` which sequence each token belongs to.
    seq_row: `(B,)` the row of each sequence. Sequences, and so tokens, keep their order.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    tokens: torch.Tensor
    seq: torch.Tensor
    seq_row: torch.Tensor

    _FIELDS = ("input_ids", "position_ids", "rows", "cols", "tokens", "seq", "seq_row")

    def to(self, device) -> "TokenBatch":
        return TokenBatch(*(getattr(self, f).to(device) for f in self._FIELDS))

    @property
    def num_seqs(self) -> int:
        return int(self.seq_row.numel())

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    def chunks(self, max_rows: int) -> list[tuple["TokenBatch", slice]]:
        """Sub-batches of at most `max_rows` rows, each with the slice of the batch's tokens it
        holds (tokens are laid out sequence by sequence, sequences row by row)."""
        if self.num_rows <= max_rows:
            return [(self, slice(0, int(self.tokens.numel())))]
        seq_row, counts = self.seq_row.tolist(), torch.bincount(self.seq, minlength=self.num_seqs).tolist()
        out, tok, first = [], 0, 0
        for start in range(0, self.num_rows, max_rows):
            end = min(start + max_rows, self.num_rows)
            last = first
            while last < len(seq_row) and seq_row[last] < end:
                last += 1
            sl = slice(tok, tok + sum(counts[first:last]))
            sub = TokenBatch(
                self.input_ids[start:end],
                self.position_ids[start:end],
                self.rows[sl] - start,
                self.cols[sl],
                self.tokens[sl],
                self.seq[sl] - first,
                self.seq_row[first:last] - start,
            )
            out.append((sub, sl))
            tok, first = sl.stop, last
        return out


def make_token_batch(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int = 0, pack_tokens: int = 0) -> TokenBatch:
    """Lay out prompt+response pairs; with `pack_tokens` > 0, consecutive sequences share a row
    while it holds at most max(pack_tokens, longest sequence) tokens (next-fit, order kept)."""
    if len(prompts) != len(responses):
        raise ValueError("make_token_batch: prompts and responses differ in length")
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    cap = max(max(lengths, default=1), pack_tokens)
    fill, start, seq_row = [], [], []  # tokens used per row; each sequence's first column and row
    for n in lengths:
        if not (pack_tokens > 0 and fill and fill[-1] + n <= cap):
            fill.append(0)
        start.append(fill[-1])
        seq_row.append(len(fill) - 1)
        fill[-1] += n
    L = max(fill, default=1)
    ids = torch.full((len(fill), L), pad_id, dtype=torch.long)
    pos = torch.arange(L).repeat(len(fill), 1)
    rows, cols, toks, seq = [], [], [], []
    for i, (p, r) in enumerate(zip(prompts, responses)):
        row, c0, n = seq_row[i], start[i], lengths[i]
        ids[row, c0 : c0 + n] = torch.tensor(list(p) + list(r), dtype=torch.long)
        pos[row, c0 : c0 + n] = torch.arange(n)
        for j in range(len(r)):
            rows.append(row)
            cols.append(c0 + len(p) + j - 1)
            toks.append(r[j])
            seq.append(i)
    tail = torch.tensor(fill)[:, None]  # a row's padding continues its last sequence's positions:
    pad = torch.arange(L)[None, :] >= tail  # one more "sequence" would start a needless mask block
    pos = torch.where(pad, pos.gather(1, (tail - 1).clamp(min=0)).expand_as(pos) + (torch.arange(L)[None, :] - tail + 1), pos)
    as_long = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    return TokenBatch(ids, pos, as_long(rows), as_long(cols), as_long(toks), as_long(seq), as_long(seq_row))


def response_logits(model, tb: TokenBatch, chunk: int = 1024) -> torch.Tensor:
    """Trainer logits `(N, V)` in float32 at every response position (grad flows if enabled).

    The output head runs on the response positions' hidden states only: prompt positions' logits
    are never formed (with Qwen3's V = 151,936 they would be a third of a step's head work)."""
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    outs = []
    for start in range(0, tb.num_rows, chunk):
        sl = slice(start, start + chunk)
        hidden = decoder(input_ids=tb.input_ids[sl], position_ids=tb.position_ids[sl], use_cache=False).last_hidden_state
        sel = (tb.rows >= start) & (tb.rows < start + chunk)
        outs.append(head(hidden[tb.rows[sel] - start, tb.cols[sel]]).float())
    return torch.cat(outs) if len(outs) > 1 else outs[0]


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log π(y|p) `(N,)` from logits `(N, V)` and tokens `(N,)`, with a float32 log-softmax."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
