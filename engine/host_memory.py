"""Keeps freed host memory inside the process on glibc Linux.

By default glibc hands every allocation over its dynamic threshold (a few MB) to mmap and gives it
back on free, so each new activation of a CPU prefill (SmolLM2, 2,048 tokens: 13 MB for one
MLP product) is fresh memory that the kernel must fault in and zero, a page at a time. On a 2-vCPU
VM that was 350,000 page faults and 1.5 s of a 6 s prefill. Raising the mmap and trim thresholds
lets freed blocks be reused from the heap instead (the same effect as the MALLOC_MMAP_THRESHOLD_
and MALLOC_TRIM_THRESHOLD_ variables, applied once the process is running).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20   # glibc's cap; larger blocks (a KV pool) still get their own mapping
TRIM_THRESHOLD = 1 << 30


@functools.cache
def keep_freed_memory() -> bool:
    """Whether glibc now keeps freed blocks for reuse; False where the C library is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    mapped = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    return bool(mapped and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
