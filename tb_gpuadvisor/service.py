"""The plain functions behind the Advisor routes.

Routes in `plugin.py` only translate HTTP to calls on `AdvisorService`:
listing sessions, answering a report (from cache, or "pending" while a worker
analyzes it or while the profiler is still writing one of its files) and comparing
two sessions.  Everything here works on file paths
and dicts, so it is tested without a web server.

Safety: every run/session/host value comes from the URL.  It is checked as a
name (not absolute, no `..` component, no NUL) before any path is built, and
the resolved capture folder must lie inside one of the log roots; only then
is anything stat'ed or read.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from tb_gpuadvisor.input import discovery

if TYPE_CHECKING:
    from tb_gpuadvisor.multihost.engine import Engine

log = logging.getLogger("tb_gpuadvisor")

# Analyzing a session is CPU-bound and protobuf parsing holds the GIL; two
# workers keep one slow capture from blocking the others without starving the
# TensorBoard request threads on small machines.
DEFAULT_WORKERS = 2
# How long a report request waits for a fresh analysis before answering 202:
# a small capture then comes back in the first response, a big one is polled.
DEFAULT_WAIT_S = 1.0
# Finished reports kept in memory (each is a few tens of kB of JSON).
CACHE_SIZE = 64
# Used for progress estimates until the first analysis has been timed.
INITIAL_BYTES_PER_S = 2e6
# Analyses waiting for a worker; more requests for new sessions get 503 until some finish.
MAX_QUEUED = 16
# A queued analysis nobody has asked about for this long is dropped when its turn comes.
ABANDONED_S = 60.0
# A session with a host file the profiler is still writing is answered "being written" (202),
# and read again on the first request this long after the last read: never a cached error.
RECHECK_WRITING_S = 2.0

# Sessions whose analysis is held in this process to draw their steps (each keeps its capture's
# events: the report cache keeps only JSON); the least recently drawn goes first.
HELD_SESSIONS = 2

Analyzer = Callable[[Any], dict]
_URL_RE = re.compile(r"[a-zA-Z][0-9a-zA-Z.]*://")


class BadRequest(ValueError):
    """A request value is malformed or tries to leave the log directory (HTTP 400)."""


class NotFound(LookupError):
    """The run, session or host does not exist (HTTP 404)."""


class Busy(RuntimeError):
    """Too many analyses are queued already (HTTP 503); the client retries later."""


class NotComparable(ValueError):
    """One of two sessions to compare could not be analysed at all (HTTP 422): a comparison
    would list checks nobody measured. ``side``: which one ("base" or "new")."""

    def __init__(self, why: str, side: str) -> None:
        super().__init__(why)
        self.side = side


class Unavailable(RuntimeError):
    """A remote log root cannot be searched (HTTP 503); the message says what to install or fix."""


@dataclasses.dataclass(frozen=True)
class LogRoot:
    """One directory TensorBoard was pointed at.

    `prefix` is the run-name prefix TensorBoard gives that directory's runs:
    empty for `--logdir`, the group name for `--logdir_spec name:path`.
    """

    prefix: str
    path: str


@dataclasses.dataclass(frozen=True)
class Pending:
    """An analysis that has not finished yet; `progress` goes to the client."""

    progress: dict


def being_written(session: dict) -> str | None:
    """Why a host file of SESSION is one the profiler is still writing ("worker0: being written: ..."),
    or None: the report of such a session is not final."""
    return next((f"{e['host']}: {e['message']}" if e.get("host") else e["message"]
                 for e in session.get("errors") or [] if e.get("being_written")), None)


def roots_from_flags(logdir: str | None, logdir_spec: str | None) -> list[LogRoot]:
    """Log roots for `--logdir DIR` or `--logdir_spec [name:]DIR,...`.

    TensorBoard leaves `context.logdir` empty when only `--logdir_spec` is
    given, so the spec is parsed here with the flag's documented rules: a
    leading `name:` names the group unless the entry starts with `/` or is a
    URL or a Windows drive path.
    """
    if logdir:
        return [LogRoot("", _normalize_root(logdir))]
    roots: list[LogRoot] = []
    for entry in (logdir_spec or "").split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, path = "", entry
        if (
            ":" in entry
            and not entry.startswith("/")
            and not _URL_RE.match(entry)
            and not os.path.splitdrive(entry)[0]
        ):
            name, _, path = entry.partition(":")
        roots.append(LogRoot(name.strip("/"), _normalize_root(path)))
    return roots


def _normalize_root(path: str) -> str:
    if path.startswith("file://"):
        path = path[len("file://"):]
    if "://" in path:
        return path
    return os.path.realpath(os.path.expanduser(path))


def check_name(kind: str, value: str | None, allow_slash: bool = True) -> str:
    """Returns `value` if it is a safe relative name, else raises BadRequest.

    Rejected before any file system access (see discovery.check_component): missing
    or empty values, absolute paths (POSIX, UNC, drive letters or URLs), any `..`
    component, backslashes and NUL bytes.
    """
    if value is None or value == "":
        raise BadRequest(f"missing {kind}")
    try:
        discovery.check_component(value, kind, allow_slash)
    except discovery.UnsafePathError as exc:
        raise BadRequest(str(exc)) from None
    return value


def canonical_run(run: str) -> str:
    """One spelling per run ("./a", "a/", "a//b" are "a", "a", "a/b"), so each has one cache entry."""
    return "/".join(part for part in run.split("/") if part not in ("", ".")) or "."


def _join_run(prefix: str, run: str) -> str:
    if not prefix:
        return run
    return prefix if run in ("", ".") else f"{prefix}/{run}"


def _split_run(root: LogRoot, run: str) -> str | None:
    """The run name inside `root`, or None when `run` is not one of its runs."""
    if not root.prefix:
        return run
    if run == root.prefix:
        return "."
    if run.startswith(root.prefix + "/"):
        return run[len(root.prefix) + 1:]
    return None


@dataclasses.dataclass
class _Job:
    """One analysis, finished or not, for one (session, hosts, files) state."""

    key: tuple
    fingerprint: tuple
    future: Future
    submitted: float
    started: float | None = None
    asked: float = 0.0                  # when a client last asked for it
    task: Future | None = None          # the worker pool's handle, to cancel it while queued
    finished: float | None = None
    writing: str | None = None          # why a host file is still being written, for the client

    def stale(self, now: float) -> bool:
        """Whether this finished analysis met a file still being written long enough ago to read it again."""
        return self.writing is not None and self.finished is not None and now - self.finished >= RECHECK_WRITING_S

    @property
    def size_bytes(self) -> int:
        """Bytes to analyze, from the (host, size, mtime) fingerprint; unknown sizes count 0."""
        return sum(max(size, 0) for _, size, _ in self.fingerprint)


class AdvisorService:
    """Session listing, cached analyses and comparisons for a set of log roots."""

    def __init__(
        self,
        roots: Sequence[LogRoot],
        *,
        workers: int = DEFAULT_WORKERS,
        wait_s: float = DEFAULT_WAIT_S,
        analyze: Analyzer | None = None,
        analysed: Callable[[Any], Any] | None = None,
    ) -> None:
        self._roots = list(roots)
        self._wait_s = wait_s
        self._analyze = analyze
        self._analysed = analysed
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpu_advisor")
        self._lock = threading.Lock()
        self._jobs: OrderedDict[tuple, _Job] = OrderedDict()
        self._bytes_per_s = INITIAL_BYTES_PER_S
        self._engine: Engine | None = None
        self._engine_lock = threading.Lock()   # apart from _lock: attaching to Dask can take seconds

    # -- listing ----------------------------------------------------------------

    def runs(self) -> list[dict]:
        """Every session under the roots: [{"run", "session", "hosts"}], sorted.

        Raises Unavailable when nothing is listed because a remote root cannot be searched, and
        NotFound when no root exists at all (a mistyped --logdir, or training not started yet).
        """
        failed: list[str] = []
        listed = [
            {"run": _join_run(root.prefix, ref.run), "session": ref.session, "hosts": list(ref.hosts)}
            for root, ref in self._sessions(failed)
        ]
        if not listed and failed:
            raise Unavailable("; ".join(failed))
        if not listed and self._roots and all("://" not in r.path and not os.path.exists(r.path) for r in self._roots):
            raise NotFound(f"{', '.join(r.path for r in self._roots)}: no such folder (yet)")
        listed.sort(key=lambda item: (item["run"], item["session"]))
        return listed

    def has_sessions(self) -> bool:
        """True once a root holds a capture file, or a remote root fails (the tab shows why);
        lists files, never parses them."""
        failed: list[str] = []
        return any(True for _ in self._sessions(failed)) or bool(failed)

    def _sessions(self, failed: list[str]) -> Iterator[tuple[LogRoot, discovery.SessionRef]]:
        """(root, session) pairs, one root at a time; unreadable roots are skipped, and why a
        remote root cannot be searched goes to FAILED."""
        for root in self._roots:
            try:
                refs = discovery.find_sessions(root.path)
            except discovery.StoreError as exc:
                failed.append(str(exc))
                continue
            except (discovery.DiscoveryError, OSError):
                continue
            for ref in refs:
                yield root, ref

    # -- resolving ---------------------------------------------------------------

    def resolve(self, run: str | None, session: str | None, host: str | None = None) -> discovery.SessionRef:
        """The SessionRef for URL values, restricted to `host` when one is given.

        Its `run` is the name the client listed (with the root's prefix), so
        reports carry the name the client asked for.

        Raises BadRequest for unsafe values (nothing is touched on disk) and
        NotFound for names that are safe but unknown (Unavailable when a remote root that
        could hold them cannot be searched).
        """
        run = canonical_run(check_name("run", run))
        session = check_name("session", session, allow_slash=False)
        if host is not None:
            host = check_name("host", host, allow_slash=False)
        failed: list[str] = []
        for root in self._roots:
            inner = _split_run(root, run)
            if inner is None:
                continue
            try:
                ref = discovery.resolve_session(root.path, inner, session)
            except discovery.UnsafePathError as exc:
                raise BadRequest(str(exc)) from exc
            except discovery.StoreError as exc:
                failed.append(str(exc))
                continue
            except LookupError:
                continue
            if host is None:
                return dataclasses.replace(ref, run=run)
            if host not in ref.hosts:
                raise NotFound(f"unknown host {host!r} in {run}/{session}")
            return dataclasses.replace(ref, run=run, hosts=(host,))
        if failed:
            raise Unavailable("; ".join(failed))
        raise NotFound(f"unknown run/session {run}/{session}")

    # -- reports -------------------------------------------------------------------

    def report(self, run: str | None, session: str | None, host: str | None = None) -> dict | Pending:
        """The session object for run/session (one host or all), or Pending."""
        ref = self.resolve(run, session, host)
        job = self._job_for(ref, host)
        return self._outcome(job, self._wait_s)

    def compare(
        self,
        run: str | None,
        session: str | None,
        base_run: str | None,
        base_session: str | None,
    ) -> dict | Pending:
        """compare_sessions(base, new) once both analyses are done, else Pending; NotComparable
        when either could not be analysed."""
        new_ref = self.resolve(run, session)
        base_ref = self.resolve(base_run, base_session)
        new_job = self._job_for(new_ref, None)
        base_job = self._job_for(base_ref, None)
        deadline = time.monotonic() + self._wait_s
        new = self._outcome(new_job, self._wait_s)
        base = self._outcome(base_job, max(0.0, deadline - time.monotonic()))
        pending = [item for item in (new, base) if isinstance(item, Pending)]
        if pending:
            return Pending(min((p.progress for p in pending), key=lambda p: p["fraction"]))
        from tb_gpuadvisor.compare import compare_sessions, refusal, refused_side

        why = refusal(base, new)
        if why:
            raise NotComparable(why, refused_side(base, new) or "new")
        return compare_sessions(base, new)

    def timeline(self, run: str | None, session: str | None, step: str | None) -> dict | Pending:
        """The drawable form of one step of run/session (stepview; STEP as the program numbered
        it, absent: the representative step), or Pending while the session is analysed in this
        process. Once analysed, a step is cut from the held analysis (HELD_SESSIONS)."""
        ref = self.resolve(run, session)
        number = None
        if step not in (None, ""):
            try:
                number = int(step)
            except ValueError:
                raise BadRequest(f"step must be a step number, not {step!r}") from None
        result = self._outcome(self._job_for(ref, None, held=True), self._wait_s)
        if isinstance(result, Pending):
            return result
        if isinstance(result, dict):        # the analysis failed: its error session says why
            raise NotFound("; ".join(e["message"] for e in result.get("errors") or []) or "no analysis")
        from tb_gpuadvisor.stepview import StepNotFound

        try:
            return result.timeline(number)
        except StepNotFound as exc:
            raise NotFound(str(exc)) from None

    def _job_for(self, ref: discovery.SessionRef, host: str | None, held: bool = False) -> _Job:
        """The cached job for this session state, or a newly submitted one; HELD: the session's
        analysis kept in this process to draw its steps, not its report."""
        stamp = ref.stat_key()
        key = (ref.run, ref.session, host, held)
        now = time.monotonic()
        with self._lock:
            job = self._jobs.get(key)
            if job is not None and job.fingerprint == stamp and not job.stale(now):
                self._jobs.move_to_end(key)
                job.asked = now
                return job
            if sum(1 for j in self._jobs.values() if j.started is None) >= MAX_QUEUED:
                raise Busy(f"{MAX_QUEUED} analyses are already queued; retry in a few seconds")
            if job is not None:
                self._cancel(job)       # an older state of the files: nobody will wait for it
            job = _Job(key, stamp, Future(), now, asked=now)
            self._jobs[key] = job
            self._jobs.move_to_end(key)
            while len(self._jobs) > CACHE_SIZE:
                self._cancel(self._jobs.popitem(last=False)[1])
            if held:
                kept = [k for k in self._jobs if k[3]]
                for old in kept[:max(0, len(kept) - HELD_SESSIONS)]:
                    self._cancel(self._jobs.pop(old))
            job.task = self._pool.submit(self._run_job, job, ref, held)
        return job

    @staticmethod
    def _cancel(job: _Job) -> None:
        """Drop a queued job's work; a running or finished one is left alone."""
        if job.task is not None and job.started is None:
            job.task.cancel()

    def _run_job(self, job: _Job, ref: discovery.SessionRef, held: bool) -> None:
        with self._lock:
            if time.monotonic() - job.asked > ABANDONED_S:
                # Nobody polled for it while it queued: forget it (a new request starts it again).
                if self._jobs.get(job.key) is job:
                    del self._jobs[job.key]
                return
            job.started = time.monotonic()
        try:
            result = (self._holder() if held else self._analyzer())(ref)
        except Exception as exc:  # analyze_session should not raise; keep the tab alive if it does
            from tb_gpuadvisor.multihost.merge import failed_session

            result = failed_session(ref, [{"message": f"analysis failed: {type(exc).__name__}: {exc}"}])
        job.finished = time.monotonic()
        job.writing = being_written(result) if isinstance(result, dict) else None
        elapsed = job.finished - job.started
        if elapsed > 0.05 and job.size_bytes and job.writing is None:
            with self._lock:
                self._bytes_per_s = 0.5 * self._bytes_per_s + 0.5 * (job.size_bytes / elapsed)
        job.future.set_result(result)

    def _analyzer(self) -> Analyzer:
        if self._analyze is None:
            from tb_gpuadvisor.multihost import analyze_session
            from tb_gpuadvisor.heap import return_freed_memory

            engine = self._shared_engine()

            def analyze(ref: discovery.SessionRef) -> dict:
                # TensorBoard's process lives on after the analysis: what the analysis freed goes
                # back to the system (malloc kept about 1 GB of a 1 GB capture's arrays otherwise).
                try:
                    return analyze_session(ref, engine=engine)
                finally:
                    return_freed_memory()

            self._analyze = analyze
        return self._analyze

    def _holder(self) -> Callable[[Any], Any]:
        """What analyses a session in this process and keeps it (pipeline.analysed_session)."""
        if self._analysed is None:
            from tb_gpuadvisor.pipeline import analysed_session

            self._analysed = analysed_session
        return self._analysed

    def _shared_engine(self) -> Engine:
        """The engine every analysis shares, made on first use: the one the environment names
        (multihost.engine.from_environment: a Dask cluster when $DASK_SCHEDULER_ADDRESS is set,
        attached to, never started), else this machine's processes; an engine that cannot be
        built is logged and the tab works locally."""
        from tb_gpuadvisor.multihost.engine import from_environment

        with self._engine_lock:
            if self._engine is None:
                self._engine, problem = from_environment()
                if problem:
                    log.warning("gpu_advisor: analysing on this machine instead: %s", problem)
            return self._engine

    def _outcome(self, job: _Job, wait_s: float) -> dict | Pending:
        try:
            result = job.future.result(timeout=wait_s)
        except FutureTimeout:
            return Pending(self._progress(job))
        if job.writing is not None:
            return Pending(dict(self._progress(job), stage="writing", fraction=0.0, message=job.writing))
        return result

    def _progress(self, job: _Job) -> dict:
        """What the client shows while waiting; `fraction` is an estimate from bytes."""
        now = time.monotonic()
        stage, fraction = "queued", 0.0
        if job.started is not None:
            expected = max(job.size_bytes / self._bytes_per_s, 0.1)
            stage, fraction = "analyzing", round(min(0.95, (now - job.started) / expected), 3)
        return {"stage": stage, "elapsed_s": round(now - job.submitted, 2),
                "bytes": job.size_bytes, "fraction": fraction}

    def close(self) -> None:
        """Stops the workers (tests; TensorBoard never unloads plugins)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._engine_lock:
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()

