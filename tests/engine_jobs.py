"""Jobs for tests/test_engine.py, in their own module so spawned workers (and Dask's) can import them."""

from __future__ import annotations

import os
import time

# How risky() misbehaves: on its first attempt only, or on every attempt.
FAULTS = ("raise_once", "raise_always", "die_once", "die_always")


def pid_after(seconds: float) -> int:
    """The worker's pid, after holding the worker SECONDS (so every worker gets a job)."""
    time.sleep(seconds)
    return os.getpid()


def index_after(job: tuple[int, float]) -> int:
    """The job's own index, after SECONDS: lets a test decide which job finishes last."""
    index, seconds = job
    time.sleep(seconds)
    return index


def risky(job: tuple[str, str, int]) -> int:
    """VALUE, unless FAULT says to raise or to kill the worker process (os._exit, as the OOM
    killer would). The first attempt is told apart by creating MARKER, which later attempts
    find; "ok" jobs take a moment, so they are running when another job kills its worker."""
    fault, marker, value = job
    try:
        with open(marker, "x"):
            first = True
    except FileExistsError:
        first = False
    if fault == "ok":
        time.sleep(0.3)
        return value
    if first or fault.endswith("_always"):
        if fault.startswith("die"):
            time.sleep(0.1)
            os._exit(17)
        raise ValueError(f"job {value} failed")
    return value


def die_at_start(*_: object) -> None:
    """A pool initializer that kills its worker, as a worker that cannot start (its interpreter
    cannot import the program, or the machine has no memory left) dies."""
    os._exit(3)


def stage_threads(seconds: float) -> int:
    """How many threads a stage of the analysis may use in this worker (after holding it)."""
    from tb_gpuadvisor import cores

    time.sleep(seconds)
    return cores.threads(4)
