import os
import sys

from .cli import main

status = main()
if "vllm" in sys.modules:
    # A job that started vLLM engines has written and closed its outputs; the interpreter's own
    # exit would tear the engines down first (1-3 s of gc and cache clean-up per job).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
raise SystemExit(status)
