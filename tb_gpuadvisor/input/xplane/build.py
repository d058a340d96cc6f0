"""The XPlane adapter: one host's ``.xplane.pb`` file into column tables (a ``HostCapture``).

One pass per plane: the plane's events arrive as numpy columns (see
``decode.py``), the few stats the analyses need come as sparse columns, and
names are interned so classification runs once per distinct name.  Planes
are decoded one at a time and dropped once converted.
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from tb_gpuadvisor import cores
from tb_gpuadvisor.arrays import map_small_ints, narrow_ids
from tb_gpuadvisor.input.capture import MAX_PS, HostCapture, ProgramRuns, RecordedSteps
from tb_gpuadvisor.input.files import CaptureError, Opener
from tb_gpuadvisor.input.xplane import classify
from tb_gpuadvisor.input.xplane.decode import DecodedPlane, count_events, decode_plane, has_fast_decoder
from tb_gpuadvisor.input.xplane.reader import CaptureFile
from tb_gpuadvisor.kinds import HostEventKind, InputStage
from tb_gpuadvisor.timeline import Device, DeviceActivity, HostActivity, MemoryRecords
from tb_gpuadvisor.vocab import hlo, tensorflow, xla

_DEVICE_PLANE = re.compile(r"^/device:(GPU|TPU|XPU|CUSTOM):(\d+)$")
_HOST_PLANES = ("/host:CPU", "/host:CUPTI", "/host:ROCTRACER")

_OP_STATS = ("tf_op", "level 0", "hlo_op")          # in order of preference
_XLA_STATS = ("hlo_module", "name")       # with hlo_op: the XLA view of a kernel (vocab/hlo.py)
_DEVICE_STATS = ("correlation_id", "group_id", "memcpy_details", "kernel_details") + _OP_STATS + _XLA_STATS
_MEMORY_INTS = ("bytes_allocated", "peak_bytes_in_use", "bytes_reserved", "bytes_available",
                "requested_bytes")
_MEMORY_STATS = ("allocator_name", "fragmentation", "tf_op") + _MEMORY_INTS
_HOST_INTS = ("correlation_id", "group_id", "step_num", "_r")
_HOST_STATS = _HOST_INTS + ("name",) + _MEMORY_STATS


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


def _stat_value(stat, stat_names: dict[int, str]):
    kind = stat.WhichOneof("value")
    if kind is None:
        return None
    if kind == "ref_value":
        return stat_names.get(stat.ref_value, "")
    return getattr(stat, kind)


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


def _starts(dp: DecodedPlane, origin_ns: int) -> np.ndarray:
    """Absolute event starts: each line's timestamp plus the event offsets."""
    bases = [(line.timestamp_ns - origin_ns) * 1000 for line in dp.lines]
    for line, base in zip(dp.lines, bases):
        if abs(base) >= MAX_PS:
            raise CaptureError(f"plane {dp.shell.name!r}, line {line.name!r}: its timestamp ({line.timestamp_ns} ns) "
                               "is too far from the capture's other times; the capture is corrupt")
    # max and min, not abs: no temporary copy of a column (a fresh array costs its page faults).
    if dp.n_events and any(col.max() >= MAX_PS or col.min() <= -MAX_PS for col in (dp.offset_ps, dp.duration_ps)):
        raise CaptureError(f"plane {dp.shell.name!r}: an event offset or duration is out of range; "
                           "the capture is corrupt")
    starts = np.repeat(np.asarray(bases, np.int64), [line.count for line in dp.lines])
    starts += dp.offset_ps
    return starts


def _name_indices(ids: np.ndarray, md_name: dict[int, int], names: "_Interner") -> np.ndarray:
    """Interned event names; events whose metadata id has no entry get the empty name."""
    idx = map_small_ints(ids, md_name)
    missing = idx < 0
    if missing.any():
        idx[missing] = names.add("")
    return idx


def _line_mask(dp: DecodedPlane, keep) -> np.ndarray:
    return np.repeat(np.fromiter((keep(line) for line in dp.lines), bool, len(dp.lines)),
                     [line.count for line in dp.lines])


