"""The timeline model of a capture session (see timeline.py for the tables).

``load_session`` reads every host of a session; a host whose file cannot be
read becomes an entry in ``SessionModel.errors`` and the others still load.
"""

from __future__ import annotations

import os

from tb_gpuadvisor.adapters import XPLANE, adapter_for, host_of
from tb_gpuadvisor.discovery import SessionRef
from tb_gpuadvisor.stages import stage
from tb_gpuadvisor.model.build import MAX_PS, HostCapture
from tb_gpuadvisor.model.steps import find_steps, framework
from tb_gpuadvisor.model.timeline import (
    Device, DeviceActivity, DeviceEventKind, HostActivity, HostEventKind, HostModel,
    MemoryRecords, SessionModel, Steps, PS_PER_MS, PS_PER_US,
)
from tb_gpuadvisor.xspace.reader import BeingWritten, CaptureError


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
            return (adapter_for(os.path.basename(path)) or XPLANE).read(path, host, opener, budget)
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


def load_session(ref: SessionRef) -> SessionModel:
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
    host_captures = [c for c, _ in captures]
    made_by = framework(host_captures)
    with stage("model", hand_back=False):
        steps = find_steps(host_captures, made_by)
    hosts = [HostModel(c.host, path, c.activity, c.memory, c.devices, c.origin_ns, c.warnings, c.dropped_events,
                       c.partial_trace)
             for c, path in captures]
    model = SessionModel(ref.run, ref.session, hosts, steps, made_by, errors)
    if budget_warning:
        model.warnings.append(budget_warning)
    for c in host_captures:
        model.warnings.extend(f"{c.host}: {w}" for w in c.warnings)
    return model


__all__ = [
    "Device", "DeviceActivity", "DeviceEventKind", "HostActivity", "HostEventKind", "HostModel",
    "MemoryRecords", "SessionModel", "Steps", "PS_PER_MS", "PS_PER_US", "load_session",
]
