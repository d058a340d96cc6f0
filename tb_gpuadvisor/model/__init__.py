"""The timeline model of a capture session (see timeline.py for the tables).

``load_session`` reads every host of a session; a host whose file cannot be
read becomes an entry in ``SessionModel.errors`` and the others still load.
"""

from __future__ import annotations

import os

from tb_gpuadvisor.discovery import SessionRef
from tb_gpuadvisor.model.build import HostCapture, read_host
from tb_gpuadvisor.model.steps import assign_steps, find_steps, framework
from tb_gpuadvisor.model.timeline import (
    Device, DeviceActivity, DeviceEventKind, HostActivity, HostEventKind, HostModel,
    MemoryRecords, SessionModel, Steps, PS_PER_MS, PS_PER_US,
)
from tb_gpuadvisor.xspace.reader import CaptureError


# Peak memory of an analysis, measured by benchmarks/bench.py: about 3-4x the capture size.
MEMORY_PER_CAPTURE_BYTE = 4
MEMORY_BASELINE_BYTES = 150 << 20
# Hosts are read in parallel processes only when there is enough to read to pay for starting them.
PARALLEL_HOSTS_MIN_BYTES = 64 << 20


def memory_budget() -> int | None:
    """Bytes this analysis may use: available memory, or TB_GPUADVISOR_MEMORY_LIMIT_MB if lower."""
    limits = []
    if os.environ.get("TB_GPUADVISOR_MEMORY_LIMIT_MB"):
        limits.append(int(os.environ["TB_GPUADVISOR_MEMORY_LIMIT_MB"]) << 20)
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    limits.append(int(line.split()[1]) << 10)
    except OSError:
        pass
    return min(limits) if limits else None


def check_memory(sizes: list[int]) -> str | None:
    """Why a capture of these host-file sizes cannot be analysed here, or None when it can."""
    budget = memory_budget()
    total = sum(s for s in sizes if s > 0)
    needed = MEMORY_BASELINE_BYTES + MEMORY_PER_CAPTURE_BYTE * total
    if budget is None or needed <= budget:
        return None
    return (f"analysing this {total / 2**30:.2f} GiB capture needs about {needed / 2**30:.1f} GiB of memory "
            f"but only {budget / 2**30:.1f} GiB is available; analyse it on a machine with more memory, or "
            "capture fewer steps (a shorter profile_batch range)")


def _read(job: tuple[str, str, object]) -> HostCapture | CaptureError:
    path, host, opener = job
    try:
        return read_host(path, host, opener)
    except CaptureError as err:
        return err


def _read_hosts(ref: SessionRef, paths: list[str], total: int) -> list[HostCapture | CaptureError]:
    jobs = [(path, host, ref.opener()) for host, path in zip(ref.hosts, paths)]
    workers = min(len(jobs), os.cpu_count() or 1)
    if workers > 1 and total >= PARALLEL_HOSTS_MIN_BYTES and ref.fs is None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor   # only here: a slow import otherwise unused

        # A fresh interpreter per worker: forking a threaded process (TensorBoard) is unsafe.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            return list(pool.map(_read, jobs))
    return [_read(job) for job in jobs]


def load_session(ref: SessionRef) -> SessionModel:
    paths = [ref.host_file(host) for host in ref.hosts]
    sizes = [size for _, size, _ in ref.stat_key()]
    errors: list[dict] = []
    refusal = check_memory(sizes)
    results = [] if refusal else _read_hosts(ref, paths, sum(max(s, 0) for s in sizes))
    if refusal:
        errors.append({"message": refusal})
    captures: list[tuple[HostCapture, str]] = []
    for host, path, result in zip(ref.hosts, paths, results):
        if isinstance(result, CaptureError):
            # The file name, not the server path: reports are served to browsers.
            errors.append({"host": host, "file": os.path.basename(path), "message": str(result)})
        else:
            captures.append((result, path))
    if captures:
        origin = min(c.origin_ns for c, _ in captures)
        for capture, _ in captures:
            capture.shift((capture.origin_ns - origin) * 1000)
    host_captures = [c for c, _ in captures]
    steps = find_steps(host_captures)
    assign_steps(steps, host_captures)
    hosts = [HostModel(c.host, path, c.activity, c.memory, c.devices, c.origin_ns, c.warnings, c.dropped_events)
             for c, path in captures]
    model = SessionModel(ref.run, ref.session, hosts, steps, framework(host_captures), errors)
    for c in host_captures:
        model.warnings.extend(f"{c.host}: {w}" for w in c.warnings)
    return model


__all__ = [
    "Device", "DeviceActivity", "DeviceEventKind", "HostActivity", "HostEventKind", "HostModel",
    "MemoryRecords", "SessionModel", "Steps", "PS_PER_MS", "PS_PER_US", "load_session",
]
