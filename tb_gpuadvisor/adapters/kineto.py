"""The Kineto adapter: a PyTorch profiler trace (``*.pt.trace.json[.gz]``) as one host's tables.

Each rank's (or worker's) file is one host.  Device events (``kernel``/``gpu_memcpy``/
``gpu_memset``, older ``Kernel``/``Memcpy``/``Memset``) become one table per GPU (``args.device``);
host events (``cpu_op``, ``user_annotation``, ``cuda_runtime``, ``cuda_driver``,
``python_function``, older ``Operator``/``Runtime``) become the host table, one thread per
(pid, tid).  Event kinds come from ``vocab.pytorch``, classified once per distinct name.  Times
are microseconds in the file (integers, or floats with nanosecond digits counted from
``baseTimeNanoseconds``), picoseconds from the first event here.
"""

from __future__ import annotations

import numpy as np

from tb_gpuadvisor.adapters.kineto_json import Columns, DeviceProperties, decode, inflate
from tb_gpuadvisor.model.build import MAX_PS, HostCapture
from tb_gpuadvisor.model.timeline import Device, DeviceActivity, HostActivity, HostEventKind, MemoryRecords
from tb_gpuadvisor.vocab import pytorch
from tb_gpuadvisor.xspace.reader import CaptureError, Opener, read_bytes

# Peak bytes per byte of (inflated) JSON, measured by benchmarks/kineto.py: the text, the decoded
# events of the fields kept, and the columns built from them.
MEMORY_PER_JSON_BYTE = 3


def read(path: str, host: str, opener: Opener | None = None, budget: int | None = None) -> HostCapture:
    """One rank's trace as a HostCapture; CaptureError (one line) when it cannot be read."""
    data = read_bytes(path, opener)
    for stage in (data, inflate(data)):        # the file as stored, then its inflated text
        if budget is not None and MEMORY_PER_JSON_BYTE * len(stage) > budget:
            _refuse(len(stage), budget)
        data = stage
    return build(decode(data), host)


def _refuse(size: int, budget: int) -> None:
    raise CaptureError(
        f"refused: this {size / 2**20:.0f} MiB trace needs about {MEMORY_PER_JSON_BYTE * size / 2**30:.2f} GiB "
        f"of memory, more than the {budget / 2**30:.2f} GiB available for it (free memory or "
        "TB_GPUADVISOR_MEMORY_LIMIT_MB); profile fewer steps (torch.profiler.schedule(active=...)) "
        "or analyse it on a machine with more memory")


class _Interner(dict):
    """Strings to dense indices in first-seen order."""

    def indices(self, values) -> np.ndarray:
        return np.fromiter((self.setdefault(v, len(self)) for v in values), np.int32, len(values))

    @property
    def strings(self) -> list[str]:
        return list(self)


def _optional_ints(values: list) -> np.ndarray:
    """A column of ints where None (absent) is -1."""
    return np.fromiter((-1 if v is None else int(v) for v in values), np.int64, len(values))


def _times(cols: Columns) -> tuple[np.ndarray, np.ndarray, int]:
    """(start ps from the first event, duration ps, origin ns on the trace's absolute clock)."""
    ts = np.asarray(cols.ts, np.float64)
    dur = np.asarray(cols.dur, np.float64)
    if not (np.isfinite(ts).all() and np.isfinite(dur).all()):
        raise CaptureError("an event time is not a finite number; the trace is corrupt")
    first = float(ts.min())
    start = (ts - first) * 1e6
    dur = np.clip(dur, 0, None) * 1e6
    if start.max() >= MAX_PS or dur.max() >= MAX_PS:
        raise CaptureError("the trace's events span more than 50 days; its timestamps are corrupt")
    return np.rint(start).astype(np.int64), np.rint(dur).astype(np.int64), cols.base_ns + round(first * 1000)


