"""The paper's model architectures, shapes only (torch-free): their published config.json on the
Hugging Face hub. The paper-size GPU check and bench/ build them with random weights; the rehearsal's
model (`rehearsal.REHEARSAL_ARCH`) is Qwen3's with the sizes cut."""

# What Qwen3-0.6B and -1.7B share: 28 layers of 16 query / 8 key-value heads of 128 (grouped-query
# attention, q/k RMS norms), vocabulary 151,936, tied embeddings.
QWEN3_COMMON = dict(
    vocab_size=151936,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
QWEN3_ARCH = {
    "qwen3-0.6b": dict(QWEN3_COMMON, hidden_size=1024, intermediate_size=3072),
    "qwen3-1.7b": dict(QWEN3_COMMON, hidden_size=2048, intermediate_size=6144),
}
