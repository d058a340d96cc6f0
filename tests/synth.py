"""Synthetic XSpace captures shaped like the profiler's own, with planted problems.

Every check test needs a capture where the quantity under test is known exactly.
This module builds them in two layers:

* a small declarative layer (:class:`SpaceBuilder`, :class:`PlaneBuilder`,
  :class:`LineBuilder`) that writes planes, lines, events and stats with the
  same names and value kinds TensorFlow and JAX write (``ref_value`` stats
  point at a stat-metadata entry whose *name* is the string value, as the
  profiler does for ``level 0``, ``annotation``, ``kernel_details``...);
* a step-level generator, :func:`build_training_session`, that lays out N
  training steps and plants input waits, launch gaps, host overhead, host
  ops, copies, collectives, precision mix, multi-GPU imbalance, launch skew
  and memory use at sizes chosen by the test, and returns the ground truth
  next to the capture.

How planted quantities map to events (all per step, T = step duration)
-----------------------------------------------------------------------
Each step is laid out in three disjoint phases on the time axis; the GPUs
are idle during the first two::

    [0, O)        other host overhead  O = host_overhead_frac * T
    [O, O+I)      input wait           I = input_wait_frac * T
    [O+I, T)      device window        W = T - O - I

* **Other host overhead**: the main Python thread runs ``convert_to_tensor``
  / ``tf.constant`` / ``TFE_Py_FastPathExecute_C`` events (JAX: ``$...``
  Python-tracer events) covering ``[0, O)``; no launch, iterator or op event
  runs anywhere on the host then.  GPU idle there = *other*.
* **Input wait**: one ``IteratorGetNextOp::DoCompute`` event covers exactly
  ``[O, O+I)`` with nested ``Iterator::Model`` and
  ``Iterator::Model::ParallelMapV2`` events.  It runs on the main thread for
  the custom-loop marker style (``marker="r"``, as eager ``next(iterator)``
  does) and on a ``tf_data_iterator_get_next/N`` thread for the Keras styles
  (the main thread is then inside the function call).  GPU idle there =
  *input*.  Not emitted when ``I == 0``.
* **Device window**, per GPU ``g``: device ops run back to back in this order:
  H2D copies, compute kernels, AllReduce kernels, D2H copies.  Before each
  device op there is a *launch gap* of ``L / n_ops`` (``L = launch_frac*T``)
  while the launch event of that op runs on GPU g's launch thread (the launch
  event always ends exactly when its device op starts and lasts
  ``max(gap, 3 us)``).  On GPUs ``g >= 1`` the first gap is longer by
  ``launch_skew_ms`` (the launch thread is late), so GPU idle while launching
  is ``L`` on GPU:0 and ``L + skew`` on the others.  The first device op of
  GPU g then starts ``skew + L/n_ops(g) - L/n_ops(0)`` after GPU:0's (the
  per-op gap depends on each GPU's op count); ``GpuStepTruth.first_op_start_ms``
  has the exact value.
* **Copies**: ``memcpy_frac * T`` of copy time per step per GPU, not
  overlapped by any kernel, split between one ``MemcpyH2D`` (``h2d_bytes``)
  and, when ``d2h_bytes > 0``, one ``MemcpyD2H`` in proportion to bytes.
  ``memcpy_details`` = ``"size:<bytes> dest:0 async:1"``.
* **Collectives**: ``allreduce_calls`` NCCL AllReduce kernels per step per
  GPU on their own stream; on the slowest GPU they take
  ``collective_frac * T`` in total.  All GPUs leave the first AllReduce at
  the same time, so faster GPUs spend their spare time waiting inside it
  (their collective time is longer by exactly their spare time; no GPU has
  idle tail).  With ``allreduce_calls == 0`` the spare time is idle tail
  after the last op (the host is then only inside the function call).
* **Compute**: ``C_ref = W - L - M - Coll - skew`` is the compute kernel
  time of the busiest GPU; GPU g gets ``C_ref * s_g / max(s)`` with
  ``s_g = gpu_compute_scale.get(g, 1)``.  Kernels are split into categories
  by fractions of that GPU's compute time:
  ``tensor_core_frac`` Tensor-Core kernels for Tensor-Core-eligible ops
  (``MatMul``/``Conv2D``; 16-bit names such as
  ``turing_fp16_s1688gemm_fp16_...`` up to the 16-bit budget, beyond it
  TF32 ``sm80_xmma_gemm_f32f32_tf32f32...`` which needs cc >= 8),
  ``eligible_frac - tensor_core_frac`` fp32 SIMT kernels for eligible ops
  (``volta_sgemm_128x64_nn``, ``ampere_sgemm_...``), the rest element-wise
  kernels for ``Relu``/``BiasAdd``/``AddV2``/``Mul`` ops, in ``Eigen::half``
  / ``Eigen::bfloat16`` up to the 16-bit budget and ``float`` after it.
  The 16-bit budget is ``fp16_frac + bf16_frac`` of compute time.
  Each category is split into kernels of about ``kernel_us`` (or into
  ``kernels_per_step`` kernels in total); every compute kernel is one op
  execution ``scope/layer/op:Type``.
* **Host ops**: framework op events ``scope/op:Type`` (``MatMul``,
  ``Conv2D``, ``Unique``, ``SparseSegmentSum``) that launch nothing, on
  ``tf_Compute`` threads of their own, inside the device window (so they
  never make a GPU idle).  Their total per step is
  ``H = host_ops_frac / (1 - host_ops_frac) * C_0``, i.e.
  ``H / (H + C_0) = host_ops_frac`` with ``C_0`` GPU:0's compute kernel time.
  They are the only ``name:Type`` events on host threads besides the
  launch-wrapping op events of device ops.
* **Memory**: four ``MemoryAllocation`` events per step per GPU on its
  launch thread, allocator ``GPU_<g>_bfc``, ``bytes_allocated`` rising to
  the peak; ``peak_bytes_in_use = round(peak_mem_frac * memory_size)`` on
  every event; ``bytes_available = 0.95 * memory_size - bytes_allocated``;
  ``fragmentation`` as given (``double``); ``bytes_reserved = 0``.

Consistency kept everywhere: each device event's ``correlation_id`` equals
that of exactly one host launch event; device events carry ``level 0`` and
``annotation`` (``ref_value``) naming their op; ``group_id`` = step index on
host events inside a step and on device events where TensorFlow puts it
(not for Keras 3 and ``none`` styles unless ``group_ids=True``).

:class:`Truth` returns the planted numbers per step and per GPU, so a check
test computes its expected metric from it rather than re-deriving the
layout.
"""

from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from tb_gpuadvisor.input.xplane.schema import XEvent, XLine, XPlane, XSpace

PS_PER_NS = 1_000
PS_PER_US = 1_000_000
PS_PER_MS = 1_000_000_000

# TensorFlow's ids for the derived lines on GPU planes.
TF_OPS_LINE_ID = -559038734
TF_NAME_SCOPE_LINE_ID = -559038735
STEPS_LINE_ID = -559038737