def _kinds(keys: np.ndarray, cats: list[str], names: list[str], classify) -> np.ndarray:
    """CLASSIFY(name, category) once per distinct (category, name) pair of KEYS."""
    distinct, inverse = np.unique(keys, return_inverse=True)
    width = max(len(names), 1)
    kinds = np.fromiter((classify(names[k % width], cats[k // width]) for k in distinct.tolist()),
                        np.int8, distinct.size)
    return kinds[inverse.reshape(-1)] if keys.size else np.empty(0, np.int8)


def _device_of(index: int, host: str, props: dict[int, DeviceProperties], vendor: str) -> Device:
    p = props.get(index)
    cc = f"{p.major}.{p.minor or 0}" if p is not None and p.major is not None else None
    return Device(name=f"/device:GPU:{index}", host=host, kind="gpu", index=index,
                  vendor=pytorch.vendor_of([], p.name) if p is not None and p.name else vendor,
                  model=p.name if p is not None else None, compute_capability=cc,
                  sm_count=p.sms if p is not None else None,
                  memory_bytes=p.total_memory if p is not None else None)


def _empty_memory(host: str) -> MemoryRecords:
    i64, i32 = np.empty(0, np.int64), np.empty(0, np.int32)
    return MemoryRecords(host, i64, i32, np.empty(0, bool), i64, i64, i64, i64, i64,
                         np.empty(0, np.float64), i32, [], [])


def build(cols: Columns, host: str) -> HostCapture:
    """HOST's tables from the decoded columns of its trace."""
    n = len(cols.name)
    if not n:
        raise CaptureError(f"the trace holds no timed events (of its {cols.events} entries); it is not a "
                           "PyTorch profiler trace, or the profiler recorded nothing")
    start, dur, origin_ns = _times(cols)
    names, cats = _Interner(), _Interner()
    name = names.indices(cols.name)
    cat = cats.indices([c.lower() for c in cols.cat])
    cat_names, name_list = cats.strings, names.strings
    key = cat.astype(np.int64) * max(len(name_list), 1) + name
    is_device = np.isin(cat, [i for i, c in enumerate(cat_names) if c in pytorch.DEVICE_CATEGORIES])
    is_host = np.isin(cat, [i for i, c in enumerate(cat_names) if c in pytorch.HOST_CATEGORIES])
    correlation = _optional_ints(cols.correlation)

    host_rows = np.flatnonzero(is_host)
    host_rows = host_rows[np.argsort(start[host_rows], kind="stable")]
    kind = _kinds(key[host_rows], cat_names, name_list, pytorch.host_event_kind)
    # A runtime call whose correlation id a device event carries put that work on the GPU.
    dev_rows = np.flatnonzero(is_device)
    launched = np.isin(correlation[host_rows], correlation[dev_rows]) & (correlation[host_rows] >= 0)
    runtime = np.isin(cat[host_rows], [i for i, c in enumerate(cat_names) if c in pytorch.RUNTIME_CATEGORIES])
    kind = np.where(launched & runtime, np.int8(HostEventKind.LAUNCH), kind)
    launch_corr = np.where(kind == HostEventKind.LAUNCH, correlation[host_rows], -1)
    step_num = np.full(host_rows.size, -1, np.int64)
    marker = np.flatnonzero(kind == HostEventKind.STEP_MARKER)
    step_num[marker] = [pytorch.step_number(name_list[i]) for i in name[host_rows[marker]].tolist()]

    threads = _Interner()
    thread_names = {(str(p), str(t)): label for (p, t), label in cols.threads.items()}
    thread = threads.indices([thread_names.get((str(cols.pid[i]), str(cols.tid[i])), f"thread {cols.tid[i]}")
                              for i in host_rows.tolist()])
    # Device-table names and host-table names are interned separately (each table has its own list).
    host_names = _Interner()
    activity = HostActivity(
        host=host, start_ps=start[host_rows], dur_ps=dur[host_rows], thread=thread,
        name=host_names.indices([name_list[i] for i in name[host_rows].tolist()]), kind=kind,
        step_num=step_num, is_root=kind == HostEventKind.STEP_MARKER,
        group_id=np.full(host_rows.size, -1, np.int64), correlation_id=launch_corr,
        names=host_names.strings, threads=threads.strings, step=np.full(host_rows.size, -1, np.int32))

    runtime_names = [name_list[i] for i in np.unique(name[host_rows[runtime]]).tolist()]
    vendor = pytorch.vendor_of(runtime_names, next((p.name for p in cols.devices if p.name), None))
    devices = _devices(cols, host, dev_rows, start, dur, correlation, vendor)
    warnings = []
    if not devices and np.any(kind == HostEventKind.LAUNCH):
        warnings.append(f"the host made {int(np.count_nonzero(kind == HostEventKind.LAUNCH)):,} GPU launch "
                        "calls but the trace holds no GPU activity: device activity was not recorded "
                        "(CUPTI/roctracer off or failed), so nothing is said about the GPU")
    return HostCapture(host, activity, _empty_memory(host), devices, None, [], warnings, origin_ns)


def _devices(cols: Columns, host: str, rows: np.ndarray, start: np.ndarray, dur: np.ndarray,
             correlation: np.ndarray, vendor: str) -> list[DeviceActivity]:
    """One table per GPU.  The op column stays empty: a kernel's op in the device table names a
    graph node (TensorFlow's "scope/conv1/Conv2D"), and a PyTorch op name ("aten::conv2d") names
    every call of that op at once; the host table holds each op call."""
    props = {p.id: p for p in cols.devices}
    device = np.fromiter((-1 if cols.device[i] is None else int(cols.device[i]) for i in rows.tolist()),
                         np.int64, rows.size)
    stream = _optional_ints([cols.stream[i] for i in rows.tolist()])
    nbytes = np.maximum(_optional_ints([cols.nbytes[i] for i in rows.tolist()]), 0)
    out = []
    for index in np.unique(device).tolist():
        pick = np.flatnonzero(device == index)
        pick = pick[np.argsort(start[rows[pick]], kind="stable")]
        sel = rows[pick]
        names, streams = _Interner(), _Interner()
        event_names = [cols.name[i] for i in sel.tolist()]
        name_idx = names.indices(event_names)
        cats = [cols.cat[i].lower() for i in sel.tolist()]
        kind_of = {}
        kind = np.fromiter((kind_of.setdefault((c, n), pytorch.device_event_kind(n, c))
                            for c, n in zip(cats, event_names)), np.int8, sel.size)
        out.append(DeviceActivity(
            device=_device_of(max(index, 0), host, props, vendor), start_ps=start[sel], dur_ps=dur[sel],
            kind=kind, stream=streams.indices([f"Stream #{s}" for s in stream[pick].tolist()]),
            name=name_idx, op=np.full(sel.size, -1, np.int32), correlation_id=correlation[sel], group_id=np.full(sel.size, -1, np.int64),
            nbytes=nbytes[pick], details=np.full(sel.size, -1, np.int32), names=names.strings,
            ops=[], streams=streams.strings, detail_strings=[], step=np.full(sel.size, -1, np.int32)))
    return out
