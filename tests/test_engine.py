"""Engines that run per-host jobs: local processes and a Dask cluster; the CLI and service wiring."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest
from engine_jobs import index_after, pid_after, risky
from synth import build_training_session

from tb_gpuadvisor import cli, multihost, service
from tb_gpuadvisor.multihost.engine import (
    DIED, ENGINES, DaskEngine, Engine, EngineError, LocalEngine, make_engine,
)


@pytest.fixture
def local():
    engine = LocalEngine(workers=2)
    yield engine
    engine.close()


def _jobs(tmp_path, *faults: str) -> list[tuple[str, str, int]]:
    """risky() jobs with FAULTS, valued 0, 1, 2... and each with its own marker file."""
    return [(fault, str(tmp_path / f"attempted-{value}"), value) for value, fault in enumerate(faults)]


def _by_index(outcomes) -> dict[int, tuple]:
    return {o.index: (o.value, o.error) for o in outcomes}


# -- local ----------------------------------------------------------------------------------


def test_local_yields_results_as_jobs_complete(local):
    # Job 0 is slow: the others must come back before it, not in the order given.
    seen = [o.index for o in local.run(index_after, [(0, 1.5), (1, 0.0), (2, 0.0), (3, 0.0)])]
    assert sorted(seen) == [0, 1, 2, 3]
    assert seen[-1] == 0


def test_local_gives_every_result_with_its_index(local):
    outcomes = list(local.run(abs, range(-6, 0)))
    assert {o.index: o.value for o in outcomes} == {i: 6 - i for i in range(6)}
    assert all(o.error is None for o in outcomes)
    assert list(local.run(abs, [])) == []


def test_in_process_runs_here_without_a_pool(local):
    here = os.getpid()
    assert {o.value for o in local.run(pid_after, [0.0, 0.0, 0.0], in_process=True)} == {here}
    assert [o.value for o in local.run(pid_after, [0.0])] == [here]          # one job: no pool either
    assert [o.value for o in LocalEngine(workers=1).run(pid_after, [0.0, 0.0])] == [here, here]
    assert local._pool is None


def test_pool_is_started_once_and_reused(local):
    first = {o.value for o in local.run(pid_after, [0.3] * 4)}
    second = {o.value for o in local.run(pid_after, [0.3] * 4)}
    assert len(first) == 2 and os.getpid() not in first
    assert second <= first


def test_job_that_raises_once_is_retried_and_one_that_always_raises_is_reported(local, tmp_path):
    got = _by_index(local.run(risky, _jobs(tmp_path, "raise_once", "raise_always", "ok")))
    assert got[0] == (0, None) and got[2] == (2, None)
    assert got[1] == (None, "ValueError: job 1 failed")


def test_worker_killed_on_first_attempt_is_retried(local, tmp_path):
    got = _by_index(local.run(risky, _jobs(tmp_path, "ok", "die_once", "ok", "ok")))
    assert got == {i: (i, None) for i in range(4)}


def test_job_that_always_kills_its_worker_is_reported_and_others_finish(local, tmp_path):
    # The "ok" jobs are running beside the killer when it dies: they must not be blamed.
    got = _by_index(local.run(risky, _jobs(tmp_path, "ok", "die_always", "ok", "ok", "ok")))
    assert got.pop(1) == (None, DIED)
    assert got == {i: (i, None) for i in (0, 2, 3, 4)}
    # The broken pool was replaced: the engine still works.
    assert [o.value for o in local.run(abs, [-1, -2])] in ([1, 2], [2, 1])


def test_workers_that_cannot_start_fail_the_jobs_instead_of_retrying_forever(local, monkeypatch):
    """Workers that die before running anything broke the pool; the queued jobs lost no attempt,
    so a new pool was started forever (12,201 dead workers in a minute, seen with a script read
    from stdin, which spawned workers cannot import). Two such breaks now end each job."""
    from tb_gpuadvisor.multihost import engine as engine_module
    from engine_jobs import die_at_start

    monkeypatch.setattr(engine_module, "_claim_slot", die_at_start)
    got = _by_index(local.run(abs, [-1, -2, -3]))
    assert got == {i: (None, engine_module.NO_WORKERS) for i in range(3)}


def test_in_process_retries_a_failing_job_once(local, tmp_path):
    got = _by_index(local.run(risky, _jobs(tmp_path, "raise_once", "raise_always"), in_process=True))
    assert got == {0: (0, None), 1: (None, "ValueError: job 1 failed")}


def test_make_engine_validates_its_arguments(monkeypatch):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    for name in ENGINES:        # the CLI's --engine takes exactly the registered names
        assert cli.parser().parse_args(["analyze", "logs", "--engine", name]).engine == name
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["analyze", "logs", "--engine", "spark"])
    engine = make_engine("local", workers=3)
    assert (engine.name, engine.workers) == ("local", 3)
    assert make_engine().workers == os.cpu_count()
    for name, kwargs, says in [("spark", {}, "unknown engine 'spark'"),
                               ("local", {"address": "tcp://x:1"}, "only for the dask engine"),
                               ("local", {"workers": 0}, "1 or more"),
                               ("dask", {"workers": 2}, "--workers"),
                               ("dask", {}, "DASK_SCHEDULER_ADDRESS")]:
        with pytest.raises(EngineError, match=says):
            make_engine(name, **kwargs)


def test_importing_the_engine_does_not_import_dask():
    code = ("import sys, tb_gpuadvisor.multihost.engine, tb_gpuadvisor.cli\n"
            "assert not [m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')]\n")
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, PYTHONPATH=os.getcwd()))


# -- dask -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    """A two-worker LocalCluster whose scheduler gives up on a task at its first dead worker
    (allowed-failures 0) and hands each worker one task at a time, so the engine's own retry
    is what brings a killed job back and a death is charged to the job that caused it."""
    distributed = pytest.importorskip("distributed")
    import dask

    with dask.config.set({"distributed.scheduler.allowed-failures": 0,
                          "distributed.scheduler.worker-saturation": 1.0}):
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                      dashboard_address=":0") as running:
            yield running


@pytest.fixture
def dask_engine(cluster):
    engine = DaskEngine(cluster.scheduler_address)
    yield engine
    engine.close()


def test_dask_runs_every_job(dask_engine, tmp_path):
    assert (dask_engine.name, dask_engine.workers) == ("dask", 2)
    got = _by_index(dask_engine.run(risky, _jobs(tmp_path, "ok", "ok", "ok", "raise_once")))
    assert got == {i: (i, None) for i in range(4)}
    assert list(dask_engine.run(abs, [])) == []


def test_dask_retries_a_job_whose_worker_was_killed(dask_engine, tmp_path):
    got = _by_index(dask_engine.run(risky, _jobs(tmp_path, "ok", "die_once", "ok", "ok")))
    assert got == {i: (i, None) for i in range(4)}


def test_dask_reports_a_job_that_always_kills_and_keeps_the_rest(dask_engine, tmp_path):
    got = _by_index(dask_engine.run(risky, _jobs(tmp_path, "ok", "die_always", "ok", "raise_always")))
    assert got.pop(1)[1].startswith("KilledWorker")
    assert got.pop(3) == (None, "ValueError: job 3 failed")
    assert got == {0: (0, None), 2: (2, None)}


def test_dask_tasks_run_their_stages_on_one_thread(dask_engine):
    """Dask runs a task per worker thread; a task's stages must not start threads for the whole
    machine on top (the 64-host Dask run took 22.3 s with them, 20.4 s without; see
    benchmarks/README.md)."""
    from engine_jobs import stage_threads

    assert {o.value for o in dask_engine.run(stage_threads, [0.2, 0.2])} == {1}


def test_pytorch_ranks_map_on_dask_as_on_the_local_pool(dask_engine, local, tmp_path):
    """Issue 23: the ranks of a PyTorch session (one trace file each) go through the per-host map
    like XPlane hosts; the Dask cluster and the local pool give the same session."""
    from synth_kineto import kineto_trace, write_trace
    from tb_gpuadvisor.input.discovery import find_sessions

    for rank, kernel_us in ((0, 400.0), (1, 500.0)):
        write_trace(tmp_path / "run" / f"rank-{rank}.pt.trace.json", kineto_trace(steps=4, kernel_us=kernel_us))
    (ref,) = find_sessions(str(tmp_path))
    on_dask = multihost.analyze_session(ref, dask_engine)
    assert on_dask["framework"] == "pytorch" and on_dask["hosts"] == ["rank-0", "rank-1"]
    assert on_dask["errors"] == []
    assert on_dask == multihost.analyze_session(ref, local)


def test_dask_engine_never_starts_a_scheduler(monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    with pytest.raises(EngineError, match="DASK_SCHEDULER_ADDRESS"):
        DaskEngine()
    monkeypatch.setattr("tb_gpuadvisor.multihost.engine.CONNECT_TIMEOUT_S", 0.5)
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "tcp://127.0.0.1:9")     # nothing listens there
    started = time.monotonic()
    with pytest.raises(EngineError, match="cannot reach the Dask scheduler at tcp://127.0.0.1:9"):
        DaskEngine()
    assert time.monotonic() - started < 10


# -- CLI ----------------------------------------------------------------------------------------


@pytest.fixture
def logdir(tmp_path):
    build_training_session(steps=3).write(tmp_path, "train", "s1")
    return tmp_path


@pytest.fixture
def engines_seen(monkeypatch):
    """The engines cmd_analyze/cmd_compare hand to the analysis, with whether each was closed by then."""
    seen: list[Engine] = []

    def build_report(refs, jobs, engine=None):
        seen.append(engine)
        return {"schema_version": 1, "sessions": []}

    def analyze_session(ref, engine=None):
        seen.append(engine)
        return multihost.failed_session(ref, [{"message": "not analysed in this test"}])

    monkeypatch.setattr(multihost, "build_report", build_report)
    monkeypatch.setattr(multihost, "analyze_session", analyze_session)
    closed = []
    monkeypatch.setattr(LocalEngine, "close", lambda self: closed.append(self))
    return seen, closed


def test_cli_engine_flags_reach_the_analysis(logdir, capsys, engines_seen):
    seen, closed = engines_seen
    assert cli.main(["analyze", str(logdir), "--workers", "3", "--format", "json"]) == 0
    session = next(logdir.glob("train/**/s1"))
    cli.main(["compare", str(session), str(session)])
    assert [type(e) for e in seen] == [LocalEngine] * 3
    assert seen[0].workers == 3 and seen[1] is seen[2] and seen[1].workers == os.cpu_count()
    assert closed == [seen[0], seen[1]]


def test_cli_dask_engine_attaches_to_the_given_scheduler(logdir, capsys, engines_seen, cluster, monkeypatch):
    seen, _ = engines_seen
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", cluster.scheduler_address)
    assert cli.main(["analyze", str(logdir), "--engine", "dask", "--format", "json"]) == 0
    assert isinstance(seen[0], DaskEngine) and seen[0].address == cluster.scheduler_address


def test_cli_refuses_bad_engine_flags(logdir, capsys, monkeypatch):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    assert cli.main(["analyze", str(logdir), "--engine", "dask"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "DASK_SCHEDULER_ADDRESS" in err and "Traceback" not in err
    assert cli.main(["analyze", str(logdir), "--address", "tcp://h:8786"]) == 2
    assert "only for the dask engine" in capsys.readouterr().err
    for flags in (["--engine", "bogus"], ["--workers", "0"], ["--workers", "x"]):
        with pytest.raises(SystemExit) as exit_:
            cli.main(["analyze", str(logdir), *flags])
        assert exit_.value.code == 2


# -- service (the TensorBoard tab) -------------------------------------------------------------------


def _service_engine(logdir, monkeypatch) -> Engine:
    """The engine the service's first analysis runs with."""
    seen = []
    monkeypatch.setattr(multihost, "analyze_session", lambda ref, engine=None: seen.append(engine) or {})
    advisor = service.AdvisorService([service.LogRoot("", str(logdir))], wait_s=30)
    try:
        advisor.report("train", "s1")
        return seen[0]
    finally:
        advisor.close()


