"""Reuse of large freed buffers in an in-process run (glibc's ``malloc`` settings).

An in-process federation moves every message through the codec, so a run with big messages
allocates and frees buffers of tens of megabytes again and again: HyFDCA segment mode's setup on
MNIST binary at batch 512 makes about six 42 MB buffers per holder (its packed Gram vector, the
ciphertext, the encoded message, the server's decoded copy and sum, the holder's decoded copy)
and 80 MB of batch Gram matrices. By default glibc serves each block above its mmap threshold
(128 KiB, rising to at most 32 MiB, so always the 42 MB ones) from a
fresh ``mmap`` and unmaps it when it is freed, so every buffer costs its first-touch page faults
again: measured here (the second run in a process), 0.6 s of a 2.0-2.1 s setup; 1.2-1.4 s of
the first run's 3.8-4.0 s.

:func:`keep_freed_memory` asks glibc (``mallopt``) to serve large blocks from the heap
(``M_MMAP_MAX`` 0), to keep freed memory for reuse instead of returning it to the system
(``M_TRIM_THRESHOLD`` 2 GiB, the largest ``int``) and to grow the heap in steps of 256 MiB
(``M_TOP_PAD``). The process's peak memory then stays allocated until it exits; the peak itself
barely moves (3.05 GB against 2.97 GB maximum resident size in that run).
:func:`~hybridfl.runtime.simulation.simulate` and
:func:`~hybridfl.runtime.simulation.simulate_directories` call it once per process, before the
setup (not at import: importing hybridfl changes nothing). It does
nothing outside glibc (macOS, musl) or when the environment variable ``HYBRIDFL_MALLOC`` is
``default``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4  # glibc's malloc.h
SETTINGS = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1), (M_TOP_PAD, 256 << 20))
"""``(mallopt parameter, value)`` pairs that :func:`keep_freed_memory` sets, in order."""
OPT_OUT = "HYBRIDFL_MALLOC"


@functools.cache
def keep_freed_memory() -> bool:
    """Apply :data:`SETTINGS` with glibc's ``mallopt``, once per process. Returns whether they are
    in effect (False outside glibc, with ``HYBRIDFL_MALLOC=default``, or when ``mallopt`` refuses
    one). Never raises."""
    if os.environ.get(OPT_OUT, "").strip().lower() == "default" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return all(libc.mallopt(ctypes.c_int(p), ctypes.c_int(v)) == 1 for p, v in SETTINGS)
    except (OSError, AttributeError, ValueError, OverflowError):
        return False
