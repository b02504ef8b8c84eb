"""glibc's heap kept across a step's allocations: set once at the start of every `python -m dlcrepro`
process (`__main__.py`), so the fork server's children inherit it.

Why: a tiny-model step allocates and frees the same few-MB tensors hundreds of times (a
128 x 24 x 384 float32 activation is 4.7 MB). glibc serves blocks that size with `mmap` or trims
them off the top of the heap when freed, so every step's activations land on fresh pages that the
kernel zeroes on first touch: in a cell under `bench/cell_profile.py` (tiny/stale/dlc, 4 steps, one
thread, AVX-512 EPYC) the forward's `[3072, 128] x [128, 384]` product ran at 38 GFLOP/s against 97
alone, and at 64 with the settings below. A cell's numbers do not change (nothing here touches the
arithmetic; `bench/heap_settings.py` compares them), only its time: 4 % of two cells' phases in the
bench, 1.6 % of a trained cell in the main command (its trainer phases 2-6 %), for ~25 MB more peak
memory a cell (docs/measurements.md#the-heap-kept-2026-12-05-session-12-amd-epyc-with-avx-512-no-amx).
Stdlib only.
"""

from __future__ import annotations

import ctypes
import os

# mallopt(3)'s parameters
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3

SETTINGS = {
    M_MMAP_THRESHOLD: 32 << 20,  # blocks up to 32 MB (glibc's largest allowed) come from the heap, not mmap
    M_TRIM_THRESHOLD: 1 << 30,  # free memory at the heap's top is given back only beyond 1 GiB
    M_TOP_PAD: 64 << 20,  # and the heap grows 64 MB at a time
}
OFF_ENV = "DLCREPRO_DEFAULT_HEAP"  # set (to anything) to keep glibc's defaults, e.g. to measure against them


def keep_freed_memory() -> bool:
    """Apply SETTINGS through glibc's `mallopt`; whether they were applied (not: another libc, or
    DLCREPRO_DEFAULT_HEAP set). Call it before the process allocates much: it changes only how
    later allocations are served."""
    if os.environ.get(OFF_ENV):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    return all(mallopt(param, value) == 1 for param, value in SETTINGS.items())