MARKER_STYLES = ("keras3", "keras2", "r", "steps_line", "none")


class U64(int):
    """An integer to store as ``uint64_value`` rather than ``int64_value``."""


class Ref(str):
    """A string to store as ``ref_value`` (pointing at a stat-metadata name)."""


# Value kinds the profiler uses for stats whose Python value is ambiguous.
_STAT_KINDS: dict[str, str] = {
    "correlation_id": "uint64", "memory_bandwidth": "uint64", "memory_size": "uint64",
    "_c": "uint64", "_p": "uint64", "profile_start_time": "uint64",
    "profile_stop_time": "uint64", "device_id": "uint64",
    "kernel_details": "ref", "annotation": "ref", "level 0": "ref",
    "hlo_op": "ref", "hlo_module": "ref", "eager_op": "ref",
}


# ---------------------------------------------------------------- low level


class PlaneBuilder:
    """Accumulates one XPlane: metadata tables are filled on first use of a name."""

    def __init__(self, name: str, plane_id: int = 0) -> None:
        self.plane = XPlane(id=plane_id, name=name)
        self._stat_ids: dict[str, int] = {}
        self._event_ids: dict[tuple[str, str], int] = {}
        self._lines: dict[int, LineBuilder] = {}

    @staticmethod
    def _metadata_id(ids: dict, key: object, table, **fields: str) -> int:
        """The id ``key`` has in ``ids``; a new key gets the next id and an entry in ``table``."""
        found = ids.get(key)
        if found is None:
            found = ids[key] = len(ids) + 1
            entry = table[found]
            entry.id = found
            for field, value in fields.items():
                setattr(entry, field, value)
        return found

    def stat_id(self, name: str) -> int:
        """Stat-metadata id for ``name`` (ref values are stat metadata too)."""
        return self._metadata_id(self._stat_ids, name, self.plane.stat_metadata, name=name)

    def event_id(self, name: str, display_name: str = "") -> int:
        return self._metadata_id(self._event_ids, (name, display_name), self.plane.event_metadata,
                                 name=name, display_name=display_name)

    def fill_stat(self, stat, name: str, value) -> None:
        """Write ``value`` into an XStat with the kind the profiler would use."""
        stat.metadata_id = self.stat_id(name)
        kind = _STAT_KINDS.get(name)
        if isinstance(value, Ref) or (kind == "ref" and isinstance(value, str)):
            stat.ref_value = self.stat_id(str(value))
        elif isinstance(value, U64) or (kind == "uint64" and isinstance(value, int)):
            stat.uint64_value = int(value)
        elif isinstance(value, bool):
            stat.int64_value = int(value)
        elif isinstance(value, int):
            stat.int64_value = value
        elif isinstance(value, float):
            stat.double_value = value
        elif isinstance(value, bytes):
            stat.bytes_value = value
        else:
            stat.str_value = str(value)

    def set_stat(self, name: str, value) -> None:
        """Add a plane-level stat (device properties, profile times)."""
        self.fill_stat(self.plane.stats.add(), name, value)

    def line(self, line_id: int, name: str, timestamp_ns: int) -> "LineBuilder":
        """The line with ``line_id``, created on first use."""
        builder = self._lines.get(line_id)
        if builder is None:
            builder = LineBuilder(self, self.plane.lines.add(
                id=line_id, name=name, timestamp_ns=timestamp_ns))
            self._lines[line_id] = builder
        return builder

    def build(self) -> XPlane:
        for builder in self._lines.values():
            builder.sort()
        return self.plane


class LineBuilder:
    """Adds events to one XLine; callers give absolute times in picoseconds."""

    def __init__(self, plane: PlaneBuilder, line: XLine) -> None:
        self.plane_builder = plane
        self.line = line

    @property
    def origin_ps(self) -> int:
        return self.line.timestamp_ns * PS_PER_NS

    def add(self, name: str, start_ps: int, duration_ps: int,
            stats: Mapping[str, object] | None = None, display_name: str = "") -> XEvent:
        if start_ps < self.origin_ps:
            raise ValueError(f"event {name!r} starts before line {self.line.name!r}")
        event = self.line.events.add(
            metadata_id=self.plane_builder.event_id(name, display_name),
            offset_ps=int(start_ps - self.origin_ps), duration_ps=int(duration_ps))
        for key, value in (stats or {}).items():
            self.plane_builder.fill_stat(event.stats.add(), key, value)
        return event

    def sort(self) -> None:
        """Order events by start, longer first on ties (parents before children)."""
        events = sorted(self.line.events, key=lambda e: (e.offset_ps, -e.duration_ps))
        copies = [XEvent.FromString(e.SerializeToString()) for e in events]
        del self.line.events[:]
        self.line.events.extend(copies)


class SpaceBuilder:
    """Collects planes and produces the XSpace a ``<host>.xplane.pb`` holds."""

    def __init__(self, hostnames: Sequence[str] = ()) -> None:
        self.planes: list[PlaneBuilder] = []
        self.hostnames = list(hostnames)

    def plane(self, name: str, plane_id: int = 0) -> PlaneBuilder:
        for existing in self.planes:
            if existing.plane.name == name:
                return existing
        builder = PlaneBuilder(name, plane_id)
        self.planes.append(builder)
        return builder

    def gpu_plane(self, ordinal: int, props: "GpuProps") -> PlaneBuilder:
        """A ``/device:GPU:N`` plane with the device-property stats set."""
        plane = self.plane(f"/device:GPU:{ordinal}", ordinal)
        if props.vendor:
            plane.set_stat("device_vendor", props.vendor)
        plane.set_stat("clock_rate", props.clock_khz)
        plane.set_stat("core_count", props.core_count)
        plane.set_stat("memory_bandwidth", U64(props.memory_bandwidth))
        plane.set_stat("memory_size", U64(props.memory_size))
        plane.set_stat("compute_cap_major", props.cc[0])
        plane.set_stat("compute_cap_minor", props.cc[1])
        return plane

    def build(self) -> XSpace:
        space = XSpace(hostnames=self.hostnames)
        for builder in self.planes:
            space.planes.append(builder.build())
        return space


@dataclasses.dataclass(frozen=True)
class GpuProps:
    """Device properties as the GPU plane stats carry them."""

    cc: tuple[int, int]
    clock_khz: int
    core_count: int
    memory_bandwidth: int  # bytes/s
    memory_size: int  # bytes
    vendor: str | None = None


# Values as real planes show them (V100 and RTX 5000 from the corpus).
GPU_PRESETS: dict[tuple[int, int], GpuProps] = {
    (7, 0): GpuProps((7, 0), 1530000, 80, 898048000000, 16945512448),
    (7, 5): GpuProps((7, 5), 1815000, 48, 448064000000, 16908615680),
    (8, 0): GpuProps((8, 0), 1410000, 108, 1555200000000, 42298834944),
    (8, 6): GpuProps((8, 6), 1695000, 72, 600192000000, 23609475072),
    (8, 9): GpuProps((8, 9), 2520000, 128, 1008096000000, 25393692672),
    (9, 0): GpuProps((9, 0), 1980000, 132, 3352320000000, 84942979072),
}


