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


def load_session(ref: SessionRef) -> SessionModel:
    captures: list[tuple[HostCapture, str]] = []
    errors: list[dict] = []
    for host in ref.hosts:
        path = ref.host_file(host)
        try:
            captures.append((read_host(path, host, ref.opener()), path))
        except CaptureError as err:
            # The file name, not the server path: reports are served to browsers.
            errors.append({"host": host, "file": os.path.basename(path), "message": str(err)})
    if captures:
        origin = min(c.origin_ns for c, _ in captures)
        for capture, _ in captures:
            capture.shift((capture.origin_ns - origin) * 1000)
    host_captures = [c for c, _ in captures]
    steps = find_steps(host_captures)
    assign_steps(steps, host_captures)
    hosts = [HostModel(c.host, path, c.activity, c.memory, c.devices, c.origin_ns, c.warnings)
             for c, path in captures]
    model = SessionModel(ref.run, ref.session, hosts, steps, framework(host_captures), errors)
    for c in host_captures:
        model.warnings.extend(f"{c.host}: {w}" for w in c.warnings)
    return model


__all__ = [
    "Device", "DeviceActivity", "DeviceEventKind", "HostActivity", "HostEventKind", "HostModel",
    "MemoryRecords", "SessionModel", "Steps", "PS_PER_MS", "PS_PER_US", "load_session",
]
