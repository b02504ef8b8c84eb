"""A model directory by content: what the shared files (rollouts.py, initial_eval.py) name their
model by, instead of its path.

A path says where weights were, not which: a moved checkout or another node's copy of the same
weights has another path, and a warm start redone at the same path has other weights. So a shared
file records `model_identity(dir)`: the sha256 of the weights as vLLM and transformers load them
(every tensor of the directory's safetensors files: its name, dtype, shape and bytes, in name order,
whatever the sharding), and the sha256 of the small files that say how they are computed and
tokenized (config.json, the tokenizer's files, generation_config.json). Read without torch, straight
from the safetensors layout (an 8-byte header length, a JSON header of each tensor's dtype, shape and
byte range, then the bytes).

Cost: one pass over the weights' bytes, hashed once per process and directory (cached by each
file's path, size and modification time). Measured on this project's 2-core AVX-512 EPYC: the tiny
model's 3.2 MB in 27 ms (0.5 ms again from the cache); a 768 MiB file from the page cache at 680-750
MB/s (sha256 itself: ~610 MB/s in memory), so Qwen3-0.6B's 1.5 GB of BF16 weights cost ~2 s per job,
more from a cold disk (docs/measurements.md, "Shared files: weights hash and kernel path").
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

# the small files that change what the weights compute or how text becomes tokens; a *.json that
# indexes sharded weights is not among them (the tensors' hash does not depend on the sharding)
MODEL_FILE_PATTERNS = ("*.json", "*.txt", "*.jinja", "*.model")
CHUNK = 8 * 2**20

_CACHE: dict[tuple, dict[str, str]] = {}


def _tensors(path: Path) -> list[tuple[str, str, list[int], int, int]]:
    """(name, dtype, shape, first byte, end byte) of each tensor in a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return [(name, h["dtype"], list(h["shape"]), 8 + n + h["data_offsets"][0], 8 + n + h["data_offsets"][1])
            for name, h in header.items() if name != "__metadata__"]


def _weight_files(model_dir: Path) -> list[Path]:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors weights to identify the model by")
    return files


def weights_hash(model_dir: str | Path) -> str:
    """sha256 (hex) of the weights in `model_dir`: each tensor's name, dtype, shape and bytes, in
    name order across all its safetensors files."""
    return model_identity(model_dir)["weights_sha256"]


def model_identity(model_dir: str | Path) -> dict[str, str]:
    """{"weights_sha256": `weights_hash`, "files_sha256": sha256 of the config and tokenizer files
    (MODEL_FILE_PATTERNS, by name)}: what a shared file names its model by. Computed once per
    process for the same files (path, size, modification time)."""
    model_dir = Path(model_dir)
    weights = _weight_files(model_dir)
    small = sorted({p for pat in MODEL_FILE_PATTERNS for p in model_dir.glob(pat)
                    if p.is_file() and not p.name.endswith(".safetensors.index.json")})
    key = tuple((str(p.resolve()), st.st_size, st.st_mtime_ns) for p in weights + small for st in [p.stat()])
    if key not in _CACHE:
        _CACHE[key] = {"weights_sha256": _hash_tensors(weights), "files_sha256": _hash_files(small)}
    return dict(_CACHE[key])


def _hash_tensors(files: list[Path]) -> str:
    h = hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    entries = sorted((t, f) for f in files for t in _tensors(f))
    handles = {f: open(f, "rb") for f in files}
    try:
        for (name, dtype, shape, start, end), f in entries:
            h.update(json.dumps([name, dtype, shape]).encode() + struct.pack("<Q", end - start))
            fh, left = handles[f], end - start
            fh.seek(start)
            while left:
                got = fh.readinto(view[: min(CHUNK, left)])
                if not got:
                    raise ValueError(f"{f}: tensor {name} ends past the end of the file")
                h.update(view[:got])
                left -= got
    finally:
        for fh in handles.values():
            fh.close()
    return h.hexdigest()


def _hash_files(files: list[Path]) -> str:
    h = hashlib.sha256()
    for p in files:
        data = p.read_bytes()
        h.update(p.name.encode() + b"\0" + struct.pack("<Q", len(data)) + data)
    return h.hexdigest()
