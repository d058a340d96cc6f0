"""What this process's memory allocator keeps: settings for glibc's malloc, which the analysis
(big numpy arrays from several threads) reads differently from a long-lived host process.

Every function does nothing, and says so, where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import functools
import os

# glibc's malloc: a process that sets a trim threshold (Dask's workers set MALLOC_TRIM_THRESHOLD_
# to 64 KiB so they hand memory back) also loses the adaptive mmap threshold, and then every
# numpy array over 128 KiB is a fresh mmap whose pages fault in again: the map ran 2.4x slower.
# Arrays up to this size come from the heap again, which is trimmed past twice that. Only such
# a process is tuned: elsewhere glibc's adaptive threshold (up to 32 MiB) reuses more memory
# (on the 978 MB capture, tuning anyway cost 1.9 s more system time and saved 150 MB of RSS).
MMAP_THRESHOLD = 8 << 20
TRIM_SETTING = "MALLOC_TRIM_THRESHOLD_"
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8      # mallopt parameters (malloc.h)
# Below this much free memory in the heap a trim returns little and costs more than it gives back
# (the pages it hands back fault in again): 0.04 s over a 120 MB capture's stages, for 3 MB.
WORTH_TRIMMING = 64 << 20
# Whether this process analyses on one heap (``one_heap``), the only kind whose stages trim it.
_trims_stages = False


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (it has mallopt and malloc_trim), else None: other C
    libraries (macOS, musl) and Windows keep their own allocators' settings."""
    try:
        libc = ctypes.CDLL(None)
    except (OSError, TypeError):
        return None
    if not (hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim")):
        return None
    if hasattr(libc, "mallinfo2"):      # glibc 2.33 and later
        libc.mallinfo2.restype = _MallInfo2
    return libc


@functools.cache
def tune_for_trimming() -> bool:
    """Whether malloc was tuned for mapping hosts in a process that set a trim threshold (a Dask
    worker; see above): once per process, glibc only."""
    libc = _glibc()
    if libc is None or TRIM_SETTING not in os.environ:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(_M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD))


@functools.cache
def one_heap() -> bool:
    """Whether this process's threads now share glibc's main heap (once per process; glibc only).

    By default each thread that allocates gets an arena of its own (up to 8 per core), which
    keeps what its arrays freed for itself: on the 978 MB capture the decode, breakdown, replay
    and check threads held about 400 MB more at the peak, and growing and trimming their heaps
    cost about 0.9 s more system time. The analysis allocates few, large blocks, so sharing one
    lock costs nothing measurable. Called by processes that exist to analyse (the CLI, the
    in-loop analysis, the local engine's pool workers); a process that hosts the plugin
    (TensorBoard) or a Dask worker keeps its own settings.
    """
    global _trims_stages
    libc = _glibc()
    _trims_stages = libc is not None and bool(libc.mallopt(_M_ARENA_MAX, 1))
    return _trims_stages


def return_freed_memory() -> bool:
    """Hand what this process freed back to the system (glibc's malloc_trim; False elsewhere). For a
    long-lived process that analysed in its own threads: their heaps keep freed memory otherwise
    (the TensorBoard process held 0.9-1.2 GB after analysing a 1 GB capture; 0.18 GB after this)."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))


def return_freed_memory_if_worth() -> bool:
    """``return_freed_memory`` when the heap holds WORTH_TRIMMING bytes free or more (glibc's
    mallinfo2; where it has none, always), for the end of each stage of an analysis: a large
    capture's stages leave hundreds of MB of freed temporaries in the heap, a small one's little.

    Only in a process that analyses on one heap (``one_heap``): a Dask worker's heaps are many
    and long-lived, and trimming them at every stage cost the 64-host Dask run 1 s (7.4 against
    6.3 s) for no memory; TensorBoard's process trims once after each analysis instead."""
    libc = _glibc()
    if libc is None or not _trims_stages:
        return False
    if hasattr(libc, "mallinfo2") and libc.mallinfo2().fordblks < WORTH_TRIMMING:
        return False
    return bool(libc.malloc_trim(0))
