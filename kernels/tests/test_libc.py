"""libc.py: the libc calls the runtime makes give their results (Linux; the calls do not exist elsewhere)."""

from __future__ import annotations

import ctypes
import errno
import mmap
import subprocess
import sys

import pytest

from radixlang_kernels import libc

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux calls")


def test_madvise_returns_zero_or_the_errno():
    buf = mmap.mmap(-1, 4 * mmap.PAGESIZE)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    assert libc.madvise_available()
    assert libc.madvise(addr, 4 * mmap.PAGESIZE, mmap.MADV_WILLNEED) == 0
    assert libc.madvise(addr + 1, mmap.PAGESIZE, mmap.MADV_WILLNEED) == errno.EINVAL  # unaligned start


def test_parent_death_signal_is_set_in_the_calling_process():
    code = ("import ctypes, signal; from radixlang_kernels import libc; "
            "assert libc.set_parent_death_signal(signal.SIGKILL); v = ctypes.c_int(); "
            "ctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0); print(v.value)")  # PR_GET_PDEATHSIG
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == 9


def test_mallopt_answers_applied_or_refused():
    assert libc.mallopt(-1, 256 << 20) is True  # M_TRIM_THRESHOLD
    assert libc.mallopt(1, 1 << 20) is False  # M_MXFAST above its maximum: glibc refuses (and changes nothing)
