"""Turning one host's capture file into column tables.

One pass per plane: each line's events are read into numpy columns, the few
stats the analyses need are picked out by stat-metadata id, and names are
interned so classification runs once per distinct name.  Planes are decoded
one at a time (see xspace.reader) and dropped once converted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from tb_gpuadvisor.model import classify
from tb_gpuadvisor.model.timeline import (
    Device, DeviceActivity, DeviceEventKind, HostActivity, HostEventKind, MemoryRecords,
)
from tb_gpuadvisor.xspace.reader import CaptureFile, Opener

_DEVICE_PLANE = re.compile(r"^/device:(GPU|TPU|XPU|CUSTOM):(\d+)$")
_HOST_PLANES = ("/host:CPU", "/host:CUPTI", "/host:ROCTRACER")

_INT_VALUE_STATS = ("correlation_id", "group_id", "step_num", "_r")
_NAME_VALUE_STATS = ("level 0", "tf_op", "hlo_op", "memcpy_details", "kernel_details")
_MEMORY_INT_STATS = ("bytes_allocated", "peak_bytes_in_use", "bytes_reserved", "bytes_available",
                     "requested_bytes")


def _stat_value(stat, stat_names: dict[int, str]):
    kind = stat.WhichOneof("value")
    if kind is None:
        return None
    if kind == "ref_value":
        return stat_names.get(stat.ref_value, "")
    return getattr(stat, kind)


def _int_of(stat) -> int:
    """Integer value of a stat stored as int64, uint64 or a numeric string."""
    value = stat.int64_value or stat.uint64_value
    if value:
        return value
    if stat.str_value.lstrip("-").isdigit():
        return int(stat.str_value)
    return int(stat.double_value)


class _Interner:
    """Strings to dense indices, shared by all lines of a table."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.strings: list[str] = []

    def add(self, value: str) -> int:
        idx = self.index.get(value)
        if idx is None:
            idx = self.index[value] = len(self.strings)
            self.strings.append(value)
        return idx


def _map_ids(ids: np.ndarray, lookup: dict[int, int], default: int = -1) -> np.ndarray:
    """Vectorised dict lookup for metadata ids."""
    if ids.size == 0:
        return np.empty(0, np.int32)
    uniq, inverse = np.unique(ids, return_inverse=True)
    mapped = np.fromiter((lookup.get(int(u), default) for u in uniq), np.int32, uniq.size)
    return mapped[inverse]


