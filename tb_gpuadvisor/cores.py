"""How many threads a stage of one analysis may use.

An analysis alone on a machine overlaps its numpy and C work (which release the GIL) on
several threads. When it is one of several worker processes sharing the cores (the local
engine of tb_gpuadvisor.multihost runs one per core), extra threads only contend with the
other workers, so each worker is told its share of the cores.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")
_sharing = 1        # processes of this job sharing the machine's cores
# A stage's devices (trust's step columns, the breakdown, the replay) go on threads, up to this many.
DEVICE_THREADS = 4


def share_with(processes: int) -> None:
    """This process is one of PROCESSES working at once (a pool worker says so when it starts)."""
    global _sharing
    _sharing = max(1, processes)


def threads(most: int) -> int:
    """Threads for a stage that can use up to MOST: one per core of this process's share (all
    of them when it has the machine to itself). Two per core overlapped nothing more and held
    twice the devices' temporaries at once (978 MB capture, 2 cores: peak RSS 40 MB higher,
    wall 0.2-0.3 s longer, measured in turn)."""
    cores = max(1, (os.cpu_count() or 1) // _sharing)
    return max(1, min(most, cores))


def on_threads(work: Callable[..., T], items: Iterable[tuple], most: int = DEVICE_THREADS) -> list[T]:
    """WORK(*item) for every item (one per device, say), in order: on up to MOST threads when
    there are several (numpy work that releases the GIL), else in this thread."""
    items = list(items)
    if len(items) < 2 or threads(most) < 2:
        return [work(*item) for item in items]
    with ThreadPoolExecutor(max_workers=threads(most)) as pool:
        return list(pool.map(lambda item: work(*item), items))


def beside(side: Callable[[], object], work: Callable[[], T]) -> T:
    """WORK's value, with SIDE started first on a thread of its own when this process has more
    than one core: work that WORK does not need, asked for again by whoever needs it (a
    ``stages.Deferred``'s ``get``, which waits for that thread, or raises SIDE's error there)."""
    if threads(2) > 1:
        threading.Thread(target=_quietly, args=(side,), daemon=True).start()
    return work()


def _quietly(side: Callable[[], object]) -> None:
    try:
        side()
    except Exception:       # noqa: BLE001 - whoever needs it asks again, and it raises there
        pass