def gpu_props(cc: tuple[int, int], vendor: str | None = None) -> GpuProps:
    base = GPU_PRESETS.get(tuple(cc)) or dataclasses.replace(GPU_PRESETS[(8, 0)], cc=tuple(cc))
    return dataclasses.replace(base, vendor=vendor)


# ------------------------------------------------------------ kernel names


def _arch(cc: tuple[int, int]) -> str:
    if cc[0] >= 9:
        return "hopper"
    if cc[0] == 8:
        return "ampere"
    if cc == (7, 5):
        return "turing"
    return "volta"


def tensor_core_kernel(cc: tuple[int, int], dtype: str, conv: bool) -> str:
    """A Tensor-Core GEMM/conv kernel name for ``dtype`` in fp16, bf16, tf32."""
    arch = _arch(cc)
    if dtype == "tf32":
        if cc[0] < 8:
            raise ValueError("TF32 Tensor Cores need compute capability >= 8.0")
        if conv:
            return ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_"
                    "tilesize128x128x16_stage4_warpsize2x2x1_g1_tensor16x8x8_kernel")
        return ("sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x16_stage4_"
                "warpsize2x2x1_tensor16x8x8_kernel")
    if dtype == "bf16" and cc[0] < 8:
        raise ValueError("bf16 Tensor Cores need compute capability >= 8.0")
    if conv:
        if cc[0] >= 8:
            t = "bf16bf16_bf16f32" if dtype == "bf16" else "f16f16_f16f32"
            return (f"sm{cc[0]}0_xmma_fprop_implicit_gemm_{t}_f32_nhwckrsc_nhwc_"
                    "tilesize128x128x32_stage4_warpsize2x2x1_g1_tensor16x8x16_kernel")
        return f"{arch}_fp16_s{'1688' if arch == 'turing' else '884'}cudnn_fp16_128x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1"
    if arch == "hopper":
        return "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTT" if dtype == "fp16" else \
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
    if arch == "ampere":
        return f"ampere_{dtype}_s16816gemm_{dtype}_128x64_ldg8_f2f_stages_64x3_nn"
    if arch == "turing":
        return "turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_tn"
    return "volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_nn"


def fp32_gemm_kernel(cc: tuple[int, int], conv: bool) -> str:
    """An fp32 SIMT kernel for an eligible op (no Tensor Cores)."""
    if conv:
        return ("volta_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1" if cc[0] < 8
                else "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>"
                     "(cudnn::winograd_nonfused::WinogradDataParams<float, float>)")
    return "volta_sgemm_128x64_nn" if cc[0] < 8 else "ampere_sgemm_128x64_nn"


def elementwise_kernel(op_type: str, dtype: str) -> str:
    """A TensorFlow element-wise kernel in float, Eigen::half or Eigen::bfloat16."""
    scalar = {"fp16": "Eigen::half", "bf16": "Eigen::bfloat16"}.get(dtype, "float")
    if op_type == "BiasAdd":
        return (f"void tensorflow::functor::BiasNHWCKernel<{scalar}>(int, {scalar} const*, "
                f"{scalar} const*, {scalar}*, int)")
    if op_type == "Relu":
        return (f"void tensorflow::functor::ReluKernel<{scalar}>(int, {scalar} const*, "
                f"{scalar}*)")
    return ("void Eigen::internal::EigenMetaKernel<Eigen::TensorEvaluator<Eigen::TensorAssignOp<"
            f"Eigen::TensorMap<Eigen::Tensor<{scalar}, 1, 1, long>, 16, Eigen::MakePointer>, "
            f"Eigen::TensorCwiseBinaryOp<Eigen::internal::scalar_sum_op<{scalar}, {scalar}>, "
            "Eigen::GpuDevice>, long>(Eigen::TensorEvaluator<...>, long)")


def allreduce_kernel(cc: tuple[int, int], framework: str) -> str:
    """NCCL AllReduce kernel names: NCCL 2.7-era, 2.8+ and the 2.19+ JAX builds."""
    if framework == "jax":
        return "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    if cc[0] >= 8:
        return "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
    return "ncclAllReduceRingLLKernel_sum_f32(ncclColl)"


# ------------------------------------------------------------ ground truth


@dataclasses.dataclass
class GpuStepTruth:
    """What one GPU does in one step, in milliseconds (kernel and copy times)."""

    compute_ms: float = 0.0
    low_precision_ms: float = 0.0  # fp16 + bf16 kernel time
    tensor_core_ms: float = 0.0
    eligible_ms: float = 0.0  # kernels of MatMul/Conv2D ops
    eligible_not_tc_ms: float = 0.0
    collective_ms: float = 0.0
    copy_ms: float = 0.0  # H2D + D2H, never overlapped by kernels
    h2d_bytes: int = 0
    d2h_bytes: int = 0
    launch_idle_ms: float = 0.0  # GPU idle while its launch thread launches
    tail_idle_ms: float = 0.0
    first_op_start_ms: float = 0.0  # relative to the step start
    kernels: int = 0  # compute kernels (collectives excluded)
    allreduce_calls: int = 0


@dataclasses.dataclass
class StepTruth:
    index: int
    start_ps: int  # absolute, as line.timestamp_ns*1000 + offset_ps
    duration_ms: float
    input_ms: float
    other_ms: float
    host_op_ms: float
    gpus: list[GpuStepTruth]


@dataclasses.dataclass
class Truth:
    """The planted layout, for computing expected metrics in tests."""

    steps: list[StepTruth]
    marker: str
    framework: str
    capture_start_ps: int
    kernel_us: float  # duration of the typical compute kernel
    peak_bytes: list[int]  # per GPU
    memory_size: int
    fragmentation: float
    launch_skew_ms: float

    def mean(self, field: str, gpu: int | None = None) -> float:
        """Mean per step of a StepTruth field, or of a GpuStepTruth field for ``gpu``."""
        if gpu is None:
            values = [getattr(s, field) for s in self.steps]
        else:
            values = [getattr(s.gpus[gpu], field) for s in self.steps]
        return sum(values) / len(values)

    def percent(self, field: str, gpu: int | None = None) -> float:
        """``field`` as a percentage of the mean step time."""
        return 100.0 * self.mean(field, gpu) / self.mean("duration_ms")


@dataclasses.dataclass
class SynthSession:
    """A built capture: one XSpace per host, plus the ground truth."""

    spaces: dict[str, XSpace]
    truth: Truth

    @property
    def space(self) -> XSpace:
        return next(iter(self.spaces.values()))

    def write(self, logdir: os.PathLike | str, run: str = "run",
              session: str = "2024_01_01_00_00_00") -> Path:
        return write_session(logdir, run, session, self.spaces)


