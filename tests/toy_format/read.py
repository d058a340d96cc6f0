"""The toy format's reader: one host's ``.toy.json`` into the format-neutral HostCapture."""

from __future__ import annotations

import json

import numpy as np

from tb_gpuadvisor.input.capture import HostCapture
from tb_gpuadvisor.input.files import CaptureError, Opener, read_bytes
from tb_gpuadvisor.timeline import Device, DeviceActivity, HostActivity, MemoryRecords
from toy_format import vocab

PS_PER_US = 1_000_000


def _column(events: list[dict], key: str, default: int = -1) -> np.ndarray:
    return np.array([e.get(key, default) for e in events], np.int64)


def _interned(values: list[str]) -> tuple[np.ndarray, list[str]]:
    strings = sorted(set(values))
    return np.array([strings.index(v) for v in values], np.int32), strings


def read(path: str, host: str, opener: Opener | None = None, budget: int | None = None) -> HostCapture:
    try:
        events = json.loads(bytes(read_bytes(path, opener)))["events"]
    except (ValueError, KeyError, TypeError) as err:
        raise CaptureError(f"not a toy capture: {err}") from None
    events = sorted(events, key=lambda e: e["ts"])
    on_host = [e for e in events if e["on"] == "host"]
    on_gpu = [e for e in events if e["on"] == "gpu"]
    name, names = _interned([e["name"] for e in on_host])
    kind = np.array([vocab.host_kind(n) for n in names], np.int8)[name]
    activity = HostActivity(
        host=host, start_ps=_column(on_host, "ts") * PS_PER_US, dur_ps=_column(on_host, "dur") * PS_PER_US,
        thread=np.zeros(len(on_host), np.int32), name=name, kind=kind, step_num=_column(on_host, "step"),
        is_root=kind == vocab.HOST_KINDS["step"], group_id=np.full(len(on_host), -1, np.int64),
        correlation_id=_column(on_host, "corr"), names=names, threads=["main"])
    dev_name, dev_names = _interned([e["name"] for e in on_gpu])
    none = np.full(len(on_gpu), -1, np.int64)
    device = DeviceActivity(
        device=Device(name="/device:GPU:0", host=host, kind="gpu", index=0, vendor="NVIDIA", model="Toy GPU"),
        start_ps=_column(on_gpu, "ts") * PS_PER_US, dur_ps=_column(on_gpu, "dur") * PS_PER_US,
        kind=np.array([vocab.device_kind(n) for n in dev_names], np.int8)[dev_name],
        stream=np.zeros(len(on_gpu), np.int32), name=dev_name, op=none, correlation_id=_column(on_gpu, "corr"),
        group_id=none, nbytes=np.zeros(len(on_gpu), np.int64), details=none, names=dev_names, ops=[],
        streams=["stream 0"], detail_strings=[])
    ints, small = np.empty(0, np.int64), np.empty(0, np.int32)
    memory = MemoryRecords(host, ints, small, np.empty(0, bool), ints, ints, ints, ints, ints,
                           np.empty(0, np.float64), small, [], [])
    return HostCapture(host, activity, memory, [device], None, [], [], origin_ns=0)