def _metadata_defaults(dp: DecodedPlane, ops: _Interner, details: _Interner) -> tuple[dict, dict]:
    """Newer captures keep a kernel's op and kernel_details on its event metadata."""
    md_op: dict[int, int] = {}
    md_details: dict[int, int] = {}
    for mid, meta in dp.shell.event_metadata.items():
        for stat in meta.stats:
            name = dp.stat_names.get(stat.metadata_id)
            if name in _OP_STATS and mid not in md_op:
                md_op[mid] = ops.add(_stat_value(stat, dp.stat_names) or "")
            elif name == "kernel_details":
                md_details[mid] = details.add(_stat_value(stat, dp.stat_names) or "")
    return md_op, md_details


def _build_device(dp: DecodedPlane, host: str, origin_ns: int):
    """A device plane's table of the events on its kept lines, by start. Its columns are built
    for the kept rows alone (a GPU plane's derived lines, TensorFlow Ops and Name Scope, are two
    thirds of its events), each value placed at its row directly; DP's columns go as they are
    used, so the plane and its table are not held whole together."""
    device = _device_of(dp.shell, host, dp.stat_names)
    names, ops, streams, details = _Interner(), _Interner(), _Interner(), _Interner()
    metadata = dp.shell.event_metadata
    md_name = {mid: names.add(meta.name) for mid, meta in metadata.items()}
    md_op, md_details = _metadata_defaults(dp, ops, details)
    start = _starts(dp, origin_ns)
    dp.drop("offset_ps")
    n = dp.n_events

    steps_line = None
    modules: list[ProgramRuns] = []
    for line in dp.lines:
        if line.name == xla.STEPS_LINE and line.count:
            steps_line = _steps_line(dp, slice(line.first, line.first + line.count), start)
        elif line.name == xla.XLA_MODULES_LINE and line.count:
            sel = slice(line.first, line.first + line.count)
            module_names = _Interner()
            ids = {mid: module_names.add(meta.name) for mid, meta in metadata.items()}
            modules.append(ProgramRuns(start[sel], start[sel] + dp.duration_ps[sel],
                                      map_small_ints(dp.metadata_id[sel], ids), module_names.strings))

    is_tpu = device.kind == "tpu"
    order = np.flatnonzero(_line_mask(dp, lambda line: line.name == xla.TPU_OPS_LINE if is_tpu
                                      else line.name not in xla.DERIVED_DEVICE_LINES))
    order = order[np.argsort(start[order], kind="stable")]
    kept = order.size
    rows = np.full(n, -1, np.int32)         # each event's row in the table, -1 when left out
    rows[order] = np.arange(kept, dtype=np.int32)
    start = start[order]
    metadata_id = dp.metadata_id[order]
    dp.drop("metadata_id")
    dur = dp.duration_ps[order]
    dp.drop("duration_ps")
    # A kept event's line, from the lines' first rows (each line is one run of the plane's events).
    line_stream = np.fromiter((streams.add(line.name or f"Stream #{line.id}") for line in dp.lines),
                              np.int32, len(dp.lines))
    stream = line_stream[np.searchsorted(np.fromiter((line.first for line in dp.lines), np.int64, len(dp.lines)),
                                         order, side="right") - 1] if kept else np.empty(0, np.int32)
    del order
    # Each stat goes once its column is made: the ids first (group_id is on every event of the
    # plane, derived lines included: its sparse column is the largest), the XLA ones before the
    # op stats (hlo_op is both).
    id_columns = {name: narrow_ids(dp.stats.pop(name).ints(kept, dp.strings, rows=rows))
                  for name in ("correlation_id", "group_id")}
    hlo_columns = _xla_columns(dp, is_tpu, rows, metadata_id)
    op = map_small_ints(metadata_id, md_op)
    for stat in reversed(_OP_STATS):            # preferred stats written last; absent ones skipped
        column = dp.stats.pop(stat)
        if column.event.size:
            found = column.interned(kept, dp.stat_names, dp.strings, ops.add, rows)
            op = np.where(found >= 0, found, op)
    det = map_small_ints(metadata_id, md_details)
    column = dp.stats.pop("kernel_details")
    if column.event.size:
        found = column.interned(kept, dp.stat_names, dp.strings, details.add, rows)
        det = np.where(found >= 0, found, det)
    copy_details = _Interner()
    copy_idx = dp.stats.pop("memcpy_details").interned(kept, dp.stat_names, dp.strings, copy_details.add, rows)
    sizes = np.fromiter((_memcpy_bytes(text) for text in copy_details.strings), np.int64,
                        len(copy_details.strings))
    nbytes = np.where(copy_idx >= 0, sizes[np.clip(copy_idx, 0, None)] if sizes.size else 0, 0).astype(np.int64)
    del copy_idx, rows
    name_idx = _name_indices(metadata_id, md_name, names)
    kind_of_name = np.fromiter((classify.device_event_kind(n) for n in names.strings), np.int8,
                               len(names.strings))
    activity = DeviceActivity(
        device=device, start_ps=start, dur_ps=dur,
        kind=kind_of_name[name_idx] if kept else np.empty(0, np.int8),
        stream=stream, name=name_idx, op=op, **id_columns, nbytes=nbytes, details=det, names=names.strings,
        ops=ops.strings, streams=streams.strings, detail_strings=details.strings,
        **hlo_columns[0], **hlo_columns[1])
    return activity, steps_line, modules


