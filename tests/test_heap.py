"""heap.py: glibc's heap settings are applied where glibc is the libc, and can be turned off."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dlcrepro import heap


def glibc_version() -> str | None:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        return None


needs_glibc = pytest.mark.skipif(glibc_version() is None, reason="the heap settings are glibc's mallopt; this libc is not glibc")


@needs_glibc
def test_settings_apply_under_glibc(monkeypatch):
    monkeypatch.delenv(heap.OFF_ENV, raising=False)
    assert heap.keep_freed_memory() is True


def test_default_heap_kept_when_asked(monkeypatch):
    monkeypatch.setenv(heap.OFF_ENV, "1")
    assert heap.keep_freed_memory() is False


@needs_glibc
def test_every_dlcrepro_process_applies_them_before_the_command():
    # `python -m dlcrepro` (every job, the fork server) calls it in __main__, before cli imports torch
    code = ("import runpy, sys\n"
            "from dlcrepro import heap\n"
            "calls = []\n"
            "real = heap.keep_freed_memory\n"
            "heap.keep_freed_memory = lambda: calls.append('torch' in sys.modules) or real()\n"
            "sys.argv = ['dlcrepro', '--help']\n"
            "try:\n    runpy.run_module('dlcrepro', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print(calls)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[False]"
