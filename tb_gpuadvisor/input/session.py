"""Reading one session's hosts, each through the adapter of its file's format, onto one clock.

A host whose file cannot be read becomes an entry in ``SessionCaptures.errors`` and the others
still load; the memory an analysis may use is checked before anything is decoded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tb_gpuadvisor.input import XPLANE, format_of, host_of
from tb_gpuadvisor.input.capture import MAX_PS, HostCapture
from tb_gpuadvisor.input.discovery import SessionRef
from tb_gpuadvisor.input.files import BeingWritten, CaptureError
from tb_gpuadvisor.stages import stage


@dataclass
class SessionCaptures:
    """What the input stage read of one session: the captures it could read (timed from one
    origin, the earliest host's), with their files, and why anything else was not read."""

    run: str
    session: str
    captures: list[tuple[HostCapture, str]]     # (capture, its file's path)
    errors: list[dict]                          # {"host", "file", "message"} or {"message"}
    warnings: list[str]
    framework: str | None = None                # the one framework the files' format says wrote them


# Peak memory of an analysis, measured by benchmarks/bench.py: about 3-4x the capture size.
MEMORY_PER_CAPTURE_BYTE = 4
MEMORY_BASELINE_BYTES = 150 << 20


def memory_budget() -> tuple[int | None, str | None]:
    """(bytes this analysis may use, a warning about the setting or None).

    Available memory, or TB_GPUADVISOR_MEMORY_LIMIT_MB if lower; a limit that is not a
    positive whole number is ignored with a warning rather than failing every session.
    """
    limits, warning = [], None
    setting = os.environ.get("TB_GPUADVISOR_MEMORY_LIMIT_MB", "").strip()
    if setting:
        if setting.isdigit() and int(setting) > 0:
            limits.append(int(setting) << 20)
        else:
            warning = (f"TB_GPUADVISOR_MEMORY_LIMIT_MB={setting[:40]!r} is not a positive number of MB; "
                       "it was ignored (only free memory limits this analysis)")
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    limits.append(int(line.split()[1]) << 10)
    except OSError:
        pass
    return (min(limits) if limits else None), warning


def check_memory(sizes: list[int], budget: int | None) -> str | None:
    """Why a capture of these host-file sizes cannot be analysed within BUDGET, or None when it can."""
    total = sum(s for s in sizes if s > 0)
    needed = MEMORY_BASELINE_BYTES + MEMORY_PER_CAPTURE_BYTE * total
    if budget is None or needed <= budget:
        return None
    return (f"analysing this {total / 2**30:.2f} GiB capture needs about {needed / 2**30:.1f} GiB of memory "
            f"but only {budget / 2**30:.1f} GiB is available; analyse it on a machine with more memory, or "
            "capture fewer steps (a shorter profile_batch range)")


def _host_budgets(sizes: list[int], budget: int | None) -> list[int | None]:
    """Each host's share of the memory left after the baseline, in proportion to its file size."""
    if budget is None:
        return [None] * len(sizes)
    spare = max(budget - MEMORY_BASELINE_BYTES, 0)
    total = sum(max(s, 0) for s in sizes)
    return [spare * max(s, 0) // total if total else spare for s in sizes]


def _read(path: str, host: str, opener, budget: int | None) -> HostCapture | CaptureError:
    """One host's capture (read by the adapter of its file's format), or why it cannot be read."""
    try:
        # What the decode frees is what trust and attribution allocate next: handed back here
        # it only faulted in again (0.2 s of trust at 978 MB, for no lower peak).
        with stage("decode", host, hand_back=False):
            return (format_of(os.path.basename(path)) or XPLANE).read(path, host, opener, budget)
    except CaptureError as err:
        return err
    except Exception as err:    # one host's bad bytes must never hide the other hosts
        return CaptureError(f"this capture could not be analysed ({type(err).__name__}: {err}); "
                            "it is probably corrupt")


def _read_hosts(ref: SessionRef, paths: list[str], sizes: list[int],
                budget: int | None) -> list[HostCapture | CaptureError]:
    """Every host, one after another (a many-host session is mapped host by host in other
    processes by tb_gpuadvisor.multihost; this holds them all, for one-process analyses)."""
    return [_read(path, host, ref.opener(), share)
            for host, path, share in zip(ref.hosts, paths, _host_budgets(sizes, budget))]


def _same_clock(captures: list[tuple[HostCapture, str]], errors: list[dict]) -> list[tuple[HostCapture, str]]:
    """The captures whose clocks can share one origin; the others become errors."""
    if not captures:
        return captures
    origins = sorted(c.origin_ns for c, _ in captures)
    median = origins[len(origins) // 2]
    kept = []
    for capture, path in captures:
        if abs(capture.origin_ns - median) * 1000 >= MAX_PS >> 1:   # room for the shift onto one origin
            errors.append({"host": capture.host, "file": os.path.basename(path),
                           "message": f"its clock ({capture.origin_ns} ns) is too far from the other hosts'; "
                                      "the capture is corrupt"})
        else:
            kept.append((capture, path))
    return kept


def read_session(ref: SessionRef) -> SessionCaptures:
    """Every host of REF read by its format's adapter, on one clock; the others as errors."""
    paths = [ref.host_file(host) for host in ref.hosts]
    sizes = [size for _, size, _ in ref.stat_key()]
    errors = [{"host": host_of(name), "file": name, "message": reason} if name else {"message": reason}
              for name, reason in ref.skipped]
    budget, budget_warning = memory_budget()
    refusal = check_memory(sizes, budget)
    results = [] if refusal else _read_hosts(ref, paths, sizes, budget)
    if refusal:
        errors.append({"message": refusal})
    captures: list[tuple[HostCapture, str]] = []
    for host, path, result in zip(ref.hosts, paths, results):
        if isinstance(result, CaptureError):
            # The file name, not the server path: reports are served to browsers.
            errors.append({"host": host, "file": os.path.basename(path), "message": str(result),
                           **({"being_written": True} if isinstance(result, BeingWritten) else {})})
        else:
            captures.append((result, path))
    captures = _same_clock(captures, errors)
    if captures:
        origin = min(c.origin_ns for c, _ in captures)
        for capture, _ in captures:
            capture.shift((capture.origin_ns - origin) * 1000)
    told = {(format_of(os.path.basename(path)) or XPLANE).framework for path in paths}
    return SessionCaptures(ref.run, ref.session, captures, errors, [budget_warning] if budget_warning else [],
                           told.pop() if len(told) == 1 else None)