# ------------------------------------------------------- step-level builder


@dataclasses.dataclass
class _DeviceOp:
    kind: str  # "kernel", "h2d", "d2h", "allreduce"
    name: str  # kernel / copy event name
    op: str  # framework op "scope/op:Type" (TF) or HLO op (JAX)
    dur_ps: int
    category: str = ""  # compute category
    nbytes: int = 0


_ELIGIBLE_LAYERS = ("dense", "dense_1", "conv2d", "conv2d_1", "dense_2", "conv2d_2")
_EW_OPS = ("Relu", "BiasAdd", "AddV2", "Mul")
_HOST_OP_TYPES = ("MatMul", "Conv2D", "Unique", "SparseSegmentSum")


def _split(total_ps: int, n: int) -> list[int]:
    """``n`` integer parts summing exactly to ``total_ps``."""
    base, extra = divmod(total_ps, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def _ms(ps: int) -> float:
    return ps / PS_PER_MS


class _StepPlanner:
    """Turns the planted fractions into per-GPU device-op lists for one step."""

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg["seed"])

    def categories(self, compute_ps: int) -> list[tuple[str, str, int]]:
        """(category, dtype, ps) budgets of one GPU's compute time."""
        c = self.cfg
        lp = c["fp16_frac"] + c["bf16_frac"]
        tc = c["tensor_core_frac"]
        elig = c["eligible_frac"]
        if tc > elig + 1e-9:
            raise ValueError("tensor_core_frac cannot exceed eligible_frac")
        if lp > tc + (1 - elig) + 1e-9:
            raise ValueError("16-bit fraction larger than Tensor-Core + element-wise time")
        lp_dtype = "bf16" if c["bf16_frac"] > c["fp16_frac"] else "fp16"
        tc16 = min(lp, tc)
        parts = [
            ("tc", lp_dtype, tc16),
            ("tc", "tf32", tc - tc16),
            ("eligible_fp32", "fp32", elig - tc),
            ("elementwise", lp_dtype, lp - tc16),
            ("elementwise", "fp32", 1 - elig - (lp - tc16)),
        ]
        return [(cat, dt, round(frac * compute_ps)) for cat, dt, frac in parts
                if round(frac * compute_ps) > 0]

    def compute_ops(self, compute_ps: int, target_kernel_ps: int,
                    n_kernels: int | None) -> list[_DeviceOp]:
        cc = self.cfg["cc"]
        jax = self.cfg["framework"] == "jax"
        budgets = self.categories(compute_ps)
        if n_kernels is not None:
            target_kernel_ps = max(1, compute_ps // n_kernels)
        ops: list[_DeviceOp] = []
        counter = 0
        for cat, dtype, ps in budgets:
            count = max(1, round(ps / target_kernel_ps))
            for dur in _split(ps, count):
                layer = _ELIGIBLE_LAYERS[counter % len(_ELIGIBLE_LAYERS)]
                conv = layer.startswith("conv")
                if cat == "elementwise":
                    op_type = _EW_OPS[counter % len(_EW_OPS)]
                    # XLA fuses element-wise work into fusions named after the HLO.
                    name = f"fusion.{counter % 29}" if jax else elementwise_kernel(op_type, dtype)
                    hlo = name
                else:
                    op_type = "Conv2D" if conv else "MatMul"
                    name = (tensor_core_kernel(cc, dtype, conv) if cat == "tc"
                            else fp32_gemm_kernel(cc, conv))
                    hlo = f"{'convolution' if conv else 'dot'}.{counter % 13}"
                op = hlo if jax else f"sequential/{layer}/{op_type}:{op_type}"
                ops.append(_DeviceOp("kernel", name, op, dur, category=f"{cat}:{dtype}"))
                counter += 1
        self.rng.shuffle(ops)
        return ops


def _validate(cfg: dict) -> None:
    if cfg["marker"] not in MARKER_STYLES:
        raise ValueError(f"marker must be one of {MARKER_STYLES}")
    for key in ("input_wait_frac", "host_overhead_frac", "launch_frac", "memcpy_frac",
                "fp16_frac", "bf16_frac", "tensor_core_frac", "eligible_frac",
                "peak_mem_frac"):
        if not 0.0 <= cfg[key] <= 1.0:
            raise ValueError(f"{key} must be within [0, 1]")
    if not 0.0 <= cfg["host_ops_frac"] < 1.0:
        raise ValueError("host_ops_frac must be within [0, 1)")
    if cfg["gpus"] == 0 and (cfg["launch_frac"] or cfg["memcpy_frac"] or cfg["allreduce_calls"]):
        raise ValueError("a CPU-only capture has no launches, copies or collectives")


def build_training_session(
    *,
    steps: int = 10,
    step_ms: float = 20.0,
    gpus: int = 1,
    marker: str = "keras2",
    framework: str = "tf",
    input_wait_frac: float = 0.0,
    host_overhead_frac: float = 0.0,
    launch_frac: float = 0.0,
    launch_skew_ms: float = 0.0,
    memcpy_frac: float = 0.0,
    h2d_bytes: int = 4 << 20,
    d2h_bytes: int = 0,
    collective_frac: float | None = None,
    allreduce_calls: int | None = None,
    gpu_compute_scale: Mapping[int, float] | None = None,
    kernel_us: float | None = None,
    kernels_per_step: int | None = None,
    fp16_frac: float = 0.0,
    bf16_frac: float = 0.0,
    tensor_core_frac: float | None = None,
    eligible_frac: float = 0.6,
    host_ops_frac: float = 0.0,
    peak_mem_frac: float = 0.5,
    fragmentation: float = 0.02,
    cc: tuple[int, int] = (7, 0),
    vendor: str | None = None,
    launch_api: str = "kernel_name",
    cupti_plane: bool = False,
    derived_lines: bool | None = None,
    group_ids: bool | None = None,
    main_thread: str | None = None,
    first_step_factor: float = 1.0,
    host: str = "synth-host",
    seed: int = 0,
) -> SynthSession:
    """Build ``steps`` training steps with the planted problems (see module doc).

    ``marker``: ``keras3`` (``Profiled batch`` + ``step_num``), ``keras2``
    (``TraceContext`` + ``step_num``/``group_id``), ``r`` (custom-loop
    ``train`` events with ``_r=1`` and ``step_num``), ``steps_line`` (only the
    derived ``Steps`` line on GPU planes), ``none`` (only repeated
    ``__inference_train_function_NNN`` runs; for JAX: ``jit_train_step``
    module executions).  ``launch_api``: ``kernel_name`` (TF 2.4: the host
    launch event is named after the kernel), ``cuLaunchKernel`` or
    ``cudaLaunchKernel`` (copies then use ``cuMemcpyHtoDAsync_v2`` /
    ``cudaMemcpyAsync``); ``cupti_plane=True`` puts those API events on a
    separate ``/host:CUPTI`` plane whose line ids equal the launching
    thread's line id.  ``gpus=0`` builds a CPU-only capture where the
    device-window work is host ops on a ``tf_Compute`` thread.
    ``first_step_factor`` stretches step 0 (all phases proportionally), as
    warm-up steps look.  ``kernel_us`` defaults to 200 unless
    ``kernels_per_step`` is given.
    """
    if kernel_us is not None and kernels_per_step is not None:
        raise ValueError("give kernel_us or kernels_per_step, not both")
    multi = gpus > 1
    cfg = dict(
        steps=steps, step_ms=step_ms, gpus=gpus, marker=marker, framework=framework,
        input_wait_frac=input_wait_frac, host_overhead_frac=host_overhead_frac,
        launch_frac=launch_frac, memcpy_frac=memcpy_frac,
        allreduce_calls=(1 if multi else 0) if allreduce_calls is None else allreduce_calls,
        fp16_frac=fp16_frac, bf16_frac=bf16_frac,
        tensor_core_frac=(fp16_frac + bf16_frac if tensor_core_frac is None
                          else tensor_core_frac),
        eligible_frac=eligible_frac, host_ops_frac=host_ops_frac,
        peak_mem_frac=peak_mem_frac, cc=tuple(cc), seed=seed)
    cfg["tensor_core_frac"] = min(cfg["tensor_core_frac"], eligible_frac) \
        if tensor_core_frac is None else cfg["tensor_core_frac"]
    cfg["collective_frac"] = ((0.05 if cfg["allreduce_calls"] else 0.0)
                              if collective_frac is None else collective_frac)
    _validate(cfg)
    if framework == "jax" and (marker != "none" or input_wait_frac or host_ops_frac):
        raise ValueError("JAX captures: marker='none', no tf.data input wait, no TF host ops")
    if framework == "jax" and launch_api == "kernel_name":
        launch_api = "cuLaunchKernel"
    builder = _SessionBuilder(
        cfg, gpu_compute_scale or {}, launch_skew_ms if multi else 0.0,
        200.0 if kernel_us is None and kernels_per_step is None else kernel_us,
        kernels_per_step, h2d_bytes, d2h_bytes, fragmentation, gpu_props(cc, vendor),
        launch_api, cupti_plane,
        marker in ("keras2", "r", "steps_line") if derived_lines is None else derived_lines,
        marker in ("keras2", "r", "steps_line") if group_ids is None else group_ids,
        main_thread or ("python" if marker in ("keras3", "r") or framework == "jax"
                        else "python3"),
        first_step_factor, host)
    return builder.build()


class _SessionBuilder:
    """Lays the planned steps out as host and device events."""

    T0_NS = 1_000_000  # capture start on every line's clock
    LEAD_IN_PS = 500 * PS_PER_US  # quiet time before the first step
    LAUNCH_PS = 3 * PS_PER_US  # shortest launch API call
    MIN_OP_PS = 5 * PS_PER_US

    def __init__(self, cfg, scale, skew_ms, kernel_us, kernels_per_step, h2d_bytes,
                 d2h_bytes, fragmentation, props, launch_api, cupti_plane, derived_lines,
                 group_ids, main_thread, first_step_factor, host) -> None:
        self.cfg = cfg
        self.jax = cfg["framework"] == "jax"
        self.scale = [float(scale.get(g, 1.0)) for g in range(max(cfg["gpus"], 1))]
        self.skew_ps = round(skew_ms * PS_PER_MS)
        self.kernel_ps = round(kernel_us * PS_PER_US) if kernel_us else None
        self.kernels_per_step = kernels_per_step
        self.h2d_bytes, self.d2h_bytes = h2d_bytes, d2h_bytes
        self.fragmentation = fragmentation
        self.props = props
        if launch_api not in ("kernel_name", "cuLaunchKernel", "cudaLaunchKernel"):
            raise ValueError("launch_api must be kernel_name, cuLaunchKernel or cudaLaunchKernel")
        if cupti_plane and launch_api == "kernel_name":
            raise ValueError("the /host:CUPTI plane holds driver/runtime API events")
        self.launch_api, self.cupti_plane = launch_api, cupti_plane
        self.derived_lines, self.group_ids = derived_lines, group_ids
        self.main_thread, self.first_step_factor, self.host = main_thread, first_step_factor, host
        self.planner = _StepPlanner(cfg)
        self.rng = random.Random(cfg["seed"] + 1)
        self.space = SpaceBuilder()
        self.host_plane = self.space.plane("/host:CPU")
        self.cupti = self.space.plane("/host:CUPTI") if cupti_plane else None
        self.gpu_planes = [self.space.gpu_plane(g, props) for g in range(cfg["gpus"])]
        self.correlation = 1000
        self.function_id = 700 + self.rng.randrange(300)
        self._tids: dict[str, int] = {}

    # -- threads and lines

    def _tid(self, key: str) -> int:
        if key not in self._tids:
            self._tids[key] = self.rng.randrange(1 << 20, 1 << 31)
        return self._tids[key]

    def host_line(self, key: str, name_prefix: str | None = None) -> LineBuilder:
        """A host thread line; ``name_prefix`` gets ``/<tid>`` appended like TF does."""
        tid = self._tid(key)
        name = key if name_prefix is None else f"{name_prefix}/{tid}"
        return self.host_plane.line(tid, name, self.T0_NS)

    @property
    def main(self) -> LineBuilder:
        if self.jax:
            return self.host_line("python")
        return self.host_line(self.main_thread)

    def launch_line(self, gpu: int) -> LineBuilder:
        if self.jax:
            return self.host_line(f"py_xla_execute:{gpu}", "py_xla_execute")
        return self.host_line(f"tf_Compute:gpu{gpu}", "tf_Compute")

    def api_line(self, gpu: int) -> LineBuilder:
        """Where launch API events go: the launch thread, or its CUPTI twin."""
        line = self.launch_line(gpu)
        if self.cupti is None:
            return line
        return self.cupti.line(line.line.id, line.line.name, self.T0_NS)

    def stream(self, gpu: int, kind: str) -> LineBuilder:
        numbers = {"Compute": 19, "MemcpyH2D": 20, "MemcpyD2H": 21, "Nccl": 24}
        sid = numbers[kind] + 10 * gpu
        label = "Compute" if kind == "Nccl" else kind
        # Device lines have their own clock origin, a little after the host's.
        return self.gpu_planes[gpu].line(sid, f"Stream #{sid}({label})", self.T0_NS + 5_000)

    def group(self, step: int) -> dict:
        return {"group_id": step} if self.group_ids else {}

    # -- layout

    def build(self) -> SynthSession:
        cfg = self.cfg
        truths: list[StepTruth] = []
        start = self.T0_NS * PS_PER_NS + self.LEAD_IN_PS
        for step in range(cfg["steps"]):
            factor = self.first_step_factor if step == 0 else 1.0
            dur_ps = round(cfg["step_ms"] * factor * PS_PER_MS)
            truths.append(self.build_step(step, start, dur_ps))
            start += dur_ps
        self.finish(start)
        peak = round(cfg["peak_mem_frac"] * self.props.memory_size)
        truth = Truth(
            steps=truths, marker=cfg["marker"], framework=cfg["framework"],
            capture_start_ps=self.T0_NS * PS_PER_NS, kernel_us=self._kernel_us,
            peak_bytes=[peak] * cfg["gpus"], memory_size=self.props.memory_size,
            fragmentation=self.fragmentation, launch_skew_ms=_ms(self.skew_ps))
        return SynthSession({self.host: self.space.build()}, truth)

    def finish(self, end_ps: int) -> None:
        if self.cfg["marker"] in ("keras3", "r") or self.jax:
            env = self.space.plane("Task Environment")
            env.set_stat("profile_start_time", U64(1_700_000_000_000_000_000))
            env.set_stat("profile_stop_time",
                         U64(1_700_000_000_000_000_000 + (end_ps // PS_PER_NS - self.T0_NS)))

    def build_step(self, step: int, start: int, dur_ps: int) -> StepTruth:
        cfg = self.cfg
        other_ps = round(cfg["host_overhead_frac"] * dur_ps)
        input_ps = round(cfg["input_wait_frac"] * dur_ps)
        window0 = start + other_ps + input_ps
        window_ps = start + dur_ps - window0
        self.host_step_events(step, start, dur_ps, other_ps, input_ps)
        gpus = cfg["gpus"]
        if gpus == 0:
            host_ops = self.cpu_compute(step, window0, window_ps)
            return StepTruth(step, start, _ms(dur_ps), _ms(input_ps), _ms(other_ps),
                             _ms(host_ops), [])
        launch_ps = round(cfg["launch_frac"] * dur_ps)
        copy_ps = round(cfg["memcpy_frac"] * dur_ps)
        coll_ps = round(cfg["collective_frac"] * dur_ps) if cfg["allreduce_calls"] else 0
        ref_ps = window_ps - launch_ps - copy_ps - coll_ps - self.skew_ps
        if ref_ps <= 0:
            raise ValueError("planted fractions leave no time for compute")
        top = max(self.scale)
        gpu_truths = []
        plans = []
        for g in range(gpus):
            compute_ps = round(ref_ps * self.scale[g] / top)
            plans.append(self.plan_gpu(g, compute_ps, copy_ps, coll_ps))
        # Every GPU leaves the first AllReduce together: the earliest any can.
        finish = window0 + window_ps
        for g, ops in enumerate(plans):
            skew = self.skew_ps if g else 0
            busy = sum(op.dur_ps for op in ops)
            spare = window_ps - launch_ps - skew - busy
            gpu_truths.append(self.lay_out_gpu(step, g, ops, window0, launch_ps, skew,
                                               spare, finish))
        host_op_ps = 0
        if cfg["host_ops_frac"] > 0:
            c0 = gpu_truths[0].compute_ms * PS_PER_MS
            host_op_ps = self.host_ops(step, window0, window_ps,
                                       round(cfg["host_ops_frac"] / (1 - cfg["host_ops_frac"]) * c0))
        if self.derived_lines or cfg["marker"] == "steps_line":
            self.steps_line(step, start, start + dur_ps)
        return StepTruth(step, start, _ms(dur_ps), _ms(input_ps), _ms(other_ps),
                         _ms(host_op_ps), gpu_truths)

    @property
    def _kernel_us(self) -> float:
        return (self.kernel_ps or 0) / PS_PER_US

    def plan_gpu(self, g: int, compute_ps: int, copy_ps: int, coll_ps: int) -> list[_DeviceOp]:
        ops: list[_DeviceOp] = []
        total_bytes = self.h2d_bytes + self.d2h_bytes
        h2d_ps = round(copy_ps * self.h2d_bytes / total_bytes) if total_bytes else copy_ps
        d2h_ps = copy_ps - h2d_ps
        if h2d_ps:
            ops.append(_DeviceOp("h2d", "MemcpyH2D", "copy-start.1" if self.jax
                                 else "IteratorGetNext/_2:_Send", h2d_ps, nbytes=self.h2d_bytes))
        n = self.kernels_per_step
        target = self.kernel_ps or max(1, compute_ps // max(n or 1, 1))
        compute = self.planner.compute_ops(compute_ps, target, n)
        if self.kernel_ps is None and compute:
            self.kernel_ps = sorted(op.dur_ps for op in compute)[len(compute) // 2]
        ops.extend(compute)
        calls = self.cfg["allreduce_calls"]
        for i, dur in enumerate(_split(coll_ps, calls) if calls else []):
            op = ("all-reduce-start" + (f".{i}" if i else "")) if self.jax else \
                f"Adam/CollectiveReduceV2_{i}:CollectiveReduceV2"
            ops.append(_DeviceOp("allreduce", allreduce_kernel(self.props.cc, self.cfg["framework"]),
                                 op, max(dur, 1)))
        if d2h_ps:
            ops.append(_DeviceOp("d2h", "MemcpyD2H", "copy-done.1" if self.jax
                                 else "Identity:_Retval", d2h_ps, nbytes=self.d2h_bytes))
        short = [op for op in ops if op.dur_ps < self.MIN_OP_PS]
        if short:
            raise ValueError(f"device op {short[0].name!r} shorter than 5 us; "
                             "use longer steps or fewer kernels")
        return ops

    def lay_out_gpu(self, step: int, g: int, ops: list[_DeviceOp], window0: int,
                    launch_ps: int, skew: int, spare: int, finish: int) -> GpuStepTruth:
        gaps = _split(launch_ps, len(ops))
        gaps[0] += skew
        truth = GpuStepTruth(launch_idle_ms=_ms(launch_ps + skew),
                             h2d_bytes=0, d2h_bytes=0)
        t = window0
        first_allreduce = True
        for op, gap in zip(ops, gaps):
            t += gap
            dur = op.dur_ps
            if op.kind == "allreduce" and first_allreduce:
                dur += spare  # waiting for the slowest replica inside NCCL
                first_allreduce = False
            self.device_op(step, g, op, t, dur, gap)
            if op.kind == "kernel":
                truth.compute_ms += _ms(dur)
                truth.kernels += 1
                cat, dtype = op.category.split(":")
                if dtype in ("fp16", "bf16"):
                    truth.low_precision_ms += _ms(dur)
                if cat == "tc":
                    truth.tensor_core_ms += _ms(dur)
                if cat in ("tc", "eligible_fp32"):
                    truth.eligible_ms += _ms(dur)
                if cat == "eligible_fp32":
                    truth.eligible_not_tc_ms += _ms(dur)
            elif op.kind == "allreduce":
                truth.collective_ms += _ms(dur)
                truth.allreduce_calls += 1
            else:
                truth.copy_ms += _ms(dur)
                if op.kind == "h2d":
                    truth.h2d_bytes += op.nbytes
                else:
                    truth.d2h_bytes += op.nbytes
            if op is ops[0]:
                truth.first_op_start_ms = _ms(t - window0)
            t += dur
        if first_allreduce:
            truth.tail_idle_ms = _ms(spare)
        self.memory_events(step, g, window0, t)
        return truth

    # -- host side

    def host_step_events(self, step: int, start: int, dur_ps: int, other_ps: int,
                         input_ps: int) -> None:
        main = self.main
        marker = self.cfg["marker"]
        end = start + dur_ps
        grp = self.group(step)
        body_end = end - 2 * PS_PER_US
        if self.jax:
            if other_ps:
                self.python_overhead(main, start, other_ps, grp)
            main.add("PjitFunction(train_step)", start + other_ps, body_end - start - other_ps)
            # One module execution per GPU and step, wrapping that GPU's launches
            # (which may begin a few microseconds before the step does).
            for g in range(self.cfg["gpus"]):
                line = self.launch_line(g)
                line.add("PjRtStreamExecutorLoadedExecutable::ExecuteHelper",
                         start - 4_500_000, dur_ps - 500_000)
                line.add("jit_train_step:XLA GPU module", start - 4 * PS_PER_US,
                         dur_ps - 1_500_000)
            return
        if marker == "keras3":
            main.add("Profiled batch", start, dur_ps - PS_PER_US, {"step_num": step, **grp})
        elif marker == "keras2":
            main.add("TraceContext", start, dur_ps - PS_PER_US,
                     {"graph_type": "train", "epoch_num": 0, "step_num": step,
                      "batch_size": 64, **self.group(step), "step_name": f"train {step}"})
        elif marker == "r":
            main.add("train", start, dur_ps - PS_PER_US, {"step_num": step, "_r": 1, **grp})
        if other_ps:
            self.python_overhead(main, start, other_ps, grp)
        call0 = start + other_ps
        if marker == "r" and input_ps:
            # Eager next(iterator) on the main thread, then the step function.
            main.add("EagerLocalExecute: IteratorGetNext", call0, input_ps, grp)
            self.input_events(main, call0, input_ps, step)
            call0 += input_ps
        elif input_ps:
            self.input_events(self.host_line("tf_data:get_next", "tf_data_iterator_get_next"),
                              call0, input_ps, step)
        fn = "step" if marker == "r" else ("multi_step_on_iterator" if marker == "keras3"
                                           else "train_function")
        call_ps = body_end - call0
        main.add(fn, call0, call_ps, {"tf_function_call": "notTraced-nonXla",
                                      "tracing_count": 2, **grp})
        main.add(f"EagerLocalExecute: __inference_{fn}_{self.function_id}",
                 call0 + PS_PER_US // 2, call_ps - PS_PER_US, grp)
        main.add("FunctionRun", call0 + PS_PER_US, call_ps - 2 * PS_PER_US,
                 {"id": self.rng.randrange(1 << 62), "_r": 1, "_pt": 2,
                  "_p": U64(self.rng.randrange(1 << 63)), **grp})

    def python_overhead(self, main: LineBuilder, start: int, other_ps: int, grp: dict) -> None:
        """Python-side work with no launches: tensor conversion, callbacks."""
        if self.jax:
            parts = _split(other_ps, 2)
            main.add("$callbacks.py:412 on_step_end", start, parts[0])
            main.add("$metrics.py:88 update_state", start + parts[0], parts[1])
            return
        half = _split(other_ps, 2)
        main.add("convert_to_tensor", start, half[0], grp)
        main.add("tf.constant", start + PS_PER_US // 10, max(half[0] - PS_PER_US // 5, 1), grp)
        main.add("TFE_Py_FastPathExecute_C", start + half[0], half[1], grp)

    def input_events(self, line: LineBuilder, t: int, dur: int, step: int) -> None:
        grp = self.group(step)
        line.add("IteratorGetNextOp::DoCompute", t, dur,
                 {"id": self.rng.randrange(1 << 62), "iter_num": 0, "element_size": 8704, **grp})
        inner = max(dur - 2 * PS_PER_US, 1)
        line.add("Iterator::Model", t + PS_PER_US // 2, inner,
                 {"id": 8657191748811243460, **grp})
        line.add("Iterator::Model::ParallelMapV2", t + PS_PER_US, max(inner - PS_PER_US, 1),
                 {"id": 1903816574530478691, "parent_id": 8657191748811243460,
                  "autotune": "true", "deterministic": "true", "parallelism": 8, **grp},
                 display_name="Iterator::ParallelMapV2")

    def device_op(self, step: int, g: int, op: _DeviceOp, start: int, dur: int, gap: int) -> None:
        """The device event, its host launch, and the op event wrapping the launch."""
        self.correlation += 1
        corr = U64(self.correlation)
        grp = self.group(step)
        launch_ps = max(gap, self.LAUNCH_PS)
        launch_start = start - launch_ps
        details = "regs:64 shm:0 grid:80,1,1 block:256,1,1"
        is_copy = op.kind in ("h2d", "d2h")
        copy_details = f"size:{op.nbytes} dest:0 async:1"
        # Host side: op event (TF) wrapping the launch API event.
        host = self.launch_line(g)
        if not self.jax and not is_copy:
            op_type = op.op.rsplit(":", 1)[1]
            host.add(op.op, launch_start - PS_PER_US, launch_ps + PS_PER_US,
                     {"is_eager": 0, **grp}, display_name=op_type)
        api_line = self.api_line(g)
        if self.launch_api == "kernel_name" and not self.jax:
            stats = {"correlation_id": corr, "context_id": "$$1"}
            stats.update({"memcpy_details": copy_details} if is_copy
                         else {"kernel_details": Ref(details)})
            api_line.add(op.name, launch_start, launch_ps, {**stats, **grp})
        else:
            runtime = self.launch_api == "cudaLaunchKernel"
            if is_copy:
                api = "cudaMemcpyAsync" if runtime else (
                    "cuMemcpyHtoDAsync_v2" if op.kind == "h2d" else "cuMemcpyDtoHAsync_v2")
            else:
                api = "cudaLaunchKernel" if runtime else "cuLaunchKernel"
            stats = {"correlation_id": corr}
            if self.jax:
                stats.update({"tf_op": Ref("XlaModule:"), "hlo_op": Ref(op.op),
                              "hlo_module": Ref("jit_train_step"), "program_id": 17})
            api_line.add(api, launch_start, launch_ps, stats)
        # Device side.
        if is_copy:
            line = self.stream(g, "MemcpyH2D" if op.kind == "h2d" else "MemcpyD2H")
            stats = {"correlation_id": corr, "context_id": "$$1",
                     "memcpy_details": copy_details}
        else:
            line = self.stream(g, "Nccl" if op.kind == "allreduce" else "Compute")
            stats = {"correlation_id": corr, "context_id": "$$1",
                     "kernel_details": Ref(details)}
        if self.jax:
            stats.update({"tf_op": Ref("XlaModule:"), "hlo_op": Ref(op.op),
                          "hlo_module": Ref("jit_train_step"), "program_id": 17})
        else:
            stats.update({"annotation": Ref(op.op), "level 0": Ref(op.op), **grp,
                          "is_eager": 0})
        line.add(op.name, start, dur, stats)
        if self.derived_lines and not self.jax and not is_copy:
            plane = self.gpu_planes[g]
            origin = self.T0_NS + 5_000
            name, op_type = op.op.rsplit(":", 1)
            plane.line(TF_OPS_LINE_ID, "TensorFlow Ops", origin).add(
                op.op, start, dur, grp, display_name=op_type)
            plane.line(TF_NAME_SCOPE_LINE_ID, "TensorFlow Name Scope", origin).add(
                name.split("/")[0], start, dur, grp)

    def memory_events(self, step: int, g: int, t0: int, t1: int) -> None:
        """Four allocations per step whose running total peaks at the planted peak."""
        line = self.launch_line(g)
        size = self.props.memory_size
        limit = int(size * 0.95)
        peak = round(self.cfg["peak_mem_frac"] * size)
        for i, share in enumerate((0.55, 0.8, 1.0, 0.7)):
            allocated = round(peak * share)
            at = t0 + (t1 - t0) * (i + 1) // 6
            line.add("MemoryAllocation", at, 0, {
                "allocator_name": f"GPU_{g}_bfc", "bytes_reserved": 0,
                "bytes_allocated": allocated, "bytes_available": limit - allocated,
                "fragmentation": float(self.fragmentation), "peak_bytes_in_use": peak,
                "requested_bytes": 1 << 20, "allocation_bytes": 1 << 20,
                "addr": 140505562014720 + (i << 20), "tf_op": "sequential/dense/MatMul",
                "id": 0, "region_type": "output", "data_type": 1, "shape": "[64,1024]",
                **self.group(step)})

    def host_ops(self, step: int, window0: int, window_ps: int, total_ps: int) -> int:
        """Framework ops run on host threads with no kernels, inside the device window."""
        per_thread = int(window_ps * 0.9)
        threads = -(-total_ps // per_thread)
        done = 0
        for k, share in enumerate(_split(total_ps, threads)):
            line = self.host_line(f"tf_Compute:host{k}", "tf_Compute")
            n = max(1, round(share / (500 * PS_PER_US)))
            t = window0 + window_ps // 20
            for i, dur in enumerate(_split(share, n)):
                op_type = _HOST_OP_TYPES[i % len(_HOST_OP_TYPES)]
                line.add(f"sequential/host_{i % 3}/{op_type}:{op_type}", t, dur,
                         {"is_eager": 0, **self.group(step)}, display_name=op_type)
                t += dur
                done += dur
        return done

    def cpu_compute(self, step: int, window0: int, window_ps: int) -> int:
        """CPU-only capture: the step's compute is host ops on one executor thread."""
        line = self.host_line("tf_Compute:cpu", "tf_Compute")
        busy = window_ps - 4 * PS_PER_US
        n = max(1, round(busy / (self.kernel_ps or 200 * PS_PER_US)))
        t = window0 + 2 * PS_PER_US
        for i, dur in enumerate(_split(busy, n)):
            layer = _ELIGIBLE_LAYERS[i % len(_ELIGIBLE_LAYERS)]
            op_type = ("_MklNativeFusedMatMul", "Relu", "AddV2")[i % 3]
            line.add(f"sequential/{layer}/{op_type}:{op_type}", t, dur,
                     {"is_eager": 0, **self.group(step)}, display_name=op_type)
            t += dur
        return busy

    def steps_line(self, step: int, start: int, end: int) -> None:
        """The derived ``Steps`` line TF 2.x stores on each GPU plane."""
        for plane in self.gpu_planes:
            plane.line(STEPS_LINE_ID, "Steps", self.T0_NS + 5_000).add(
                str(step), start, end - start - PS_PER_US,
                {"group_id": step, "step_name": str(step)})


# --------------------------------------------------------------- writing


def session_dir(logdir: os.PathLike | str, run: str, session: str) -> Path:
    return Path(logdir) / run / "plugins" / "profile" / session


def write_session(logdir: os.PathLike | str, run: str, session: str,
                  spaces: Mapping[str, XSpace | bytes]) -> Path:
    """Write ``<logdir>/<run>/plugins/profile/<session>/<host>.xplane.pb`` per host."""
    folder = session_dir(logdir, run, session)
    folder.mkdir(parents=True, exist_ok=True)
    for host, space in spaces.items():
        data = space if isinstance(space, bytes) else space.SerializeToString()
        (folder / f"{host}.xplane.pb").write_bytes(data)
    return folder


def truncated(data: bytes, keep: float = 0.5) -> bytes:
    """The first ``keep`` share of a serialized capture (cut mid-message)."""
    return data[: max(1, int(len(data) * keep))]


def garbage(size: int = 4096, seed: int = 0) -> bytes:
    """Random bytes that do not parse as an XSpace (starts with an invalid tag)."""
    rng = random.Random(seed)
    return b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01" + bytes(
        rng.randrange(256) for _ in range(size))


def write_bad_session(logdir: os.PathLike | str, run: str, session: str, kind: str,
                      host: str = "bad-host", source: bytes | None = None) -> Path:
    """A session whose one host file is ``truncated``, ``empty`` or ``garbage``."""
    if kind == "truncated":
        data = truncated(source if source is not None else
                         build_training_session(steps=2).space.SerializeToString())
    elif kind == "empty":
        data = b""
    elif kind == "garbage":
        data = garbage()
    else:
        raise ValueError("kind must be truncated, empty or garbage")
    return write_session(logdir, run, session, {host: data}) / f"{host}.xplane.pb"


# ------------------------------------------------------------ parse helpers


def iter_events(space: XSpace, plane_name: str | None = None,
                line_name: str | None = None) -> Iterable[tuple[XPlane, XLine, XEvent, str, dict]]:
    """(plane, line, event, event name, {stat name: value}) for reading captures back.

    ``ref_value`` stats come back as the referenced string, like TF reads them.
    Meant for tests: it builds Python objects per event.
    """
    for plane in space.planes:
        if plane_name is not None and plane.name != plane_name:
            continue
        names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            if line_name is not None and not line.name.startswith(line_name):
                continue
            for event in line.events:
                stats = {}
                for stat in event.stats:
                    kind = stat.WhichOneof("value")
                    value = getattr(stat, kind) if kind else None
                    if kind == "ref_value":
                        value = names[value]
                    stats[names[stat.metadata_id]] = value
                yield plane, line, event, plane.event_metadata[event.metadata_id].name, stats


def event_start_ps(line: XLine, event: XEvent) -> int:
    return line.timestamp_ns * PS_PER_NS + event.offset_ps
