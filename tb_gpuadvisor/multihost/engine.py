"""Where per-host work runs: this machine's processes (``local``) or a Dask cluster (``dask``).

A session's hosts are analysed one job per host (multihost.mapper); an engine runs those
jobs and hands back each result as soon as it exists, so the caller can fold it into the
merge and drop it: peak memory stays at (jobs running at once) x (one host), never the
whole session. A job is tried twice: a worker that dies (killed, out of memory, crashed)
or an exception costs the job one attempt, and a second failure becomes that job's
``Outcome.error`` while the other jobs go on.

Dask is an optional extra (the package's ``dask`` extra, or ``pip install 'dask[distributed]'``): ``distributed`` is imported
only when a DaskEngine is built, and an engine only ever attaches to a running scheduler.
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import os
import threading
from abc import ABC, abstractmethod
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence, TypeVar

from tb_gpuadvisor import cores, heap

J = TypeVar("J")
R = TypeVar("R")

ADDRESS_ENV = "DASK_SCHEDULER_ADDRESS"
# Every job gets this many attempts before its failure is reported.
ATTEMPTS = 2
# How long attaching to a Dask scheduler may take before it counts as unreachable.
CONNECT_TIMEOUT_S = 10.0
# Outcome.error of a job whose worker process died on both attempts.
DIED = "the worker process running it died (killed, out of memory or crashed)"
# Outcome.error of a job no worker could take: the pool broke twice before any job ran.
NO_WORKERS = "no worker process could start (it died before running a job)"
# A pool slot with no job running in it.
_IDLE = -1


class EngineError(Exception):
    """An engine that cannot be built as asked (unknown name, bad option, no scheduler)."""


@dataclass
class Outcome:
    """What became of one job: its value, or why it failed on every attempt."""

    index: int                 # position of the job in the list given to run()
    value: Any = None          # fn(job)
    error: str | None = None   # set when the job failed on both attempts (worker killed, exception)


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


class Engine(ABC):
    """Runs ``fn`` over jobs and yields an Outcome per job as jobs complete (any order)."""

    name: str
    workers: int

    @abstractmethod
    def run(self, fn: Callable[[J], R], jobs: Sequence[J], *, in_process: bool = False) -> Iterator[Outcome]:
        """One Outcome per job as jobs complete. IN_PROCESS: run here (the jobs name things
        only this process can see, e.g. fsspec ``memory://`` files)."""

    @abstractmethod
    def close(self) -> None:
        """Release the workers or the connection; the engine is not used afterwards."""

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _here(fn: Callable[[J], R], jobs: Sequence[J]) -> Iterator[Outcome]:
        """Every job in this process, one after the other, each tried ATTEMPTS times."""
        for index, job in enumerate(jobs):
            error = ""
            for _ in range(ATTEMPTS):
                try:
                    value = fn(job)
                except Exception as err:  # a job's failure is its Outcome, never the caller's
                    error = _describe(err)
                    continue
                yield Outcome(index, value)
                break
            else:
                yield Outcome(index, error=error)


# -- local processes ----------------------------------------------------------------------

# In a pool worker: the shared array of slots (one per worker) and this worker's slot.
# A worker writes the token of the job it runs into its slot before the job and clears it
# after, so when the pool breaks the parent knows exactly which jobs were running.
_SLOT: tuple[Any, int] | None = None


def _claim_slot(slots: Any, taken: Any) -> None:
    """Pool initializer: take the next free slot (and share the cores with the other workers).
    A worker exists to analyse, so its threads share one heap, as the CLI's do (heap.one_heap)."""
    global _SLOT
    heap.one_heap()
    cores.share_with(len(slots))
    with taken.get_lock():
        index = taken.value
        taken.value += 1
    _SLOT = (slots, index)


def _call(fn: Callable[[J], R], job: J, token: int) -> R:
    """Run one job in a pool worker, marking its slot while it runs."""
    assert _SLOT is not None, "_call runs only in a pool worker"
    slots, index = _SLOT
    slots[index] = token
    try:
        return fn(job)
    finally:
        slots[index] = _IDLE


@dataclass
class _Pool:
    """A spawn process pool and the slots its workers mark."""

    executor: ProcessPoolExecutor
    slots: Any

    @classmethod
    def start(cls, workers: int) -> "_Pool":
        # spawn, never fork: TensorBoard's threads (and their locks) must not be copied.
        context = multiprocessing.get_context("spawn")
        slots = context.RawArray("q", [_IDLE] * workers)
        executor = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_claim_slot,
                                       initargs=(slots, context.Value("i", 0)))
        return cls(executor, slots)

    def running(self) -> set[int]:
        """Tokens of the jobs the workers were running (after a break: when it broke)."""
        return {token for token in self.slots if token != _IDLE}


@dataclass
class _Attempt:
    """One submitted attempt of a job."""

    index: int
    token: int
    pool: _Pool