def _xla_columns(dp: DecodedPlane, is_tpu: bool, rows: np.ndarray, metadata_id: np.ndarray) -> tuple[dict, dict]:
    """The XLA instruction, module and source op of every kept event (columns, then their
    strings; ROWS and METADATA_ID as ``_build_device`` keeps them).

    TPU events carry no ``hlo_op`` stat: their name is the instruction's HLO text (their JAX
    source op is the ``op`` column, from ``tf_op``).
    """
    kept = metadata_id.size
    interners = {key: _Interner() for key in ("hlo_op", "hlo_module", "source")}
    columns = {key: (dp.stats[stat] if stat in _OP_STATS else dp.stats.pop(stat)).interned(
                   kept, dp.stat_names, dp.strings, interners[key].add, rows)
               for key, stat in (("hlo_op", "hlo_op"), ("hlo_module", "hlo_module"), ("source", "name"))}
    if is_tpu:
        md_hlo = {mid: interners["hlo_op"].add(hlo.instruction(meta.name))
                  for mid, meta in dp.shell.event_metadata.items()}
        columns["hlo_op"] = np.where(columns["hlo_op"] >= 0, columns["hlo_op"],
                                     map_small_ints(metadata_id, md_hlo))
    strings = {"hlo_ops": interners["hlo_op"].strings, "hlo_modules": interners["hlo_module"].strings,
               "sources": interners["source"].strings}
    return columns, strings


def _memcpy_bytes(details: str) -> int:
    match = re.search(r"size:(\d+)", details)
    return int(match.group(1)) if match else 0


def _steps_line(dp: DecodedPlane, sel: slice, start: np.ndarray) -> RecordedSteps:
    metadata = dp.shell.event_metadata
    labels = [metadata[int(m)].name if int(m) in metadata else "" for m in dp.metadata_id[sel]]
    numbers = np.fromiter((int(label) if label.lstrip("-").isdigit() else i for i, label in enumerate(labels)),
                          np.int64, len(labels))
    groups = dp.stats["group_id"].window(sel.start, sel.stop).ints(sel.stop - sel.start, dp.strings)
    return RecordedSteps(numbers, start[sel], start[sel] + dp.duration_ps[sel], groups)


