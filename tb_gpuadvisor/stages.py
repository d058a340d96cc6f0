"""Where one analysis spends its time: wall and CPU seconds of each stage on stderr.

Off unless TB_GPUADVISOR_TIMINGS is set (``tb-gpuadvisor analyze -v`` sets it, and worker
processes inherit it), so a slow analysis can be split into decode, model, trust,
attribution, replay, checks and report without a profiler. CPU time is the whole
process's (every thread), which load from other jobs disturbs less than wall time.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Iterator

ENV = "TB_GPUADVISOR_TIMINGS"


def enabled() -> bool:
    return bool(os.environ.get(ENV))


@contextmanager
def timed(stage: str, what: str = "") -> Iterator[None]:
    """Print STAGE's wall and CPU seconds (and WHAT it worked on) when timings are on."""
    if not enabled():
        yield
        return
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        print(f"tb-gpuadvisor timing: {stage:<11} {time.perf_counter() - wall:7.3f} s wall "
              f"{time.process_time() - cpu:7.3f} s cpu  pid {os.getpid()}{'  ' + what if what else ''}",
              file=sys.stderr, flush=True)