@dataclass
class _Plan:
    """The jobs of one run() still to try, and how often each has failed."""

    failures: list[int]
    shared: deque[int] = field(default_factory=deque)   # run side by side
    alone: deque[int] = field(default_factory=deque)    # were running when a worker died: one at a time

    def spent(self, index: int, error: str) -> Outcome | None:
        """Count a failed attempt of job INDEX: its final Outcome once it has no attempt left."""
        self.failures[index] += 1
        return Outcome(index, error=error) if self.failures[index] >= ATTEMPTS else None


class LocalEngine(Engine):
    """Jobs in a pool of spawned processes on this machine, started on first use and kept.

    Starting an interpreter costs a few tenths of a second, so the pool serves every run()
    (a 64-host session pays it once per worker, not per host). When a worker dies the pool
    breaks: only the jobs that were running then lose an attempt, and each retries alone so
    a second death is charged to the job that caused it; jobs that were only queued are
    resubmitted to a new pool without losing one.
    """

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        if workers is not None and workers < 1:
            raise EngineError(f"workers must be 1 or more (got {workers})")
        self.workers = workers or os.cpu_count() or 1
        self._pool: _Pool | None = None
        self._lock = threading.Lock()
        self._tokens = itertools.count()

    def run(self, fn: Callable[[J], R], jobs: Sequence[J], *, in_process: bool = False) -> Iterator[Outcome]:
        jobs = list(jobs)
        if in_process or len(jobs) <= 1 or self.workers == 1:
            return self._here(fn, jobs)
        return self._pooled(fn, jobs)

    def _pooled(self, fn: Callable[[J], R], jobs: list[J]) -> Iterator[Outcome]:
        plan = _Plan([0] * len(jobs), shared=deque(range(len(jobs))))
        running: dict[Future, _Attempt] = {}
        solo = False                    # a suspect runs alone: nothing joins it
        try:
            while plan.shared or plan.alone or running:
                solo = solo and bool(running)
                if plan.shared and not solo:
                    while plan.shared:
                        self._submit(fn, jobs, plan.shared.popleft(), running)
                elif plan.alone and not running:
                    self._submit(fn, jobs, plan.alone.popleft(), running)
                    solo = True
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    if future not in running:
                        continue        # already settled with its broken pool
                    if isinstance(future.exception(), BrokenProcessPool):
                        yield from self._broken(running[future].pool, running, plan)
                    else:
                        yield from self._settle(future, running.pop(future).index, plan)
        finally:
            for future in running:
                future.cancel()

    @staticmethod
    def _settle(future: Future, index: int, plan: _Plan) -> Iterator[Outcome]:
        """The job's Outcome when it succeeded or is out of attempts, else queue it again."""
        error = future.exception()
        if error is None:
            yield Outcome(index, future.result())
        elif (outcome := plan.spent(index, _describe(error))) is not None:
            yield outcome
        else:
            plan.shared.append(index)

    def _broken(self, pool: _Pool, running: dict[Future, _Attempt], plan: _Plan) -> Iterator[Outcome]:
        """A worker of POOL died: settle every attempt that was in it, retire it."""
        mine = {future: attempt for future, attempt in running.items() if attempt.pool is pool}
        wait(mine)                      # a broken pool fails all its futures at once
        was_running = pool.running()
        self._retire(pool)
        for future, attempt in mine.items():
            del running[future]
            if not isinstance(future.exception(), BrokenProcessPool):
                yield from self._settle(future, attempt.index, plan)
            elif not was_running:
                # No job was running: the workers die as they start, and a new pool would too.
                if (outcome := plan.spent(attempt.index, NO_WORKERS)) is not None:
                    yield outcome
                else:
                    plan.shared.append(attempt.index)
            elif attempt.token not in was_running:
                plan.shared.append(attempt.index)   # only queued when the pool broke: no attempt lost
            elif (outcome := plan.spent(attempt.index, DIED)) is not None:
                yield outcome
            else:
                plan.alone.append(attempt.index)

    def _submit(self, fn: Callable[[J], R], jobs: list[J], index: int, running: dict[Future, _Attempt]) -> None:
        token = next(self._tokens)
        for _ in range(2):              # a pool that broke under another run() is replaced once
            pool = self._current()
            try:
                running[pool.executor.submit(_call, fn, jobs[index], token)] = _Attempt(index, token, pool)
                return
            except BrokenProcessPool:
                self._retire(pool)
        raise BrokenProcessPool("could not start a worker process pool")

    def _current(self) -> _Pool:
        with self._lock:
            if self._pool is None:
                self._pool = _Pool.start(self.workers)
            return self._pool

    def _retire(self, pool: _Pool) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = None
        pool.executor.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.executor.shutdown(wait=True, cancel_futures=True)


# -- a Dask cluster -------------------------------------------------------------------------


