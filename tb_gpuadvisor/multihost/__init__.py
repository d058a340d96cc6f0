"""Sessions on disk to the report: every host of a session, analysed and joined.

This is the last stage before the CLI and the HTTP routes: it reads a session's
files and hands the result to report.py. ``analyze_session`` never raises for a bad
capture: unreadable hosts, a failed check or a session with no steps become
``errors`` entries, so one bad session (or host) never hides the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tb_gpuadvisor.discovery import SessionRef
from tb_gpuadvisor.metadata import SCHEMA_VERSION
from tb_gpuadvisor.model import load_session
from tb_gpuadvisor.report import session_json

if TYPE_CHECKING:
    from tb_gpuadvisor.multihost.engine import Engine


def failed_session(ref: SessionRef, message: str) -> dict:
    """The contract session object of a session nothing could be learnt from."""
    return {"run": ref.run, "session": ref.session, "hosts": list(ref.hosts), "framework": "unknown",
            "devices": [], "steps": {"count": 0, "source": "none"}, "findings": [], "first_fix": None,
            "errors": [{"message": message}], "warnings": []}


def analyze_session(ref: SessionRef, engine: "Engine | None" = None) -> dict:
    """The contract session object for REF; problems become ``errors`` entries. ENGINE runs
    the per-host work (multihost.engine; None: this machine's processes)."""
    try:
        model = load_session(ref)
    except Exception as err:  # never let one session take the whole report down
        return failed_session(ref, f"could not analyse the session: {err!r}")
    if not model.hosts:
        return dict(session_json(model), hosts=list(ref.hosts))
    return session_json(model)


def build_report(refs: list[SessionRef], jobs: int = 1, engine: "Engine | None" = None) -> dict:
    """The contract's report for several sessions, analysed in JOBS processes when asked."""
    if jobs > 1 and len(refs) > 1 and all(ref.fs is None for ref in refs):
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs) as pool:
            sessions = list(pool.map(analyze_session, refs))
    else:
        sessions = [analyze_session(ref) for ref in refs]
    return {"schema_version": SCHEMA_VERSION, "sessions": sessions}