def test_service_analyses_locally_without_a_scheduler(logdir, monkeypatch):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    assert isinstance(_service_engine(logdir, monkeypatch), LocalEngine)


def test_service_falls_back_to_local_when_the_scheduler_is_unreachable(logdir, monkeypatch, caplog):
    pytest.importorskip("distributed")
    monkeypatch.setattr("tb_gpuadvisor.multihost.engine.CONNECT_TIMEOUT_S", 0.5)
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "tcp://127.0.0.1:9")
    with caplog.at_level(logging.WARNING, logger="tb_gpuadvisor"):
        assert isinstance(_service_engine(logdir, monkeypatch), LocalEngine)
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in caplog.text


def test_service_attaches_to_the_scheduler_in_the_environment(logdir, monkeypatch, cluster):
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", cluster.scheduler_address)
    engine = _service_engine(logdir, monkeypatch)
    assert isinstance(engine, DaskEngine) and engine.address == cluster.scheduler_address


def test_pool_workers_share_the_cores_instead_of_each_using_them_all(local):
    """Two workers on a machine: each stage in a worker runs on its share of the cores, not on
    twice the cores (four decoding threads per worker on two cores only contended)."""
    from engine_jobs import stage_threads

    shares = {o.value for o in local.run(stage_threads, [0.3, 0.3])}
    assert shares == {max(1, (os.cpu_count() or 1) // 2)}


def test_a_stage_trims_only_a_heap_worth_trimming(monkeypatch):
    """At a stage's end the heap of a process that analyses on one heap is trimmed when it holds
    WORTH_TRIMMING free bytes or more (a large capture's temporaries), not for a small capture's
    few (the trim would cost more), and never in other processes (Dask workers, TensorBoard)."""
    from tb_gpuadvisor import heap
    if heap._glibc() is None or not hasattr(heap._glibc(), "mallinfo2"):
        pytest.skip("glibc with mallinfo2 only")
    trims = []
    libc = heap._glibc()
    monkeypatch.setattr(heap, "_glibc", lambda: type("L", (), {"mallinfo2": libc.mallinfo2,
                                                              "malloc_trim": lambda self, pad: trims.append(pad) or 1})())
    monkeypatch.setattr(heap, "_trims_stages", True)
    monkeypatch.setattr(heap, "WORTH_TRIMMING", 1 << 60)
    assert heap.return_freed_memory_if_worth() is False and trims == []
    monkeypatch.setattr(heap, "WORTH_TRIMMING", 0)
    assert heap.return_freed_memory_if_worth() is True and trims == [0]
    monkeypatch.setattr(heap, "_trims_stages", False)      # a Dask worker or TensorBoard: never
    assert heap.return_freed_memory_if_worth() is False and trims == [0]


def test_malloc_settings_are_skipped_where_the_c_library_is_not_glibc(monkeypatch):
    """One heap, the trim and the Dask tuning call glibc's mallopt/malloc_trim; where the C
    library has none (macOS, musl) or cannot be loaded by name (Windows: CDLL(None) is a
    TypeError) the analysis runs with the allocator's own settings instead of failing."""
    import ctypes

    from tb_gpuadvisor import heap

    def no_library(name):
        raise TypeError("expected str, bytes or os.PathLike object, not NoneType")

    for fake in (no_library, lambda name: object()):
        heap._glibc.cache_clear()
        heap.one_heap.cache_clear()
        monkeypatch.setattr(ctypes, "CDLL", fake)
        assert heap._glibc() is None and heap.one_heap() is False and heap.return_freed_memory() is False
        assert heap.return_freed_memory_if_worth() is False
    heap._glibc.cache_clear()
    heap.one_heap.cache_clear()
