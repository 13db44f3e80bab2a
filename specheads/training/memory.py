"""Freed memory goes back to the operating system during a long run (glibc).

glibc's allocator serves a request of 128 KB or more with its own ``mmap``, returned to the system when freed, until
the first such block is freed: from then on the threshold rises to the size of the largest freed block (up to 32 MB),
and blocks below it come from the heap, where freed space stays with the process. A training step allocates and
frees tensors of every size from kilobytes to megabytes (rows of different lengths, per-depth logits), so a trainer's
resident memory grows step after step: a one-pass run over a 20 GB feature cache held 10 GB of anonymous memory by
its 261st step and was killed beside another job on a 24 GB machine; with a fixed threshold the same run stays near
2 GB.

:func:`return_freed_memory` fixes the threshold (64 KB) and trims the heap above 1 MB, as the environment variables
``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` would; a threshold the user set in the environment is left
alone, and another C library is left as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 64 * 1024
TRIM_THRESHOLD = 1024 * 1024


def return_freed_memory() -> bool:
    """Make glibc return every freed block of 64 KB or more to the system (a fixed mmap threshold, the heap trimmed
    above 1 MB). Returns whether it applied: False under another C library, or where ``MALLOC_MMAP_THRESHOLD_`` is
    set in the environment (the user's choice stands)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    applied = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    return applied
