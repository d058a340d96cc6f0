"""The Kineto adapter: a PyTorch profiler trace (``*.pt.trace.json[.gz]``) as one host's tables.

Each rank's (or worker's) file is one host.  Device events (``kernel``/``gpu_memcpy``/
``gpu_memset``, older ``Kernel``/``Memcpy``/``Memset``) become one table per GPU (``args.device``);
host events (``cpu_op``, ``user_annotation``, ``cuda_runtime``, ``cuda_driver``,
``python_function``, older ``Operator``/``Runtime``) become the host table, one thread per
tid.  Event kinds come from ``vocab.pytorch``, classified once per distinct name.  Times
are microseconds in the file (integers, or floats with nanosecond digits counted from
``baseTimeNanoseconds``), picoseconds from the first event here.
"""

from __future__ import annotations

import os
import time

import numpy as np

from tb_gpuadvisor.arrays import SortedKeys, last_at_or_before, narrow_ids, renumber_small_ints
from tb_gpuadvisor.input.capture import MAX_PS, HostCapture, RecordedSteps
from tb_gpuadvisor.input.files import (
    GZIP_MAGIC, BeingWritten, CaptureError, LocalFile, Opener, read_bytes, remote_stamp,
)
from tb_gpuadvisor.input.kineto.sniff import WRITING_S
from tb_gpuadvisor.input.kineto.decode import (
    Columns, CommArgs, DeviceProperties, Truncated, decode, inflate,
)
from tb_gpuadvisor.kinds import DeviceEventKind, HostEventKind, InputStage
from tb_gpuadvisor.timeline import CollectiveCall, Device, DeviceActivity, HostActivity, MemoryRecords
from tb_gpuadvisor.vocab import gpu, pytorch

# Peak bytes per byte of (inflated) JSON, measured by benchmarks/kineto.py on the 1 GB tiled
# trace: 0.76 for a plain file (read and decoded a run at a time), 1.57 for a gzip file
# (its inflated text is held whole), with room for traces of smaller events.
MEMORY_PER_JSON_BYTE = 2


def read(path: str, host: str, opener: Opener | None = None, budget: int | None = None) -> HostCapture:
    """One rank's trace as a HostCapture; CaptureError (one line) when it cannot be read, and
    BeingWritten when it ends early while the profiler is still writing it.  A local
    plain-JSON trace is decoded a run at a time from the file, never held whole; a gzip one is
    inflated only as far as BUDGET allows."""
    name = os.path.basename(path)
    if opener is not None:
        _check_budget(_remote_size(path, opener), budget)
        stored = read_bytes(path, opener)
        _check_budget(len(stored), budget)
        _check_gzip(name, bytes(stored[:2]))
        return build(_decode_bytes(stored, budget, name), host)
    before = _stamp(path)
    try:
        with LocalFile(path) as local:
            _check_budget(len(local), budget)
            head = bytes(local.read(0, 2))
            _check_gzip(name, head)
            gzipped = head == GZIP_MAGIC
            cols = _decode_bytes(local.read(0, len(local)), budget, name) if gzipped else decode(local)
    except CaptureError as err:
        writing = _still_written(path, before, err)
        if writing:
            raise BeingWritten(f"being written: {writing}; it can be read once the profiler has finished it") from None
        raise
    return build(cols, host)


def _check_gzip(name: str, head: bytes) -> None:
    """A file named ``.gz`` whose first bytes HEAD are neither gzip's nor a JSON document's is
    corrupt: said so, not decoded as text."""
    if name.endswith(".gz") and head != GZIP_MAGIC and head[:1] != b"{":
        raise CaptureError("this file is named .gz but is not gzip (it does not start with gzip's "
                           "magic bytes 1f 8b); the file is corrupt")


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _still_written(path: str, before: tuple[int, int] | None, err: CaptureError) -> str | None:
    """Why the trace at PATH, which failed to read with ERR, is one the profiler is still
    writing (it changed since BEFORE, or it is empty or ends early and changed within
    WRITING_S), else None."""
    after = _stamp(path)
    if before is None or after is None:
        return None
    if after != before:
        return "the file changed while it was read"
    age = max(time.time() - after[1] / 1e9, 0)
    if age >= WRITING_S:
        return None
    if after[0] == 0:
        return f"the file is empty and changed {age:.0f} s ago"
    return f"the trace ends early and the file changed {age:.0f} s ago" if isinstance(err, Truncated) else None


