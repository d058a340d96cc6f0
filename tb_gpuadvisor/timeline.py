"""The timeline model: what happened on each device and host thread of a session.

Events are stored column-wise in numpy arrays (one row per event) rather than
as Python objects, so that a capture with millions of kernels can be analysed
with vectorised operations.  Times are integer picoseconds measured from the
session's origin (the earliest line timestamp of any host in the session), so
they stay exact and fit in int64 even when a capture stores epoch timestamps.

Names are interned: an event's ``name`` column holds an index into the
table's ``names`` list; classification is done once per distinct name.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from tb_gpuadvisor.arrays import narrow_ids
from tb_gpuadvisor.kinds import COPY_KINDS, DeviceEventKind, HostEventKind, InputStage
from tb_gpuadvisor.vocab.jax import FRAMEWORK as JAX
from tb_gpuadvisor.vocab.pytorch import FRAMEWORK as PYTORCH

PS_PER_MS = 1_000_000_000
PS_PER_US = 1_000_000


@dataclass
class Device:
    """One accelerator (or the host CPU when a capture has none)."""

    name: str                      # "/device:GPU:0", "/device:TPU:1", "/host:CPU"
    host: str
    kind: str                      # "gpu", "tpu", "cpu"
    index: int
    vendor: str | None = None      # "NVIDIA", "AMD", "Google"
    model: str | None = None       # device type string when the capture has one
    compute_capability: str | None = None   # "7.5"
    sm_count: int | None = None
    memory_bytes: int | None = None
    memory_bandwidth: int | None = None     # bytes per second
    clock_khz: int | None = None

    @property
    def cc_major(self) -> int | None:
        if not self.compute_capability:
            return None
        return int(self.compute_capability.split(".")[0])

    def to_json(self) -> dict:
        out = {"name": self.name, "host": self.host, "kind": self.kind, "index": self.index}
        for key in ("vendor", "model", "compute_capability", "sm_count", "memory_bytes",
                    "memory_bandwidth", "clock_khz"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


@dataclass(frozen=True)
class CollectiveCall:
    """What a trace records of one kind of collective call: its kind ("all-reduce",
    "all-to-all", ...) and process group (None where the trace does not say)."""

    kind: str
    group_size: int | None = None
    group: str | None = None        # the group's name and ranks, as the trace writes them


class TableKey:
    """A table's identity for the values later stages derive from it (``stages.Memo``): a view
    of the table made by ``replace`` (trust's, ``SessionModel.with_steps``) shares it."""


class _EventColumns:
    """What device and host event tables share: start/duration/kind columns."""

    start_ps: np.ndarray
    dur_ps: np.ndarray
    kind: np.ndarray
    derived: dict

    def __len__(self) -> int:
        return int(self.start_ps.size)

    def _narrow(self, *columns: str) -> None:
        """Id and index COLUMNS in int32 where their values fit, and as one read-only -1 where
        none is present (``arrays.narrow_ids``), whichever adapter built them: once per table
        (a view of it made by ``replace`` shares ``derived``, and its columns are narrowed)."""
        if self.derived.get("narrowed"):
            return
        for column in columns:
            setattr(self, column, narrow_ids(getattr(self, column)))
        self.derived["narrowed"] = True

    @property
    def end_ps(self) -> np.ndarray:
        """start + duration, computed once per table (read-only: the checks ask for it hundreds
        of times); a builder that moves ``start_ps`` calls ``moved``."""
        end = self.derived.get("end_ps")
        if end is None:
            end = self.derived["end_ps"] = self.start_ps + self.dur_ps
            end.flags.writeable = False
        return end

    def moved(self) -> None:
        """Forget what was derived from the times (``start_ps`` was shifted in place)."""
        self.derived.pop("end_ps", None)

    def rows_of(self, kind: int) -> np.ndarray:
        """The int32 rows of the events of one KIND, in start order, found once per table
        (read-only: several stages ask for the same kind)."""
        key = ("rows", int(kind))
        rows = self.derived.get(key)
        if rows is None:
            rows = self.derived[key] = np.flatnonzero(self.kind == kind).astype(np.int32)
            rows.flags.writeable = False
        return rows

    def mask(self, *kinds: int) -> np.ndarray:
        """Events whose kind is one of KINDS (a few compares: np.isin on int8 costs 15x more)."""
        out = np.zeros(self.kind.size, bool)
        for kind in kinds:
            out |= self.kind == kind
        return out


@dataclass
class DeviceActivity(_EventColumns):
    """Every event one device executed: kernels, copies, memsets, collectives.

    Columns (all the same length, sorted by start):
      start_ps, dur_ps   int64
      kind               int8 (DeviceEventKind)
      stream             int32, index into ``streams`` (line names such as "Stream #19(Compute)")
      name               int32, index into ``names`` (kernel or copy name)
      op                 int32, index into ``ops`` (framework op "scope/op:Type", XLA op), -1 if unknown
      correlation_id     int32 (int64 when a value does not fit), -1 if absent (links to the host launch event)
      group_id           int32 (int64 when a value does not fit), -1 if absent (TensorFlow's step group)
      nbytes             int64, bytes moved by copies/memsets, 0 otherwise
      details            int32, index into ``details`` (kernel_details string), -1 if absent
      step               int32, index into the session's Steps arrays, -1 outside any step; empty
                         in the model as built: trust's view of it (``with_steps``) fills it
      hlo_op, hlo_module, source  int32, indices into ``hlo_ops``/``hlo_modules``/``sources``
                         (XLA instruction, XLA module, JAX source op), -1 if absent (see vocab/hlo.py)
      collective         int32, index into ``collectives`` (the call's kind and group) for a
                         collective whose trace names it (PyTorch), -1 otherwise; empty when none
                         does.  Its ``nbytes`` are the call's message bytes when recorded.
      launch_op          int32, index into ``launch_ops``: the framework op whose host call launched
                         the event, where the device event itself names none (PyTorch: the aten op
                         around the runtime call of the same correlation id), -1 when none; empty
                         when the device table names the ops itself (TensorFlow, XLA).
    The id and index columns (op to source) are read-only: a column without any value (a stat
    the capture never records) is one -1 shared by every row.
    """

    device: Device
    start_ps: np.ndarray
    dur_ps: np.ndarray
    kind: np.ndarray
    stream: np.ndarray
    name: np.ndarray
    op: np.ndarray
    correlation_id: np.ndarray
    group_id: np.ndarray
    nbytes: np.ndarray
    details: np.ndarray
    names: list[str]
    ops: list[str]
    streams: list[str]
    detail_strings: list[str]
    step: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    hlo_op: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    hlo_module: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    source: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    hlo_ops: list[str] = field(default_factory=list)
    hlo_modules: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    collective: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    collectives: list[CollectiveCall] = field(default_factory=list)
    launch_op: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    launch_ops: list[str] = field(default_factory=list)
    # What the table's own methods derive from its columns (end_ps, rows_of); never from ``step``,
    # which trust's view of the session replaces (SessionModel.with_steps) while sharing this.
    derived: dict = field(default_factory=dict, repr=False, compare=False)
    key: TableKey = field(default_factory=TableKey, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._narrow("correlation_id", "group_id", "op", "details", "hlo_op", "hlo_module", "source")


@dataclass
class HostActivity(_EventColumns):
    """Every event of one host's CPU threads.

    Columns (same length, sorted by start):
      start_ps, dur_ps   int64
      thread             int32, index into ``threads`` (line names: "python3", "tf_Compute/12", ...)
      name               int32, index into ``names``
      kind               int8 (HostEventKind), classified once per distinct name
      step_num           int32 (int64 when a value does not fit; so the ids below), the
                         ``step_num`` stat of step markers, -1 if absent
      is_root            bool, ``_r`` == 1 (custom-loop step annotations)
      group_id           int32, -1 if absent
      correlation_id     int32, -1 if absent (launch events)
      step               int32, index into the session's Steps arrays, -1 outside any step; empty
                         in the model as built: trust's view of it (``with_steps``) fills it
    """

    host: str
    start_ps: np.ndarray
    dur_ps: np.ndarray
    thread: np.ndarray
    name: np.ndarray
    kind: np.ndarray
    step_num: np.ndarray
    is_root: np.ndarray
    group_id: np.ndarray
    correlation_id: np.ndarray
    names: list[str]
    threads: list[str]
    step: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    derived: dict = field(default_factory=dict, repr=False, compare=False)
    key: TableKey = field(default_factory=TableKey, repr=False, compare=False)
    # Each input-pipeline stage or wait name -> what its adapter read in it (a tf.data stage's kind,
    # nesting and dataset; a DataLoader's process), and the threads of the input pipeline's own.
    stages: dict[str, InputStage] = field(default_factory=dict, repr=False, compare=False)
    input_threads: frozenset[int] = field(default_factory=frozenset, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._narrow("step_num", "group_id", "correlation_id")


@dataclass
class MemoryRecords:
    """Allocator snapshots from MemoryAllocation/MemoryDeallocation events of one host.

    Columns: time_ps, allocator (index into ``allocators``, e.g. "GPU_0_bfc"), is_alloc (bool),
    bytes_allocated, peak_bytes_in_use, bytes_reserved, bytes_available, requested_bytes (int64),
    fragmentation (float64), op (index into ``ops``, -1 if absent; the tf_op stat).
    """

    host: str
    time_ps: np.ndarray
    allocator: np.ndarray
    is_alloc: np.ndarray
    bytes_allocated: np.ndarray
    peak_bytes_in_use: np.ndarray
    bytes_reserved: np.ndarray
    bytes_available: np.ndarray
    requested_bytes: np.ndarray
    fragmentation: np.ndarray
    op: np.ndarray
    allocators: list[str]
    ops: list[str]

    def __len__(self) -> int:
        return int(self.time_ps.size)


@dataclass
class Steps:
    """Training steps found in the session, in time order.

    ``source`` names the marker used: "custom_loop" (events with _r=1 and step_num),
    "keras2" (TraceContext), "keras" (Keras 3 "Profiled batch"), "steps_line" (the
    derived Steps line on a GPU plane), "inferred" (repeated tf.function / XLA runs), or
    "none".  ``start_ps``/``end_ps`` are step periods: a step ends where the next starts;
    the last one ends at its last host or device activity.
    """

    source: str
    number: np.ndarray      # int64 step numbers as the program labelled them
    start_ps: np.ndarray
    end_ps: np.ndarray
    group_id: np.ndarray    # int64, -1 when the marker carries none
    marker_name: str = ""
    # Training steps one marker covers (Keras steps_per_execution, or a loop of N steps per call).
    per_marker: int = 1
    # What set the steps' length when the markers are the host's enqueue (PyTorch's
    # ProfilerStep#N): "device" (the host ran ahead and each step lasts as long as its device
    # work), "host" (the device waited for the host), "" where not decided (TensorFlow, JAX).
    paced_by: str = ""
    # The host's own step periods, when they differ from the windows above (device-paced steps):
    # host events belong to the step whose host period holds them, whenever its device work runs.
    host_start_ps: np.ndarray | None = None
    host_end_ps: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.start_ps.size)

    @property
    def training_steps(self) -> int:
        """How many training steps the markers cover: the divisor of every per-step number."""
        return len(self) * self.per_marker

    def take(self, index: np.ndarray) -> "Steps":
        """The steps at INDEX (ints or a mask), as a new table with the same source and marker."""
        host = {} if self.host_start_ps is None else {"host_start_ps": self.host_start_ps[index],
                                                      "host_end_ps": self.host_end_ps[index]}
        return replace(self, number=self.number[index], start_ps=self.start_ps[index],
                       end_ps=self.end_ps[index], group_id=self.group_id[index], **host)

    def on_host(self) -> "Steps":
        """The steps as the host ran them: its own periods where they differ from the windows."""
        if self.host_start_ps is None:
            return self
        return replace(self, start_ps=self.host_start_ps, end_ps=self.host_end_ps,
                       host_start_ps=None, host_end_ps=None)

    @property
    def duration_ps(self) -> np.ndarray:
        return self.end_ps - self.start_ps

    def locate(self, times_ps: np.ndarray) -> np.ndarray:
        """Index of the step whose period contains each time, -1 when outside all steps."""
        if not len(self):
            return np.full(times_ps.shape, -1, np.int32)
        if times_ps.ndim == 1 and times_ps.size > 4 * len(self) and bool(np.all(times_ps[1:] >= times_ps[:-1])):
            return self._locate_sorted(times_ps)
        idx = np.searchsorted(self.start_ps, times_ps, side="right") - 1
        inside = (idx >= 0) & (times_ps < self.end_ps[np.clip(idx, 0, None)])
        return np.where(inside, idx, -1).astype(np.int32)

    def _locate_sorted(self, times_ps: np.ndarray) -> np.ndarray:
        """``locate`` for times in order (an event table's starts): the steps are searched in the
        times, not millions of times in the steps, and each step's run of positions is filled.

        Step k holds the positions from the first time >= its start to the first time >= its
        end or >= the next step's start (a later start wins, as in ``locate``)."""
        n, size = len(self), times_ps.size
        first = np.searchsorted(times_ps, self.start_ps, side="left")
        past = np.searchsorted(times_ps, self.end_ps, side="left")
        until = np.maximum(first, np.minimum(past, np.append(first[1:], size)))
        bounds = np.empty(2 * n + 2, np.int64)
        bounds[0], bounds[-1] = 0, size
        bounds[1:-1:2], bounds[2:-1:2] = first, until
        values = np.full(2 * n + 1, -1, np.int32)
        values[1::2] = np.arange(n, dtype=np.int32)
        return np.repeat(values, np.diff(bounds))


@dataclass
class HostModel:
    """One host of a session: its CPU activity, memory records and devices."""

    name: str
    path: str
    activity: HostActivity
    memory: MemoryRecords
    devices: list[DeviceActivity]
    origin_ns: int                   # timestamp of this host's earliest line
    warnings: list[str] = field(default_factory=list)
    dropped_events: int = 0
    partial_trace: str | None = None     # why the trace holds only part of what ran, or None


@dataclass
class SessionModel:
    """Everything the analyses and checks read about one capture session."""

    run: str
    session: str
    hosts: list[HostModel]
    steps: Steps
    framework: str                   # "tensorflow", "jax", "unknown"
    errors: list[dict] = field(default_factory=list)   # {"host", "file", "message"}
    warnings: list[str] = field(default_factory=list)
    # Hosts of the whole session when this model holds one of them (multihost's per-host map).
    session_hosts: int = 0

    @property
    def devices(self) -> list[DeviceActivity]:
        return [dev for host in self.hosts for dev in host.devices]

    def with_steps(self, steps: Steps, columns: list[tuple[np.ndarray, list[np.ndarray]]]) -> "SessionModel":
        """This session seen through other step windows (trust's view of it): STEPS, and each
        host's (activity, per-device) ``step`` COLUMNS indexing them. Every other column, and
        what analyses derived from them, is shared, not copied; this model is left as it is."""
        hosts = [replace(host, activity=replace(host.activity, step=act_step),
                         devices=[replace(dev, step=step) for dev, step in zip(host.devices, dev_steps)])
                 for host, (act_step, dev_steps) in zip(self.hosts, columns)]
        return replace(self, hosts=hosts, steps=steps)

    @property
    def gpus(self) -> list[DeviceActivity]:
        return [dev for dev in self.devices if dev.device.kind == "gpu"]

    @cached_property
    def active_gpus(self) -> list[DeviceActivity]:
        """GPUs that ran at least one kernel (idle planes and copy-only planes excluded); where no
        GPU of a PyTorch trace ran a kernel, the GPUs that ran copies (a copy benchmark: its
        copies are the work).

        Asked by most checks; the devices do not change once the model is built.
        """
        ran = [dev for dev in self.gpus if bool(np.any(dev.kind == DeviceEventKind.KERNEL))]
        if ran or self.framework != PYTORCH:
            return ran
        return [dev for dev in self.gpus if bool(np.any(dev.mask(*COPY_KINDS)))]

    @cached_property
    def launch_median_ps(self) -> float | None:
        """Median duration of the hosts' launch calls, None when they record none: the launch
        check and its replay scenario both read it (its gather and median: 0.1 s of CPU at 1 GB)."""
        durations = [host.activity.dur_ps[host.activity.rows_of(HostEventKind.LAUNCH)] for host in self.hosts]
        durations = np.concatenate(durations) if durations else np.empty(0, np.int64)
        return float(np.median(durations)) if durations.size else None

    @property
    def primary_gpu(self) -> DeviceActivity | None:
        """The GPU the per-step numbers are measured on: the first that ran kernels, in host order.
        Chosen here only: trust aligns steps to it, the breakdown measures it first, checks read it,
        and a many-host merge takes the per-host findings from its host."""
        gpus = self.active_gpus
        return gpus[0] if gpus else None
