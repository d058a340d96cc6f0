"""An analysis's stages (decode, model, trust, attribution, replay, checks, report): what
each frees is handed back to the system at its end, and each can print where the time went.

Timings are off unless TB_GPUADVISOR_TIMINGS is set (``tb-gpuadvisor analyze -v`` sets it, and worker
processes inherit it), so a slow analysis can be split into decode, model, trust,
attribution, replay, checks and report without a profiler. CPU time is the whole
process's (every thread), which load from other jobs disturbs less than wall time.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Generic, Iterator, TypeVar

from tb_gpuadvisor.heap import return_freed_memory_if_worth

ENV = "TB_GPUADVISOR_TIMINGS"


def enabled() -> bool:
    return bool(os.environ.get(ENV))


@contextmanager
def stage(name: str, what: str = "", hand_back: bool = True) -> Iterator[None]:
    """Run one stage: at its end what it freed goes back to the system when that is much and
    HAND_BACK is set (``heap.return_freed_memory_if_worth``: a large capture's temporaries would
    otherwise stay resident in the heap's free lists, 0.2-0.3 GB of the peak at 978 MB, for about
    5 ms a stage), and its wall and CPU seconds (and WHAT it worked on) are printed when timings
    are on."""
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        if hand_back:
            return_freed_memory_if_worth()
        if enabled():
            print(f"tb-gpuadvisor timing: {name:<11} {time.perf_counter() - wall:7.3f} s wall "
                  f"{time.process_time() - cpu:7.3f} s cpu  pid {os.getpid()}{'  ' + what if what else ''}",
                  file=sys.stderr, flush=True)


T = TypeVar("T")


class Deferred(Generic[T]):
    """A stage's value, computed on first ask by the function the pipeline gave it, once: the
    checks run in threads, and those that do not need the value overlap with its computation."""

    def __init__(self, name: str, compute: Callable[[], T]) -> None:
        self.name = name
        self._compute: Callable[[], T] | None = compute
        self._value: T | None = None
        self._lock = threading.Lock()

    def get(self) -> T:
        with self._lock:
            if self._compute is not None:
                with stage(self.name):
                    self._value = self._compute()
                self._compute = None
        return self._value      # type: ignore[return-value]


class Memo:
    """What one stage derives from the model's tables and asks for again, kept by that stage
    (one Memo per module), never written into the tables. Keyed by the table's ``key``, which
    trust's views of a table share: a value derived from columns other than ``step`` is computed
    once for the model and its views, and goes with the table."""

    def __init__(self) -> None:
        self._tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def of(self, table: Any) -> dict:
        """This stage's values of TABLE, by name (a values that refers back to the table would
        keep it alive: keep only its columns' derivations)."""
        values = self._tables.get(table.key)
        if values is None:
            values = self._tables[table.key] = {}
        return values
