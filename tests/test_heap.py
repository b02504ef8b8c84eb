"""heap.py: glibc's heap settings are applied where glibc is the libc, and can be turned off."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dlcrepro.run import heap


def glibc_version() -> str | None:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        return None


needs_glibc = pytest.mark.skipif(glibc_version() is None, reason="the heap settings are glibc's mallopt; this libc is not glibc")


def test_default_heap_kept_when_asked(monkeypatch):
    monkeypatch.setenv(heap.OFF_ENV, "1")
    assert heap.keep_freed_memory() is False


@needs_glibc
def test_every_dlcrepro_process_applies_them_before_the_command():
    # `python -m dlcrepro` (every job, the fork server) calls it in __main__, before cli imports torch;
    # in a child process, so that no test worker's own heap is changed
    code = ("import runpy, sys\n"
            "from dlcrepro.run import heap\n"
            "calls = []\n"
            "real = heap.keep_freed_memory\n"
            "def wrapped():\n"
            "    torch_loaded = 'torch' in sys.modules\n"
            "    calls.append((torch_loaded, real()))\n"
            "heap.keep_freed_memory = wrapped\n"
            "sys.argv = ['dlcrepro', '--help']\n"
            "try:\n    runpy.run_module('dlcrepro', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print(calls)\n")
    env = {k: v for k, v in os.environ.items() if k != heap.OFF_ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip().splitlines()[-1] == "[(False, True)]"  # called once, before torch, and applied