def _line_times(line, base_ps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    events = line.events
    n = len(events)
    md = np.fromiter((e.metadata_id for e in events), np.int64, n)
    start = np.fromiter((e.offset_ps for e in events), np.int64, n) + base_ps
    dur = np.fromiter((e.duration_ps for e in events), np.int64, n)
    return md, start, dur


@dataclass
class _Columns:
    """Per-line arrays collected before one concatenation."""

    parts: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def add(self, **arrays: np.ndarray) -> None:
        for key, value in arrays.items():
            self.parts.setdefault(key, []).append(value)

    def finish(self, dtypes: dict[str, type]) -> dict[str, np.ndarray]:
        out = {key: (np.concatenate(self.parts[key]).astype(dtype, copy=False) if self.parts.get(key)
                     else np.empty(0, dtype)) for key, dtype in dtypes.items()}
        order = np.argsort(out["start_ps"], kind="stable")
        return {key: value[order] for key, value in out.items()}


@dataclass
class StepsLine:
    """The derived "Steps" line of a GPU plane (older TensorFlow)."""

    number: np.ndarray
    start_ps: np.ndarray
    end_ps: np.ndarray
    group_id: np.ndarray


@dataclass
class HostCapture:
    """What one capture file yields before session-level step finding."""

    host: str
    activity: HostActivity
    memory: MemoryRecords
    devices: list[DeviceActivity]
    steps_line: StepsLine | None
    xla_modules: list[tuple[np.ndarray, np.ndarray, list[str], np.ndarray]]
    warnings: list[str]
    origin_ns: int


def _device_of(plane, host: str, stat_names: dict[int, str]) -> Device:
    kind_name, index = _DEVICE_PLANE.match(plane.name).groups()
    props = {stat_names.get(s.metadata_id, ""): _stat_value(s, stat_names) for s in plane.stats}
    major, minor = props.get("compute_cap_major"), props.get("compute_cap_minor")
    kind = {"GPU": "gpu", "TPU": "tpu"}.get(kind_name, kind_name.lower())
    vendor = props.get("device_vendor") or ({"gpu": "NVIDIA", "tpu": "Google"}.get(kind))
    if kind == "gpu" and isinstance(vendor, str) and vendor.upper().startswith("AMD"):
        vendor = "AMD"
    return Device(
        name=plane.name, host=host, kind=kind, index=int(index), vendor=vendor,
        model=props.get("device_type_string") or None,
        compute_capability=f"{major}.{minor or 0}" if major else None,
        sm_count=props.get("core_count") or None,
        memory_bytes=props.get("memory_size") or None,
        memory_bandwidth=props.get("memory_bandwidth") or None,
        clock_khz=props.get("clock_rate") or None,
    )


def _stat_ids(stat_names: dict[int, str], wanted: tuple[str, ...]) -> dict[int, str]:
    return {sid: name for sid, name in stat_names.items() if name in wanted}


def _memcpy_bytes(details: str) -> int:
    match = re.search(r"size:(\d+)", details)
    return int(match.group(1)) if match else 0


def _build_device(plane, host: str, origin_ns: int, stat_names: dict[int, str]):
    device = _device_of(plane, host, stat_names)
    names, ops, streams, details = _Interner(), _Interner(), _Interner(), _Interner()
    wanted = _stat_ids(stat_names, _INT_VALUE_STATS + _NAME_VALUE_STATS)
    md_name = {mid: names.add(meta.name) for mid, meta in plane.event_metadata.items()}
    # Newer captures keep per-kernel facts (op, kernel_details) in the event metadata.
    md_op: dict[int, int] = {}
    md_details: dict[int, int] = {}
    for mid, meta in plane.event_metadata.items():
        for stat in meta.stats:
            key = wanted.get(stat.metadata_id)
            if key in ("level 0", "tf_op", "hlo_op"):
                md_op[mid] = ops.add(_stat_value(stat, stat_names) or "")
            elif key == "kernel_details":
                md_details[mid] = details.add(_stat_value(stat, stat_names) or "")
    cols = _Columns()
    steps_line = None
    xla_modules = []
    is_tpu = device.kind == "tpu"
    for line in plane.lines:
        base_ps = (line.timestamp_ns - origin_ns) * 1000
        if line.name == classify.STEPS_LINE:
            steps_line = _steps_line(line, base_ps, plane, stat_names, wanted)
            continue
        if line.name == classify.XLA_MODULES_LINE:
            md, start, dur = _line_times(line, base_ps)
            xla_modules.append((start, dur, [plane.event_metadata[m].name for m in md.tolist()], md))
            continue
        if line.name in classify.DERIVED_DEVICE_LINES or (is_tpu and line.name != classify.TPU_OPS_LINE):
            continue
        md, start, dur = _line_times(line, base_ps)
        n = md.size
        if n == 0:
            continue
        corr = np.full(n, -1, np.int64)
        group = np.full(n, -1, np.int64)
        op = _map_ids(md, md_op)
        det = _map_ids(md, md_details)
        nbytes = np.zeros(n, np.int64)
        for i, event in enumerate(line.events):
            for stat in event.stats:
                key = wanted.get(stat.metadata_id)
                if key is None:
                    continue
                if key == "correlation_id":
                    corr[i] = _int_of(stat)
                elif key == "group_id":
                    group[i] = _int_of(stat)
                elif key in ("level 0", "tf_op", "hlo_op"):
                    op[i] = ops.add(_stat_value(stat, stat_names) or "")
                elif key == "memcpy_details":
                    nbytes[i] = _memcpy_bytes(_stat_value(stat, stat_names) or "")
                elif key == "kernel_details":
                    det[i] = details.add(_stat_value(stat, stat_names) or "")
        cols.add(start_ps=start, dur_ps=dur, md=md, corr=corr, group=group, op=op, det=det,
                 nbytes=nbytes, stream=np.full(n, streams.add(line.name or f"Stream #{line.id}"), np.int32))
    data = cols.finish({"start_ps": np.int64, "dur_ps": np.int64, "md": np.int64, "corr": np.int64,
                        "group": np.int64, "op": np.int32, "det": np.int32, "nbytes": np.int64,
                        "stream": np.int32})
    name_idx = _map_ids(data["md"], md_name)
    kind_of_name = np.fromiter((classify.device_event_kind(n) for n in names.strings), np.int8,
                               len(names.strings))
    kind = kind_of_name[name_idx] if name_idx.size else np.empty(0, np.int8)
    activity = DeviceActivity(
        device=device, start_ps=data["start_ps"], dur_ps=data["dur_ps"], kind=kind,
        stream=data["stream"], name=name_idx, op=data["op"], correlation_id=data["corr"],
        group_id=data["group"], nbytes=data["nbytes"], details=data["det"], names=names.strings,
        ops=ops.strings, streams=streams.strings, detail_strings=details.strings,
        step=np.full(data["start_ps"].size, -1, np.int32))
    return activity, steps_line, xla_modules


def _steps_line(line, base_ps: int, plane, stat_names, wanted) -> StepsLine:
    md, start, dur = _line_times(line, base_ps)
    numbers = []
    groups = np.full(md.size, -1, np.int64)
    for i, event in enumerate(line.events):
        name = plane.event_metadata[event.metadata_id].name
        numbers.append(int(name) if name.lstrip("-").isdigit() else i)
        for stat in event.stats:
            if wanted.get(stat.metadata_id) == "group_id":
                groups[i] = _int_of(stat)
    return StepsLine(np.asarray(numbers, np.int64), start, start + dur, groups)


class _HostBuilder:
    """Accumulates host-thread lines from the CPU plane (and a CUPTI plane, if any)."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.names = _Interner()
        self.threads = _Interner()
        self.allocators = _Interner()
        self.mem_ops = _Interner()
        self.cols = _Columns()
        self.mem_rows: list[tuple] = []

    def add_plane(self, plane, origin_ns: int, stat_names: dict[int, str]) -> None:
        wanted = _stat_ids(stat_names, _INT_VALUE_STATS)
        memory_stat = _stat_ids(stat_names, _MEMORY_INT_STATS + ("allocator_name", "fragmentation", "tf_op"))
        md_name = {mid: self.names.add(meta.name) for mid, meta in plane.event_metadata.items()}
        memory_md = {mid for mid, meta in plane.event_metadata.items() if meta.name in classify.MEMORY_EVENTS}
        alloc_md = {mid for mid, meta in plane.event_metadata.items() if meta.name == "MemoryAllocation"}
        prefix = "" if plane.name == "/host:CPU" else plane.name.split(":", 1)[1] + "/"
        for line in plane.lines:
            base_ps = (line.timestamp_ns - origin_ns) * 1000
            md, start, dur = _line_times(line, base_ps)
            n = md.size
            if n == 0:
                continue
            step_num = np.full(n, -1, np.int64)
            is_root = np.zeros(n, bool)
            group = np.full(n, -1, np.int64)
            corr = np.full(n, -1, np.int64)
            for i, event in enumerate(line.events):
                if event.metadata_id in memory_md:
                    self._memory_row(event, int(start[i]), event.metadata_id in alloc_md, memory_stat, stat_names)
                for stat in event.stats:
                    key = wanted.get(stat.metadata_id)
                    if key is None:
                        continue
                    value = _int_of(stat)
                    if key == "step_num":
                        step_num[i] = value
                    elif key == "group_id":
                        group[i] = value
                    elif key == "correlation_id":
                        corr[i] = value
                    else:
                        is_root[i] = value == 1
            thread = self.threads.add(prefix + (line.display_name or line.name or str(line.id)))
            self.cols.add(start_ps=start, dur_ps=dur, name=_map_ids(md, md_name), step_num=step_num,
                          is_root=is_root, group=group, corr=corr, thread=np.full(n, thread, np.int32))

    def _memory_row(self, event, time_ps: int, is_alloc: bool, memory_stat, stat_names) -> None:
        values: dict[str, object] = {}
        for stat in event.stats:
            key = memory_stat.get(stat.metadata_id)
            if key is not None:
                values[key] = _stat_value(stat, stat_names)
        self.mem_rows.append((
            time_ps, self.allocators.add(str(values.get("allocator_name", ""))), is_alloc,
            *(int(values.get(k) or 0) for k in _MEMORY_INT_STATS),
            float(values.get("fragmentation") or 0.0),
            self.mem_ops.add(str(values["tf_op"])) if values.get("tf_op") else -1,
        ))

    def finish(self) -> tuple[HostActivity, MemoryRecords]:
        data = self.cols.finish({"start_ps": np.int64, "dur_ps": np.int64, "name": np.int32,
                                 "step_num": np.int64, "is_root": bool, "group": np.int64,
                                 "corr": np.int64, "thread": np.int32})
        kind_of_name = np.fromiter((classify.host_event_kind(n) for n in self.names.strings), np.int8,
                                   len(self.names.strings))
        kind = kind_of_name[data["name"]] if data["name"].size else np.empty(0, np.int8)
        # Events that carry a correlation id are launch/enqueue calls whatever their name
        # (TensorFlow 2.4 names host launch events after the kernel); _r=1 events are step markers.
        launch = (data["corr"] >= 0) & (kind != HostEventKind.MEMORY)
        kind = np.where(launch, np.int8(HostEventKind.LAUNCH), kind)
        kind = np.where(data["is_root"] & (data["step_num"] >= 0), np.int8(HostEventKind.STEP_MARKER), kind)
        activity = HostActivity(
            host=self.host, start_ps=data["start_ps"], dur_ps=data["dur_ps"], thread=data["thread"],
            name=data["name"], kind=kind.astype(np.int8), step_num=data["step_num"], is_root=data["is_root"],
            group_id=data["group"], correlation_id=data["corr"], names=self.names.strings,
            threads=self.threads.strings, step=np.full(data["start_ps"].size, -1, np.int32))
        rows = sorted(self.mem_rows, key=lambda r: r[0])
        columns = list(zip(*rows)) if rows else [[]] * 10
        memory = MemoryRecords(
            host=self.host, time_ps=np.asarray(columns[0], np.int64), allocator=np.asarray(columns[1], np.int32),
            is_alloc=np.asarray(columns[2], bool), bytes_allocated=np.asarray(columns[3], np.int64),
            peak_bytes_in_use=np.asarray(columns[4], np.int64), bytes_reserved=np.asarray(columns[5], np.int64),
            bytes_available=np.asarray(columns[6], np.int64), requested_bytes=np.asarray(columns[7], np.int64),
            fragmentation=np.asarray(columns[8], np.float64), op=np.asarray(columns[9], np.int32),
            allocators=self.allocators.strings, ops=self.mem_ops.strings)
        return activity, memory


def _origin_ns(capture: CaptureFile) -> int:
    """The earliest line timestamp of the file: the zero of its times."""
    earliest = None
    for plane in capture.planes():
        for line in plane.lines:
            if line.events and (earliest is None or line.timestamp_ns < earliest):
                earliest = line.timestamp_ns
    return earliest or 0


def read_host(path: str, host: str, opener: Opener | None = None) -> HostCapture:
    """Build one host's tables from its capture file (raises CaptureError when unreadable)."""
    with CaptureFile(path, opener) as capture:
        warnings = [f"profiler error: {e}" for e in capture.index.errors]
        warnings += [f"profiler warning: {w}" for w in capture.index.warnings]
        origin_ns = _origin_ns(capture) if len(capture.index.plane_spans) > 1 else 0
        builder = _HostBuilder(host)
        devices: list[DeviceActivity] = []
        steps_line = None
        xla_modules = []
        for plane in capture.planes():
            stat_names = {sid: meta.name for sid, meta in plane.stat_metadata.items()}
            if _DEVICE_PLANE.match(plane.name):
                activity, line_steps, modules = _build_device(plane, host, origin_ns, stat_names)
                devices.append(activity)
                steps_line = steps_line or line_steps
                xla_modules.extend(modules)
            elif plane.name in _HOST_PLANES:
                builder.add_plane(plane, origin_ns, stat_names)
        activity, memory = builder.finish()
    devices.sort(key=lambda d: (d.device.kind, d.device.index))
    return HostCapture(host, activity, memory, devices, steps_line, xla_modules, warnings, origin_ns)