def _host_tables(dp: DecodedPlane, host: str, origin_ns: int) -> tuple[HostActivity, MemoryRecords]:
    """One host plane's events sorted by start, and its allocator records (a worker thread
    builds them while other planes decode). Takes DP's event columns: each goes as soon as
    the table has what it needs of it, so the plane and its table are not held whole together."""
    n = dp.n_events
    names, threads = _Interner(), _Interner()
    metadata = dp.shell.event_metadata
    md_name = {mid: names.add(meta.name) for mid, meta in metadata.items()}
    prefix = "" if dp.shell.name == "/host:CPU" else dp.shell.name.split(":", 1)[1] + "/"
    line_thread = np.fromiter(
        (threads.add(prefix + (line.display_name or line.name or str(line.id))) for line in dp.lines),
        np.int32, len(dp.lines))
    start = _starts(dp, origin_ns)
    dp.drop("offset_ps")
    memory, datasets = _memory_records(dp, host, start), _datasets(dp)
    stats = _dense_stats(dp)        # before the sort: a sparse stat takes 2-4 times a dense column
    order = np.argsort(start, kind="stable")
    start = start[order]
    name = _name_indices(dp.metadata_id, md_name, names)[order]
    dp.drop("metadata_id")
    dur = dp.duration_ps[order]
    dp.drop("duration_ps")
    thread = np.repeat(line_thread, [line.count for line in dp.lines])[order]
    for key in stats:
        stats[key] = stats[key][order]
    del order
    kind_of_name = np.fromiter(map(classify.host_event_kind, names.strings), np.int8, len(names.strings))
    kind = kind_of_name[name] if n else np.empty(0, np.int8)
    # Events that carry a correlation id are launch/enqueue calls whatever their name
    # (TensorFlow 2.4 names host launch events after the kernel); _r=1 events with a
    # step number are step markers (FunctionRun also carries _r=1, without step_num).
    kind = np.where((stats["correlation_id"] >= 0) & (kind != HostEventKind.MEMORY), np.int8(HostEventKind.LAUNCH), kind)
    kind = np.where(stats["_r"] & (stats["step_num"] >= 0), np.int8(HostEventKind.STEP_MARKER), kind)
    xla_cpu = np.fromiter(map(classify.is_xla_cpu_thread, threads.strings), bool, len(threads.strings))
    if xla_cpu.any():
        kind = np.where(xla_cpu[thread] & (kind == HostEventKind.OTHER), np.int8(HostEventKind.FRAMEWORK_OP), kind)
    activity = HostActivity(
        host=host, start_ps=start, dur_ps=dur, thread=thread, name=name,
        kind=kind.astype(np.int8), step_num=stats["step_num"], is_root=stats["_r"],
        group_id=stats["group_id"], correlation_id=stats["correlation_id"], names=names.strings,
        threads=threads.strings, stages=_stages(names.strings, kind_of_name, datasets))
    return activity, memory


def _dense_stats(dp: DecodedPlane) -> dict[str, np.ndarray]:
    """Dense columns, in the plane's event order, of its int stats (_HOST_INTS), each taken from
    DP's sparse one in turn: ids in int32 where they fit (``narrow_ids``), ``_r`` as bools."""
    n = dp.n_events
    dense: dict[str, np.ndarray] = {}
    for name in _HOST_INTS:
        event, value = dp.stats.pop(name).int_values(dp.strings)
        value = narrow_ids(value)
        if event.size == n and np.all(event[1:] > event[:-1]):
            column = value                  # every event carries it once
        else:
            column = np.full(n, -1, value.dtype)
            column[event] = value
        dense[name] = column == 1 if name == "_r" else column
    return dense


def _stages(names: list[str], kind_of_name: np.ndarray, datasets: dict[str, str]) -> dict[str, InputStage]:
    """Each tf.data stage name's facts (vocab.tensorflow), with its dataset where DATASETS holds it."""
    rows = np.flatnonzero(kind_of_name == HostEventKind.INPUT_STAGE).tolist()
    return {names[i]: tensorflow.input_stage(names[i], datasets.get(names[i])) for i in rows}


def _datasets(dp: DecodedPlane) -> dict[str, str]:
    """The ``name`` stat (the dataset op) of each tf.data stage, from its first event that has it."""
    metadata = dp.shell.event_metadata
    stage_md = [mid for mid, meta in metadata.items() if meta.name.startswith(tensorflow.INPUT_STAGE_PREFIX)]
    rows = np.flatnonzero(np.isin(dp.metadata_id, stage_md))
    if not rows.size:
        return {}
    values = _Interner()
    named = dp.stats["name"].at(rows).interned(rows.size, dp.stat_names, dp.strings, values.add)
    has = named >= 0
    stage_ids, first = np.unique(dp.metadata_id[rows[has]], return_index=True)
    datasets: dict[str, str] = {}
    for mid, value in zip(stage_ids.tolist(), named[has][first].tolist()):
        if values.strings[value]:
            datasets.setdefault(metadata[mid].name, values.strings[value])
    return datasets