class DaskEngine(Engine):
    """Jobs on a running Dask cluster, reached through its scheduler's address.

    Only attaches: a missing or unreachable scheduler is an EngineError, never a cluster
    started here. The scheduler itself may re-run a task whose worker died (its
    ``distributed.scheduler.allowed-failures``); once it gives up (KilledWorker) or the job
    raises, the job is submitted once more before its error is reported.
    """

    name = "dask"

    def __init__(self, address: str | None = None) -> None:
        address = address or os.environ.get(ADDRESS_ENV)
        if not address:
            raise EngineError(f"the dask engine needs a scheduler address: give --address or set {ADDRESS_ENV}")
        try:
            import distributed
        except ImportError:
            raise EngineError("the dask engine needs Dask: pip install 'dask[distributed]' (the package's dask extra)") from None
        self._distributed = distributed
        self.address = address
        try:
            self._client = distributed.Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as err:
            raise EngineError(f"cannot reach the Dask scheduler at {address} (from --address or "
                              f"{ADDRESS_ENV}): {err}") from None

    @property
    def workers(self) -> int:
        """Jobs the cluster runs at once now: its worker threads (workers come and go)."""
        return max(1, sum(self._client.nthreads().values()))

    def run(self, fn: Callable[[J], R], jobs: Sequence[J], *, in_process: bool = False) -> Iterator[Outcome]:
        jobs = list(jobs)
        if in_process:
            return self._here(fn, jobs)
        return self._mapped(fn, jobs)

    def _mapped(self, fn: Callable[[J], R], jobs: list[J]) -> Iterator[Outcome]:
        fn = functools.partial(_one_thread, fn)
        futures = self._client.map(fn, jobs, pure=False)
        live = {future.key: (index, future) for index, future in enumerate(futures)}
        completed = self._distributed.as_completed(futures, loop=self._client.loop)
        del futures                     # results are released as soon as each is yielded
        plan = _Plan([0] * len(jobs))
        try:
            for future in completed:
                index, _ = live.pop(future.key)
                if future.status == "finished":
                    yield Outcome(index, future.result())
                elif (outcome := plan.spent(index, _failure(future))) is not None:
                    yield outcome
                else:
                    retry = self._client.submit(fn, jobs[index], pure=False)
                    live[retry.key] = (index, retry)
                    completed.add(retry)
        finally:
            if live:
                self._client.cancel([future for _, future in live.values()])

    def close(self) -> None:
        self._client.close()


def _one_thread(fn: Callable[[J], R], job: J) -> R:
    """FN(JOB) in a Dask worker, each stage on one thread: Dask runs as many tasks at once as its
    workers have threads, and which tasks share a machine changes as workers come and go."""
    cores.share_with(os.cpu_count() or 1)
    return fn(job)


def _failure(future: Any) -> str:
    """Why a Dask future did not finish: its exception (KilledWorker when workers kept dying)."""
    try:
        return _describe(future.exception())
    except Exception as err:    # cancelled (the scheduler dropped it): asking raises
        return _describe(err)


def _local(address: str | None, workers: int | None) -> Engine:
    if address:
        raise EngineError("a scheduler address is only for the dask engine (--engine dask)")
    return LocalEngine(workers)


def _dask(address: str | None, workers: int | None) -> Engine:
    if workers is not None:
        raise EngineError("--workers sizes the local engine; a Dask cluster's size is set where it is started")
    return DaskEngine(address)


@dataclass(frozen=True)
class EngineKind:
    """A registered engine: how to build it from --address/--workers, what it is (for --help),
    and the environment variable whose presence makes the tab choose it (None: never chosen)."""

    build: Callable[[str | None, int | None], Engine]
    summary: str
    chosen_by_env: str | None = None


# Every engine, by the name --engine takes; the first one is the default. The CLI's flags and
# the tab's choice (from_environment) both read this table.
ENGINES: dict[str, EngineKind] = {
    "local": EngineKind(_local, "this machine's processes (--workers of them, default: every core)"),
    "dask": EngineKind(_dask, "a running Dask cluster (pip install 'dask[distributed]'), attached to at "
                              f"--address or ${ADDRESS_ENV}, never started", chosen_by_env=ADDRESS_ENV),
}


def make_engine(name: str = "local", address: str | None = None, workers: int | None = None) -> Engine:
    """The engine NAME (a key of ENGINES) with its options; EngineError when they do not fit."""
    if name not in ENGINES:
        raise EngineError(f"unknown engine {name!r}: choose one of {', '.join(ENGINES)}")
    return ENGINES[name].build(address, workers)


def from_environment() -> tuple[Engine, str | None]:
    """The engine the tab shares: the first registered engine whose environment variable is set
    (its value is the address), else the default one; with why an engine asked for could not be
    built (the default is used then)."""
    problem = None
    for name, kind in ENGINES.items():
        address = os.environ.get(kind.chosen_by_env) if kind.chosen_by_env else None
        if address:
            try:
                return make_engine(name, address), None
            except EngineError as err:
                problem = str(err)
    return make_engine(next(iter(ENGINES))), problem
