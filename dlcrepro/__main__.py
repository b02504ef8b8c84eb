import os
import sys

from .run.heap import keep_freed_memory

keep_freed_memory()  # before torch and vLLM allocate: every later step's tensors reuse the heap (heap.py)

from .run.cli import main  # noqa: E402

status = main()
if "vllm" in sys.modules:
    # A job that started vLLM engines has written and closed its outputs; the interpreter's own
    # exit would tear the engines down first (1-3 s of gc and cache clean-up per job).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
raise SystemExit(status)