def _memory_records(dp: DecodedPlane, host: str, start: np.ndarray) -> MemoryRecords:
    """The plane's MemoryAllocation/MemoryDeallocation events with their allocator stats, by time."""
    metadata = dp.shell.event_metadata
    memory_md = [mid for mid, meta in metadata.items() if meta.name in tensorflow.MEMORY_EVENTS]
    rows = np.flatnonzero(np.isin(dp.metadata_id, memory_md))
    alloc_md = [mid for mid, meta in metadata.items() if meta.name == tensorflow.MEMORY_ALLOCATION]
    allocators, ops = _Interner(), _Interner()
    # Only the memory events' stats are needed: select them (in plane order) before densifying.
    stat = {name: dp.stats[name].at(rows) for name in _MEMORY_STATS}
    columns = {
        "time_ps": start[rows], "is_alloc": np.isin(dp.metadata_id[rows], alloc_md),
        "allocator": stat["allocator_name"].interned(rows.size, dp.stat_names, dp.strings, allocators.add),
        "op": stat["tf_op"].interned(rows.size, dp.stat_names, dp.strings, ops.add),
        "fragmentation": stat["fragmentation"].floats(rows.size),
        **{name: np.maximum(stat[name].ints(rows.size, dp.strings), 0) for name in _MEMORY_INTS}}
    order = np.argsort(columns["time_ps"], kind="stable")
    return MemoryRecords(host=host, **{name: column[order] for name, column in columns.items()},
                         allocators=allocators.strings, ops=ops.strings)


_HOST_COLUMNS = ("start_ps", "dur_ps", "thread", "name", "kind", "step_num", "is_root", "group_id", "correlation_id")
_MEMORY_COLUMNS = ("time_ps", "allocator", "is_alloc", *_MEMORY_INTS, "fragmentation", "op")


def _merged(tables: list, columns: tuple[str, ...], text_columns: dict[str, str]):
    """One table of TABLES (host activities or memory records of one host's planes, each sorted
    by its first column, a time): their COLUMNS' rows in time order, ties in plane order, each
    interned column (TEXT_COLUMNS: column -> its strings) indexing one merged list."""
    first = tables[0]
    if len(tables) == 1:
        return first
    strings = {}
    remapped: dict[str, list[np.ndarray]] = {}
    for column, field_name in text_columns.items():
        interner = _Interner()
        remapped[column] = []
        for table in tables:
            remap = np.fromiter(map(interner.add, getattr(table, field_name)), np.int32, len(getattr(table, field_name)))
            values = getattr(table, column)
            remapped[column].append(np.where(values >= 0, remap[np.clip(values, 0, None)] if remap.size else -1, -1)
                                    .astype(np.int32))
        strings[field_name] = interner.strings
    whole = {name: np.concatenate(remapped.get(name) or [getattr(t, name) for t in tables]) for name in columns}
    order = np.argsort(whole[columns[0]], kind="stable")
    return replace(first, **{name: column[order] for name, column in whole.items()}, **strings)


def _host_planes_merged(planes: list["_HostPlane"], host: str) -> tuple[HostActivity, MemoryRecords]:
    """The host's activity and memory records from all its host planes (usually one)."""
    if not planes:
        return _no_host_events(host)
    activity = _merged([p.activity for p in planes], _HOST_COLUMNS, {"name": "names", "thread": "threads"})
    stages: dict[str, InputStage] = {}
    for plane in planes:        # a stage's dataset is the first plane's that records one
        for name, stage in plane.activity.stages.items():
            if name not in stages or (stages[name].origin is None and stage.origin is not None):
                stages[name] = stage
    activity.stages = stages
    activity.input_threads = frozenset(i for i, t in enumerate(activity.threads) if tensorflow.is_input_pipeline_thread(t))
    memory = _merged([p.memory for p in planes], _MEMORY_COLUMNS, {"allocator": "allocators", "op": "ops"})
    return activity, memory


def _no_host_events(host: str) -> tuple[HostActivity, MemoryRecords]:
    """The tables of a capture without a host plane (a device-only capture)."""
    ints, small = np.empty(0, np.int64), np.empty(0, np.int32)
    activity = HostActivity(host=host, start_ps=ints, dur_ps=ints, thread=small, name=small,
                            kind=np.empty(0, np.int8), step_num=ints, is_root=np.empty(0, bool),
                            group_id=ints, correlation_id=ints, names=[], threads=[])
    memory = MemoryRecords(host=host, time_ps=ints, allocator=small, is_alloc=np.empty(0, bool),
                           **{name: ints for name in _MEMORY_INTS}, fragmentation=np.empty(0, np.float64),
                           op=small, allocators=[], ops=[])
    return activity, memory