def _remote_size(path: str, opener: Opener) -> int:
    """A remote file's size as its store reports it (0 when it does not say: the read says why)."""
    try:
        size, _ = remote_stamp(opener.info(path))
    except Exception:   # noqa: BLE001 - each store raises its own kinds; read_bytes reports them
        return 0
    return size or 0


def _decode_bytes(stored, budget: int | None, name: str) -> Columns:
    """The columns of a trace's bytes: gzip inflated first, never past what BUDGET allows."""
    text = inflate(stored, None if budget is None else budget // MEMORY_PER_JSON_BYTE, name)
    del stored
    return decode(text)


def _check_budget(size: int, budget: int | None) -> None:
    if budget is not None and MEMORY_PER_JSON_BYTE * size > budget:
        _refuse(size, budget)


def _refuse(size: int, budget: int) -> None:
    raise CaptureError(
        f"refused: this {size / 2**20:.0f} MiB trace needs about {MEMORY_PER_JSON_BYTE * size / 2**30:.2f} GiB "
        f"of memory, more than the {budget / 2**30:.2f} GiB available for it (free memory or "
        "TB_GPUADVISOR_MEMORY_LIMIT_MB); profile fewer steps (torch.profiler.schedule(active=...)) "
        "or analyse it on a machine with more memory")


class _Interner(dict):
    """Strings to dense indices in first-seen order."""

    def indices(self, values: list) -> np.ndarray:
        for value in dict.fromkeys(values):         # the new distinct values, at C speed
            self.setdefault(value, len(self))
        return np.fromiter(map(self.__getitem__, values), np.int32, len(values))

    @property
    def strings(self) -> list[str]:
        return list(self)


def _times(cols: Columns) -> tuple[np.ndarray, np.ndarray, int, float]:
    """(start ps from the first event, duration ps, origin ns on the trace's absolute clock, and
    the first event's time in the trace's microseconds: every other table's zero)."""
    ts, dur = cols.ts, cols.dur
    if not (np.isfinite(ts).all() and np.isfinite(dur).all()):
        raise CaptureError("an event time is not a finite number; the trace is corrupt")
    first = float(ts.min())
    start = (ts - first) * 1e6
    dur = np.clip(dur, 0, None) * 1e6
    if start.max() >= MAX_PS or dur.max() >= MAX_PS:
        raise CaptureError("the trace's events span more than 50 days; its timestamps are corrupt")
    return np.rint(start).astype(np.int64), np.rint(dur).astype(np.int64), cols.base_ns + round(first * 1000), first


def _kinds(keys: np.ndarray, cats: list[str], names: list[str], classify) -> np.ndarray:
    """CLASSIFY(name, category) once per distinct (category, name) pair of KEYS."""
    distinct, inverse = renumber_small_ints(keys)
    width = max(len(names), 1)
    kinds = np.fromiter((classify(names[k % width], cats[k // width]) for k in distinct.tolist()),
                        np.int8, distinct.size)
    return kinds[inverse] if keys.size else np.empty(0, np.int8)


def _category_mask(cat_names: list[str], wanted: frozenset[str]) -> np.ndarray:
    """Per category index: is it one of WANTED."""
    return np.fromiter((c in wanted for c in cat_names), bool, len(cat_names))


def _subset(index: np.ndarray, strings: list[str]) -> tuple[list[str], np.ndarray]:
    """(the strings INDEX uses, INDEX renumbered into them)."""
    used, inverse = renumber_small_ints(index)
    return [strings[i] for i in used.tolist()], inverse


def _wraps_others(thread: np.ndarray, start: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Per event: does another event of its thread start inside it (events nest per thread, so the
    next one by start, longer first on ties, is inside exactly when some is)."""
    order = np.lexsort((-dur, start, thread))
    out = np.zeros(thread.size, bool)
    if thread.size > 1:
        this, after = order[:-1], order[1:]
        out[this] = (thread[after] == thread[this]) & (start[after] < start[this] + dur[this])
    return out


def _device_of(index: int, host: str, props: dict[int, DeviceProperties], vendor: str, kernels: list[str]) -> Device:
    """GPU INDEX as deviceProperties describe it; without its compute capability there (traces
    before PyTorch 1.9 write no deviceProperties), the least one its KERNELS' names say."""
    p = props.get(index)
    cc = f"{p.major}.{p.minor or 0}" if p is not None and p.major is not None else None
    vendor = pytorch.vendor_of([], p.name) if p is not None and p.name else vendor
    if cc is None and vendor == "NVIDIA" and (named := gpu.compute_capability_of_kernels(kernels)):
        cc = f"{named[0]}.{named[1]}"
    return Device(name=f"/device:GPU:{index}", host=host, kind="gpu", index=index, vendor=vendor,
                  model=p.name if p is not None else None, compute_capability=cc,
                  sm_count=p.sms if p is not None else None,
                  memory_bytes=p.total_memory if p is not None else None)


def _memory(cols: Columns, host: str, first: float) -> MemoryRecords:
    """The GPU caching allocator's [memory] events (profile_memory=True) as allocator records,
    one allocator per GPU ("cuda:0"): bytes allocated and reserved after each event; what is
    reserved but not allocated is the allocator's cache (its ``bytes_available``, and as a
    share of reserved its ``fragmentation``), timed from FIRST as the events are.  Empty when the
    trace has none."""
    # An event time too far from the others to be one of this trace's (a corrupt one) is left out.
    keep = ((cols.mem_device_type == pytorch.GPU_MEMORY_DEVICE_TYPE) & (cols.mem_device >= 0)
            & (np.abs(cols.mem_ts - first) * 1e6 < MAX_PS))
    rows = np.flatnonzero(keep)
    rows = rows[np.argsort(cols.mem_ts[rows], kind="stable")]
    device = cols.mem_device[rows]
    used, allocator = renumber_small_ints(device)
    allocated = np.maximum(cols.mem_allocated[rows], 0)
    reserved = np.maximum(cols.mem_reserved[rows], allocated)
    time_ps = np.rint((cols.mem_ts[rows] - first) * 1e6).astype(np.int64)
    cached = reserved - allocated
    fragmentation = np.divide(cached, reserved, out=np.zeros(rows.size), where=reserved > 0)
    return MemoryRecords(host, time_ps, allocator.astype(np.int32), cols.mem_bytes[rows] > 0, allocated, allocated,
                         reserved, cached, np.abs(cols.mem_bytes[rows]), fragmentation,
                         np.full(rows.size, -1, np.int32), [pytorch.allocator_name(d) for d in used.tolist()], [])


def build(cols: Columns, host: str) -> HostCapture:
    """HOST's tables from the decoded columns of its trace."""
    n = len(cols.name)
    if not n:
        raise CaptureError(f"the trace holds no timed events (of its {cols.events} entries); it is not a "
                           "PyTorch profiler trace, or the profiler recorded nothing")
    start, dur, origin_ns, first = _times(cols)
    names, raw_cats, cats = _Interner(), _Interner(), _Interner()
    name = names.indices(cols.name)
    raw_cat = raw_cats.indices(cols.cat)
    # Categories in either spelling ("Kernel", "kernel") are one category.
    lowered = np.fromiter((cats.setdefault(c.lower(), len(cats)) for c in raw_cats.strings), np.int32, len(raw_cats))
    cat = lowered[raw_cat]
    cat_names, name_list = cats.strings, names.strings
    key = cat.astype(np.int64) * max(len(name_list), 1) + name
    is_device = _category_mask(cat_names, pytorch.DEVICE_CATEGORIES)[cat]
    is_host = _category_mask(cat_names, pytorch.HOST_CATEGORIES)[cat]
    correlation = cols.correlation

    host_rows = np.flatnonzero(is_host)
    host_rows = host_rows[np.argsort(start[host_rows], kind="stable")]
    kind = _kinds(key[host_rows], cat_names, name_list, pytorch.host_event_kind)
    # A runtime call whose correlation id a device event carries put that work on the GPU.
    dev_rows = np.flatnonzero(is_device)
    ids = correlation[host_rows]
    launched = (ids >= 0) & np.isin(ids, correlation[dev_rows])
    runtime = _category_mask(cat_names, pytorch.RUNTIME_CATEGORIES)[cat[host_rows]]
    kind = np.where(launched & runtime, np.int8(HostEventKind.LAUNCH), kind)
    launch_corr = np.where(kind == HostEventKind.LAUNCH, correlation[host_rows], -1)
    dev_kind = np.empty(n, np.int8)
    dev_kind[dev_rows] = _kinds(key[dev_rows], cat_names, name_list, pytorch.device_event_kind)
    kind = _set_up(kind, host_rows, dev_rows[dev_kind[dev_rows] == DeviceEventKind.KERNEL], start, dur, cols.device,
                   correlation, name, name_list)
    kind = _context_creation(kind, host_rows, dev_rows, start, dur, name, name_list)
    all_tids = _Interner()
    host_tid = all_tids.indices(cols.tid)[host_rows]
    annotation = _category_mask(cat_names, pytorch.ANNOTATION_CATEGORIES)[cat[host_rows]]
    scope = annotation & (kind == HostEventKind.OTHER) & _wraps_others(host_tid, start[host_rows], dur[host_rows])
    kind = np.where(scope, np.int8(HostEventKind.SCOPE), kind)
    step_num = np.full(host_rows.size, -1, np.int64)
    marker = np.flatnonzero(kind == HostEventKind.STEP_MARKER)
    step_num[marker] = [pytorch.step_number(name_list[i]) for i in name[host_rows[marker]].tolist()]

    # cuDNN's algorithm search is set-up; the launches inside it still name their op (below).
    tuning = _autotuning(kind, host_tid, start[host_rows], dur[host_rows], name[host_rows], name_list)
    # A thread is its tid (older traces write it as a string in events, a number in metadata).
    tid_names, tid = _subset(host_tid, [str(t) for t in all_tids.strings])
    labels = {str(t): label for (_, t), label in cols.threads.items()}
    threads = [labels.get(t, f"thread {t}") for t in tid_names]
    # Each table has its own list of names: the distinct names of its rows.
    host_names, host_name = _subset(name[host_rows], name_list)
    activity = HostActivity(
        host=host, start_ps=start[host_rows], dur_ps=dur[host_rows], thread=tid,
        name=host_name, kind=np.where(tuning, np.int8(HostEventKind.AUTOTUNE), kind),
        step_num=step_num, is_root=kind == HostEventKind.STEP_MARKER,
        group_id=np.full(host_rows.size, -1, np.int64), correlation_id=launch_corr,
        names=host_names, threads=threads, step=np.full(host_rows.size, -1, np.int32),
        stages=_input_stages(host_names, host_name, kind))

    runtime_names = [name_list[i] for i in np.unique(name[host_rows[runtime]]).tolist()]
    vendor = pytorch.vendor_of(runtime_names, next((p.name for p in cols.devices if p.name), None))
    scopes = _CollectiveScopes(cols, host_rows, host_tid, start, dur, kind, name, name_list)
    op_of = _launching_ops(host_tid, start[host_rows], dur[host_rows], kind, launch_corr, name[host_rows], name_list)
    devices = _devices(cols, host, dev_rows, start, dur, correlation, vendor, name, dev_kind, name_list,
                       scopes, op_of, unused=not (kind == HostEventKind.LAUNCH).any())
    warnings = []
    if not devices and np.any(kind == HostEventKind.LAUNCH):
        warnings.append(f"the host made {int(np.count_nonzero(kind == HostEventKind.LAUNCH)):,} GPU launch "
                        "calls but the trace holds no GPU activity: device activity was not recorded "
                        "(CUPTI/roctracer off or failed), so nothing is said about the GPU")
    # A Kineto trace is PyTorch's even when it holds no host event (a capture of CUDA activity only).
    return HostCapture(host, activity, _memory(cols, host, first), devices, None, [], warnings, origin_ns,
                       _sampled(correlation[host_rows[runtime]]), framework=pytorch.FRAMEWORK,
                       device_steps=_device_steps(cat, name, cat_names, name_list, start, dur))


def _set_up(kind: np.ndarray, host_rows: np.ndarray, kernel_rows: np.ndarray, start: np.ndarray, dur: np.ndarray,
            device: np.ndarray, correlation: np.ndarray, name: np.ndarray, name_list: list[str]) -> np.ndarray:
    """KIND (of the host events HOST_ROWS) with first-use set-up told apart from slow launches.  A
    launch call of ``FIRST_USE_LAUNCH_PS`` or more is set-up when it launched one kernel whose first
    run on its GPU it was (of KERNEL_ROWS, the devices' kernels): it loaded that kernel (lazy module
    loading) and, before the GPU's first work, the context and libraries.  Any other long launch is a
    slow launch: a blocking copy waits for the device, a graph launch puts many kernels on it, and a
    launch of a kernel run before waited for a full queue."""
    long = np.flatnonzero((kind == HostEventKind.LAUNCH) & (dur[host_rows] >= pytorch.FIRST_USE_LAUNCH_PS))
    kind = kind.copy()
    kind[long] = HostEventKind.SLOW_LAUNCH
    long = long[_names_where(name[host_rows[long]], name_list, pytorch.may_load_kernel)]
    if not long.size:
        return kind
    # The kernels of those launches, and every run of a kernel of theirs: the first run of each kernel
    # name on each GPU (by start; the earlier in the file on ties) is one a long launch may have loaded.
    launched = kernel_rows[np.isin(correlation[kernel_rows], correlation[host_rows[long]])]
    runs = kernel_rows[np.isin(name[kernel_rows], name[launched])]
    runs = runs[np.lexsort((runs, start[runs], name[runs], device[runs]))]
    first = np.ones(runs.size, bool)
    first[1:] = (device[runs[1:]] != device[runs[:-1]]) | (name[runs[1:]] != name[runs[:-1]])
    kind[long[np.isin(correlation[host_rows[long]], correlation[runs[first]])]] = HostEventKind.FIRST_USE
    return kind


def _context_creation(kind: np.ndarray, host_rows: np.ndarray, dev_rows: np.ndarray, start: np.ndarray,
                      dur: np.ndarray, name: np.ndarray, name_list: list[str]) -> np.ndarray:
    """KIND with the call that created the device's context as set-up: the host's first allocator call
    of a name that creates the context on first use (``cudaFree``), lasting ``CONTEXT_CREATION_PS`` or
    more and ending before any device work (DEV_ROWS) started.  A later or shorter one freed memory."""
    calls = np.flatnonzero(kind == HostEventKind.ALLOCATOR)
    calls = calls[_names_where(name[host_rows[calls]], name_list, pytorch.may_create_context)]
    if not calls.size:
        return kind
    first = int(calls[0])
    call = host_rows[first]         # host rows are in start order
    if dur[call] >= pytorch.CONTEXT_CREATION_PS and (not dev_rows.size or start[call] + dur[call] <= start[dev_rows].min()):
        kind = kind.copy()
        kind[first] = HostEventKind.FIRST_USE
    return kind


def _names_where(ids: np.ndarray, name_list: list[str], predicate) -> np.ndarray:
    """Per name id of IDS: does PREDICATE hold for its name (asked once per distinct name)."""
    used = np.unique(ids)
    holds = np.fromiter((predicate(name_list[i]) for i in used.tolist()), bool, used.size)
    return holds[np.searchsorted(used, ids)] if ids.size else np.zeros(0, bool)


def _input_stages(names: list[str], name: np.ndarray, kind: np.ndarray) -> dict[str, InputStage]:
    """The facts of each DataLoader wait and pinning among the host events (NAME, KIND)."""
    wanted = np.unique(name[(kind == HostEventKind.INPUT_WAIT) | (kind == HostEventKind.INPUT_STAGE)])
    return {names[i]: pytorch.input_stage(names[i]) for i in wanted.tolist()}


def _autotuning(kind: np.ndarray, thread: np.ndarray, start: np.ndarray, dur: np.ndarray, name: np.ndarray,
                name_list: list[str]) -> np.ndarray:
    """Per host event: is it a convolution op call that launched ``AUTOTUNE_KERNELS_PER_CALL``
    kernels or more on its thread (cuDNN benchmark mode timing every algorithm on a shape's first
    call)."""
    out = np.zeros(kind.size, bool)
    ops = np.flatnonzero(kind == HostEventKind.FRAMEWORK_OP)
    ops = ops[_names_where(name[ops], name_list, pytorch.is_convolution_op)]
    launches = np.flatnonzero(kind == HostEventKind.LAUNCH)
    if not ops.size or not launches.size:
        return out
    # Launches ordered by (thread, start): the ones inside an op are one run of that order.
    end = start + dur
    threads = np.unique(thread[ops])
    rank = np.searchsorted(threads, thread[launches])
    launches = launches[(rank < threads.size) & (threads[np.clip(rank, 0, threads.size - 1)] == thread[launches])]
    span = int(end.max()) + 1
    keys = np.sort(np.searchsorted(threads, thread[launches]).astype(np.int64) * span + start[launches])
    base = np.searchsorted(threads, thread[ops]).astype(np.int64) * span
    count = np.searchsorted(keys, base + end[ops]) - np.searchsorted(keys, base + start[ops])
    out[ops[count >= pytorch.AUTOTUNE_KERNELS_PER_CALL]] = True
    return out


def _device_steps(cat: np.ndarray, name: np.ndarray, cat_names: list[str], name_list: list[str],
                  start: np.ndarray, dur: np.ndarray) -> RecordedSteps | None:
    """The ProfilerStep#N marks written on the GPU side (one per stream that ran the step's
    work: the step finder joins them by number), or None when there are none."""
    numbers = {i: n for i, text in enumerate(name_list) if (n := pytorch.step_number(text)) is not None}
    if not numbers:
        return None
    rows = np.flatnonzero(_category_mask(cat_names, pytorch.DEVICE_STEP_CATEGORIES)[cat]
                          & np.isin(name, list(numbers)))
    if not rows.size:
        return None
    number = np.fromiter((numbers[i] for i in name[rows].tolist()), np.int64, rows.size)
    return RecordedSteps(number, start[rows], start[rows] + dur[rows], np.full(rows.size, -1, np.int64))


class _CollectiveScopes:
    """What the host says of each collective kernel: the ``nccl:<collective>`` annotation and the
    ``record_param_comms`` op (its args) around the call that launched it, on the same thread.
    The kernels of a device are looked up at once, and a kernel's kind and group are decided once
    per distinct (args, annotation, kernel name): a trace repeats a few collectives many times."""

    def __init__(self, cols: Columns, host_rows: np.ndarray, host_tid: np.ndarray, start: np.ndarray,
                 dur: np.ndarray, kind: np.ndarray, name: np.ndarray, name_list: list[str]) -> None:
        self.correlation, self.name, self.name_list = cols.correlation, name, name_list
        launches = host_rows[kind == HostEventKind.LAUNCH]
        self.launch_at = SortedKeys(self.correlation[launches], launches.astype(np.int32))
        self.args = list(cols.comms.values())
        with_args = np.fromiter(cols.comms, np.int64, len(cols.comms))
        self.args_at = SortedKeys(with_args, np.arange(with_args.size, dtype=np.int32))
        self.tid = np.full(start.size, -1, np.int64)
        self.tid[host_rows] = host_tid
        self.start, self.end = start, start + dur
        self.scope_of = {i: s for i, n in enumerate(name_list) if (s := pytorch.collective_scope(n)) is not None}
        host_name = name[host_rows]
        self.annotations = host_rows[np.isin(host_name, list(self.scope_of))]
        args_op = [i for i, n in enumerate(name_list) if n == pytorch.COLLECTIVE_ARGS_OP]
        self.arg_ops = host_rows[np.isin(host_name, args_op) & np.isin(host_rows, with_args)]
        self.kinds: dict[str, str] = {}

    def _around(self, scopes: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Per host row of ROWS (-1: none), the last of SCOPES (host rows by start) on its thread
        that starts at or before it, when that one also ends at or after it; else -1."""
        out = np.full(rows.size, -1, np.int64)
        asked = np.flatnonzero(rows >= 0)
        if scopes.size and asked.size:
            rows = rows[asked]
            at = last_at_or_before(self.tid[scopes], self.start[scopes], self.tid[rows], self.start[rows])
            found = scopes[np.maximum(at, 0)]
            keep = (at >= 0) & (self.end[found] >= self.end[rows])
            out[asked[keep]] = found[keep]
        return out

    def _kind(self, *names: str | None) -> str:
        """The first collective kind NAMES tell (each classified once), else "other"."""
        for n in filter(None, names):
            kind = self.kinds.get(n) or self.kinds.setdefault(n, gpu.collective_kind(n))
            if kind != "other":
                return kind
        return "other"

    def calls(self, rows: np.ndarray) -> tuple[np.ndarray, list[CollectiveCall], np.ndarray]:
        """For the collective kernels ROWS: each one's index into the calls (kind and group, in
        first-seen order), and its message bytes (0 when unknown)."""
        if not rows.size:
            return np.empty(0, np.int32), [], np.empty(0, np.int64)
        corr = self.correlation[rows]
        launch = np.where(corr >= 0, self.launch_at.get(corr), -1)
        own = self.args_at.get(rows)
        args = np.where(own >= 0, own, self.args_at.get(self._around(self.arg_ops, launch)))
        scope = self._around(self.annotations, launch)
        scope_name = np.where(scope >= 0, self.name[np.maximum(scope, 0)], -1)
        keys, first, inverse = np.unique(np.stack((args, scope_name, self.name[rows]), axis=1), axis=0,
                                         return_index=True, return_inverse=True)
        calls: dict[CollectiveCall, int] = {}
        call_of, size_of = np.empty(first.size, np.int32), np.empty(first.size, np.int64)
        for k in np.argsort(first).tolist():
            arg, scope_id, kernel = keys[k].tolist()
            found = self.args[arg] if arg >= 0 else None
            kind = self._kind(found and found.collective, self.scope_of.get(scope_id), self.name_list[kernel])
            call = CollectiveCall(kind, found.group_size if found else None, _group(found))
            call_of[k], size_of[k] = calls.setdefault(call, len(calls)), _message_bytes(found)
        inverse = inverse.reshape(-1)
        return call_of[inverse], list(calls), size_of[inverse]


def _group(args: CommArgs | None) -> str | None:
    if args is None or (args.group_name is None and args.group_ranks is None):
        return None
    return " ".join(part for part in (args.group_name and f"group {args.group_name}", args.group_ranks) if part)


def _message_bytes(args: CommArgs | None) -> int:
    """A call's bytes: its larger message (the gathered output, the scattered input) times the
    element size; 0 when the trace does not record them."""
    size = pytorch.DTYPE_BYTES.get(args.dtype or "") if args is not None else None
    elements = max(args.in_nelems or 0, args.out_nelems or 0) if args is not None else 0
    return elements * size if size else 0


def _sampled(ids: np.ndarray) -> str | None:
    """Why a trace whose runtime calls hold few of the correlation ids in their range was
    sampled or filtered after capture (vocab.pytorch.SAMPLED_ID_DENSITY), or None."""
    ids = ids[ids >= 0]
    if not ids.size:
        return None
    held, span = np.unique(ids).size, int(ids.max() - ids.min()) + 1
    if span < pytorch.SAMPLED_MIN_IDS or held >= pytorch.SAMPLED_ID_DENSITY * span:
        return None
    return (f"the trace records {held:,} of about {span:,} runtime calls made in its time range "
            f"({100 * held / span:.1f}%): it was sampled or filtered after capture, and the GPU work "
            "of the calls left out is missing too")


def _devices(cols: Columns, host: str, rows: np.ndarray, start: np.ndarray, dur: np.ndarray,
             correlation: np.ndarray, vendor: str, name: np.ndarray, device_kind: np.ndarray,
             name_list: list[str], scopes: _CollectiveScopes, op_of: SortedKeys, unused: bool) -> list[DeviceActivity]:
    """One table per GPU.  The op column stays empty: a kernel's op in the device table names a
    graph node (TensorFlow's "scope/conv1/Conv2D"), and a PyTorch op name ("aten::conv2d") names
    every call of that op at once; the host table holds each op call.  The op that launched each
    event (OP_OF, by correlation id) is its ``launch_op``.  A trace whose host launched nothing
    (UNUSED) and holds no device event still lists the GPUs deviceProperties name, each with no
    work: the process saw them and the model ran on the CPU (a rank's trace with device events lists
    every GPU of its machine, and only the ones it used are its devices; launches without device
    events are a lost device trace)."""
    props = {p.id: p for p in cols.devices}
    device = cols.device[rows]
    out = []
    for index in (np.unique(device).tolist() if rows.size or not unused else sorted(i for i in props if i >= 0)):
        sel = rows[device == index]
        sel = sel[np.argsort(start[sel], kind="stable")]
        names, name_idx = _subset(name[sel], name_list)
        used, stream_idx = renumber_small_ints(cols.stream[sel])
        streams = [f"Stream #{s}" for s in used.tolist()]
        kind = device_kind[sel]
        nbytes = np.maximum(cols.nbytes[sel], 0)
        collective = np.full(sel.size, -1, np.int32)
        at = np.flatnonzero(kind == DeviceEventKind.COLLECTIVE)
        collective[at], calls, nbytes[at] = scopes.calls(sel[at])
        launch_op, launch_ops = _launched_by(op_of.get(correlation[sel]), name_list)
        out.append(DeviceActivity(
            device=_device_of(max(index, 0), host, props, vendor, names), start_ps=start[sel], dur_ps=dur[sel],
            kind=kind, stream=stream_idx,
            name=name_idx, op=np.full(sel.size, -1, np.int32), correlation_id=correlation[sel],
            group_id=np.full(sel.size, -1, np.int64), nbytes=nbytes,
            details=np.full(sel.size, -1, np.int32), names=names, ops=[], streams=streams,
            detail_strings=[], step=np.full(sel.size, -1, np.int32),
            collective=collective if calls else np.empty(0, np.int32), collectives=list(calls),
            launch_op=launch_op, launch_ops=launch_ops))
    return out


def _launched_by(index: np.ndarray, strings: list[str]) -> tuple[np.ndarray, list[str]]:
    """``_subset`` of INDEX where -1 (no op) stays -1: a column for every event even when none has
    an op (it says the events' ops are found through their launches), one read-only -1 then."""
    present = index >= 0
    out = np.full(index.size, -1, np.int32)
    if not present.any():
        return narrow_ids(out), []
    used, inverse = renumber_small_ints(index[present])
    out[present] = inverse
    return out, [strings[i] for i in used.tolist()]


def _launching_ops(tid: np.ndarray, start: np.ndarray, dur: np.ndarray, kind: np.ndarray, launch_corr: np.ndarray,
                   name: np.ndarray, name_list: list[str]) -> SortedKeys:
    """Launch correlation id -> the name (index into NAME_LIST) of the op that launched it: of the
    cpu_ops around the runtime call on its thread, the innermost that vocab.pytorch knows as
    Tensor-Core math (aten::cudnn_convolution inside aten::_convolution inside aten::conv2d), else
    the outermost one.  Host events nest per thread, so the ops of one nesting depth are disjoint
    and one search per depth finds the op of that depth around every launch at once."""
    launches = np.flatnonzero(launch_corr >= 0)
    ops = np.flatnonzero(kind == HostEventKind.FRAMEWORK_OP)
    ops = ops[np.isin(tid[ops], np.unique(tid[launches]))]
    found = np.full(launches.size, -1, np.int64)
    if ops.size and launches.size:
        math = np.zeros(len(name_list), bool)
        used = np.unique(name[ops])
        math[used] = [pytorch.tensor_core_op_kind(name_list[i]) is not None for i in used.tolist()]
        is_math, depth = math[name[ops]], _depths(tid[ops], start[ops], dur[ops])
        end = start + dur
        # The math ops from the deepest level up, then the outermost level of every op.
        levels = [(level, is_math) for level in np.unique(depth[is_math])[::-1].tolist()] + [(0, True)]
        for level, among in levels:
            asked = np.flatnonzero(found < 0)
            at = ops[(depth == level) & among]
            hit = last_at_or_before(tid[at], start[at], tid[launches[asked]], start[launches[asked]])
            inside = hit >= 0
            inside[inside] = end[at[hit[inside]]] >= end[launches[asked[inside]]]
            found[asked[inside]] = at[hit[inside]]
    keep = found >= 0
    return SortedKeys(launch_corr[launches[keep]], name[found[keep]].astype(np.int32))


def _depths(tid: np.ndarray, start: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Per event, how many of the others on its thread are around it (events nest per thread): the
    ones its thread started before it (longer first on ties) less those that ended by its start."""
    end = start + dur
    by_end = np.lexsort((end, tid))
    ended_at = last_at_or_before(tid[by_end], end[by_end], tid, start)
    ended = np.where(ended_at >= 0, ended_at - np.searchsorted(tid[by_end], tid, "left") + 1, 0)
    by_start = np.lexsort((-dur, start, tid))
    started = np.empty(tid.size, np.int64)
    started[by_start] = np.arange(tid.size) - np.searchsorted(tid[by_start], tid[by_start], "left")
    return np.maximum(started - ended, 0)
