"""Sessions on disk to the report: every host of a session, analysed and joined.

This is the last stage before the CLI and the HTTP routes: it reads a session's
files and hands the result to report.py. ``analyze_session`` never raises for a bad
capture: unreadable hosts, a failed check or a session with no steps become
``errors`` entries, so one bad session (or host) never hides the others.
"""

from __future__ import annotations

from tb_gpuadvisor.input.discovery import SessionRef
from tb_gpuadvisor.metadata import SCHEMA_VERSION
from tb_gpuadvisor.pipeline import report_session
from tb_gpuadvisor.multihost.engine import Engine, LocalEngine
from tb_gpuadvisor.multihost.mapper import HostJob, HostSummary, map_host
from tb_gpuadvisor.multihost.merge import failed_session, merge


def _here_only(ref: SessionRef) -> bool:
    """Files only this process can see (fsspec's in-memory filesystem) are mapped here."""
    protocol = getattr(ref.fs, "protocol", None) if ref.fs is not None else None
    return protocol is not None and "memory" in ((protocol,) if isinstance(protocol, str) else protocol)


def analyze_session(ref: SessionRef, engine: Engine | None = None) -> dict:
    """The contract session object for REF; problems become ``errors`` entries. ENGINE runs
    the per-host maps (None: this machine's processes, one per core)."""
    if len(ref.hosts) <= 1:
        return _one_host(ref)
    jobs = [HostJob(ref, host, len(ref.hosts)) for host in ref.hosts]
    own = engine is None
    engine = engine or LocalEngine()
    summaries: dict[int, HostSummary] = {}
    try:
        for outcome in engine.run(map_host, jobs, in_process=_here_only(ref)):
            job = jobs[outcome.index]
            summaries[outcome.index] = (outcome.value if outcome.error is None else HostSummary(
                job.host, [{"host": job.host, "message": f"the analysis of this host failed twice: {outcome.error}"}]))
    except Exception as err:  # the engine itself failed (a lost cluster): nothing to merge
        return failed_session(ref, [{"message": f"could not analyse the session: {err!r}"}])
    finally:
        if own:
            engine.close()
    return merge(ref, [summaries[i] for i in range(len(jobs))])


def _one_host(ref: SessionRef) -> dict:
    """A session of one host (or none readable): analysed here, exactly as the map would."""
    if not ref.hosts:
        try:
            return dict(report_session(ref), hosts=list(ref.hosts))
        except Exception as err:  # never let one session take the whole report down
            return failed_session(ref, [{"message": f"could not analyse the session: {err!r}"}])
    summary = map_host(HostJob(ref, ref.hosts[0], 1))
    return summary.report if summary.report is not None else failed_session(ref, summary.errors)


def _analyze_alone(ref: SessionRef) -> dict:
    """A session analysed in one process (sessions are already spread over processes)."""
    return analyze_session(ref, LocalEngine(workers=1))


def build_report(refs: list[SessionRef], jobs: int = 1, engine: Engine | None = None) -> dict:
    """The contract's report for several sessions. JOBS > 1 analyses whole sessions in that many
    local engine processes (each session's hosts one after another; a session whose process
    dies twice is an error session, the others still report); otherwise ENGINE maps each
    session's hosts (None: this machine's processes)."""
    if jobs > 1 and len(refs) > 1 and not any(_here_only(ref) for ref in refs):
        sessions: dict[int, dict] = {}
        with LocalEngine(workers=jobs) as pool:
            for outcome in pool.run(_analyze_alone, refs):
                sessions[outcome.index] = (outcome.value if outcome.error is None else failed_session(
                    refs[outcome.index], [{"message": f"the analysis of this session failed twice: {outcome.error}"}]))
        return {"schema_version": SCHEMA_VERSION, "sessions": [sessions[i] for i in range(len(refs))]}
    own = engine is None
    engine = engine or LocalEngine()
    try:
        return {"schema_version": SCHEMA_VERSION, "sessions": [analyze_session(ref, engine) for ref in refs]}
    finally:
        if own:
            engine.close()