def _wanted_stats(plane) -> tuple[str, ...] | None:
    """Which stats to extract from a plane's events; None skips planes we do not model."""
    if _DEVICE_PLANE.match(plane.name):
        return _DEVICE_STATS
    if plane.name in _HOST_PLANES:
        return _HOST_STATS
    return None


def _plane_origin(dp: DecodedPlane) -> int | None:
    """The earliest timestamp of the plane's lines that hold events."""
    stamps = [line.timestamp_ns for line in dp.lines if line.count]
    return min(stamps) if stamps else None


@dataclass
class _DevicePlane:
    """A device plane's tables, timed from the plane's own origin until the host's is known."""

    activity: DeviceActivity
    steps_line: RecordedSteps | None
    modules: list[ProgramRuns]
    origin_ns: int | None

    def rebase(self, origin_ns: int) -> None:
        delta = _delta_ps(self.origin_ns, origin_ns, self.activity.start_ps)
        for table in [self.activity, *([self.steps_line] if self.steps_line else []), *self.modules]:
            table.start_ps += delta
            if isinstance(table, DeviceActivity):
                table.moved()
            else:
                table.end_ps += delta


@dataclass
class _HostPlane:
    """A host plane's tables, timed from the plane's own origin until the host's is known."""

    activity: HostActivity
    memory: MemoryRecords
    origin_ns: int | None

    def rebase(self, origin_ns: int) -> None:
        delta = _delta_ps(self.origin_ns, origin_ns, self.activity.start_ps)
        self.activity.start_ps += delta
        self.activity.moved()
        self.memory.time_ps += delta


def _delta_ps(plane_origin_ns: int | None, origin_ns: int, starts: np.ndarray) -> int:
    """Picoseconds from the host's origin to a plane's, refused when the plane's event STARTS
    (sorted, from its own origin) would then leave the range every time must keep (MAX_PS)."""
    delta = 0 if plane_origin_ns is None else (plane_origin_ns - origin_ns) * 1000
    extent = max(abs(int(starts[0])), abs(int(starts[-1]))) if starts.size else 0
    if abs(delta) + extent >= MAX_PS:
        raise CaptureError(f"a plane's timestamps ({plane_origin_ns} ns) are too far from the capture's "
                           "other times; the capture is corrupt")
    return delta


# A plane's bytes above this size are not kept for the next plane: held through the build of
# that plane's tables they would add to the decode's peak (a 1 GB capture's host plane is half of
# it), while the planes that repeat (one per GPU) are smaller.
KEEP_BUFFER_BYTES = 128 << 20


class _ReadBuffers(threading.local):
    """Each worker thread's buffer for plane bytes, reused from plane to plane and replaced by
    a larger one when a plane does not fit (the decoded columns never refer to it)."""

    data: np.ndarray | None = None

    def fitting(self, size: int) -> np.ndarray:
        if self.data is None or self.data.size < size:
            self.data = None                # the old buffer goes before the new one is made
            self.data = np.empty(size, np.uint8)
        return self.data

    def _large(self) -> bool:
        return self.data is not None and self.data.size > KEEP_BUFFER_BYTES

    def scratch(self, data: memoryview) -> bool:
        """Whether DATA is in this thread's buffer and the buffer goes once DATA is decoded (a
        large one, see ``decoded``): the decoder may then hand its pages back as it goes."""
        return self._large() and data.obj is self.data

    def decoded(self) -> None:
        """The plane in the buffer is decoded: a large buffer goes now, before the tables are built."""
        if self._large():
            self.data = None


def _read_plane(capture: CaptureFile, span: tuple[int, int], host: str, admission: "_Admission",
                buffers: _ReadBuffers, parts: int) -> _DevicePlane | _HostPlane | None:
    """Read, admit and decode one plane (into the thread's reused buffer; its lines in PARTS
    parts on as many threads), and turn it into tables right away, in a worker thread, timed from
    the plane's own origin."""
    data = admission.admitted(capture.read(span, buffers.fitting(span[1] - span[0])))
    dp = decode_plane(data, _wanted_stats, at=span[0], release=buffers.scratch(data), parts=parts)
    del data
    buffers.decoded()
    if dp is None:
        return None         # a plane we do not model (metadata, task environment)
    origin = _plane_origin(dp)
    if _DEVICE_PLANE.match(dp.shell.name):
        return _DevicePlane(*_build_device(dp, host, origin or 0), origin)
    return _HostPlane(*_host_tables(dp, host, origin or 0), origin)


@dataclass(frozen=True)
class MemoryCost:
    """Peak bytes of building one host's tables, per unit counted before decoding."""

    per_file_byte: int
    per_event: int
    per_stat: int

    def needed(self, size: int, events: int, stats: int) -> int:
        return self.per_file_byte * size + self.per_event * events + self.per_stat * max(stats, 0)

    def most(self, size: int, events: int | None = None) -> int:
        """The most a file of SIZE bytes (holding EVENTS, when counted) can need: every event
        and stat takes 2 bytes or more, and stats lie inside events."""
        if events is None:
            return self.per_file_byte * size + max(self.per_event, self.per_stat) * (size // 2)
        return (self.per_file_byte * size + self.per_event * events
                + self.per_stat * max(size - 2 * events, 0) // 2)


# Measured with captures of 2-byte events, of empty stats and of benchmark-like events
# (tests/test_reliability.py checks the estimate bounds the real peak).  The C decoder packs
# columns; the pure-Python one holds a protobuf object per stat and cannot count stats
# cheaply, so its file bytes are charged at the cost of the smallest possible stats.
COST_C = MemoryCost(per_file_byte=1, per_event=130, per_stat=24)
COST_PYTHON = MemoryCost(per_file_byte=40, per_event=200, per_stat=0)


def memory_needed(capture: CaptureFile) -> tuple[int, int]:
    """(peak bytes to build this capture's tables, its events), from a count that decodes nothing.

    The planes are counted on threads (the C count releases the GIL), each read into its
    thread's reused buffer: this count runs while the decode waits for it (``_Admission``), and
    one fresh buffer per plane faulted the whole file in again (a 978 MB capture whose bound
    passed an 8.8 GiB budget: 2.1 s of CPU, on one core, before the decode went on)."""
    fast = has_fast_decoder()
    buffers = _ReadBuffers()

    def count(span: tuple[int, int]) -> tuple[int, int]:
        counted = count_events(capture.read(span, buffers.fitting(span[1] - span[0])), fast)
        buffers.decoded()           # a large buffer goes, as after a decode
        return counted

    spans = sorted(capture.index.plane_spans, key=lambda span: span[0] - span[1])     # largest first
    with ThreadPoolExecutor(max_workers=cores.threads(MOST_THREADS)) as pool:
        counts = list(pool.map(count, spans))
    events, stats = sum(e for e, _ in counts), sum(s for _, s in counts)
    return (COST_C if fast else COST_PYTHON).needed(capture.size, events, stats), events


def _check_budget(capture: CaptureFile, budget: int | None) -> None:
    """Refuse the capture when building its tables needs more than BUDGET bytes (a count of
    every plane's events and stats, nothing decoded)."""
    needed, events = memory_needed(capture)
    if budget is not None and needed > budget:
        hint = "" if has_fast_decoder() else "; installing with a C compiler (the fast decoder) needs far less"
        raise CaptureError(
            f"refused: this capture holds {events:,} events and analysing it needs about "
            f"{needed / 2**30:.2f} GiB of memory, more than the {budget / 2**30:.2f} GiB available for it "
            f"(free memory or TB_GPUADVISOR_MEMORY_LIMIT_MB){hint}; capture fewer steps "
            "(a shorter profile_batch range) or analyse it on a machine with more memory")


class _Admission:
    """Lets a plane be decoded only while the memory its tables may take still fits the budget.

    Each worker counts the events of the plane it has just read (stepping over their bodies, on
    bytes it reads anyway) and adds the most that plane can need (``MemoryCost.most``). While
    the sum stays within the budget, the planes decoded so far fit in it; once it does not, the
    whole capture's exact count decides, once, before anything else is decoded. A file too small
    to ever exceed the budget, or one read without the C decoder, is settled when opened.
    """

    def __init__(self, capture: CaptureFile, budget: int | None) -> None:
        self.capture, self.budget = capture, budget
        self.lock = threading.Lock()
        self.settled = budget is None or COST_C.most(capture.size) <= budget
        if not self.settled and not has_fast_decoder():
            _check_budget(capture, budget)   # the Python count is slow, and needed anyway
            self.settled = True
        plane_bytes = sum(stop - start for start, stop in capture.index.plane_spans)
        self.bound = COST_C.per_file_byte * (capture.size - plane_bytes)

    def admitted(self, data: memoryview) -> memoryview:
        """DATA (a plane's bytes) once it may be decoded; CaptureError when the capture is refused."""
        if self.settled:
            return data
        events = count_events(data, stats=False)[0]
        with self.lock:
            if not self.settled:
                self.bound += COST_C.most(len(data), events)
                if self.bound > self.budget:
                    _check_budget(self.capture, self.budget)
                    self.settled = True
        return data


# Planes are read, decoded and converted in parallel: the C decoder and numpy release the GIL.
# Each thread holds one buffer of plane bytes (as large as its largest plane so far) and one
# plane's columns at a time, so threads bound the memory too.
MOST_THREADS = 2


# A plane is decoded in parts when it holds this much more than one decode thread's share of the
# capture's plane bytes.
SPLIT_OVER_SHARE = 1.2


def _decode_parts(spans: list[tuple[int, int]], threads: int) -> list[int]:
    """In how many parts each plane's lines are decoded: THREADS for a plane well over one
    thread's share of the planes' bytes (SPLIT_OVER_SHARE), else 1. Such a plane (a host plane
    2-3x the GPU planes together, as real TensorFlow captures have; the only plane of a CPU-only
    capture) would decode on one core while the others run out of planes. A plane near its
    share keeps one thread: the others' planes fill the other cores anyway, and joining the parts'
    columns faults their pages in a second time (the 495 MB host plane of a 978 MB capture, 51%
    of it: 0.92 instead of 0.75 s of CPU; in the whole decode 0.5 s more CPU, no less wall)."""
    sizes = [stop - start for start, stop in spans]
    share = sum(sizes) / max(threads, 1)
    return [threads if threads > 1 and size > SPLIT_OVER_SHARE * share else 1 for size in sizes]


def read_host(path: str, host: str, opener: Opener | None = None, budget: int | None = None) -> HostCapture:
    """Build one host's tables from its capture file.

    Raises CaptureError when the file is unreadable, or when its events would need more than
    BUDGET bytes (counted before the plane that would pass it is decoded: see ``_Admission``).
    """
    with CaptureFile(path, opener) as capture:
        admission = _Admission(capture, budget)
        warnings = [f"profiler error: {e}" for e in capture.index.errors]
        warnings += [f"profiler warning: {w}" for w in capture.index.warnings]
        spans = capture.index.plane_spans
        # The largest planes first, so that the last to finish is a small one.
        largest = sorted(range(len(spans)), key=lambda i: spans[i][0] - spans[i][1])
        buffers = _ReadBuffers()
        threads = cores.threads(MOST_THREADS)
        parts = _decode_parts(spans, threads)
        with ThreadPoolExecutor(max_workers=threads) as pool:
            done = dict(zip(largest, pool.map(
                lambda i: _read_plane(capture, spans[i], host, admission, buffers, parts[i]), largest)))
        planes = [p for p in (done[i] for i in range(len(spans))) if p is not None]
    device_planes = [p for p in planes if isinstance(p, _DevicePlane)]
    host_planes = [p for p in planes if isinstance(p, _HostPlane)]
    origins = [p.origin_ns for p in planes if p.origin_ns is not None]
    origin_ns = min(origins) if origins else 0
    for plane in planes:
        plane.rebase(origin_ns)
    activity, memory = _host_planes_merged(host_planes, host)
    devices = sorted((p.activity for p in device_planes), key=lambda d: (d.device.kind, d.device.index))
    steps_line = next((p.steps_line for p in device_planes if p.steps_line is not None), None)
    modules = [m for p in device_planes for m in p.modules]
    result = HostCapture(host, activity, memory, devices, steps_line, modules, warnings, origin_ns)
    earliest = result.earliest_ps()
    if earliest:
        # Zero is the first recorded event; origin_ns keeps the absolute clock for other hosts.
        result.shift(-earliest)
        result.origin_ns += earliest // 1000
    return result
