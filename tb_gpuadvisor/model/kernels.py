"""What a GPU kernel or framework op is, read from its name.

The profiler records kernel names as the CUDA/HIP symbol the library launched
(``volta_sgemm_128x64_nn``, ``ampere_fp16_s16816gemm_fp16_...``, ``ncclKernel_AllReduce_...``)
and the framework op as ``scope/name:Type`` (TensorFlow) or an HLO instruction name (XLA/JAX).
Library authors encode the data type and the math unit in those names, so name
patterns are how the Advisor tells Tensor Core kernels, 16-bit kernels, collectives and
layout conversions apart. Every classifier works on the distinct names of a device once
and returns masks that index its event columns.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tb_gpuadvisor.arrays import kept_mask
from tb_gpuadvisor.timeline import Device, DeviceActivity, HostActivity, SessionModel
from tb_gpuadvisor.kinds import DeviceEventKind
from tb_gpuadvisor.vocab import gpu, pytorch, tensorflow, xla
from tb_gpuadvisor.stages import Memo

# What this stage derives from the tables and asks for again (see stages.Memo).
_MEMO = Memo()

_SHAPE_ANNOTATION = re.compile(r"#shape=\(([^)]*)\)#")
_TENSOR_SHAPE = re.compile(r"(\w+)\[([\d,]*)\]")


def is_tensor_core_kernel(name: str) -> bool:
    return bool(gpu.TENSOR_CORE_KERNEL.search(name))


def is_low_precision_kernel(name: str) -> bool:
    """True for kernels computing in 16-bit floats (fp16/bf16) or narrower (fp8, int8)."""
    return bool(gpu.LOW_PRECISION_KERNEL.search(name))


def is_collective_kernel(name: str) -> bool:
    return bool(gpu.COLLECTIVE_KERNEL.search(name))


def is_allreduce_kernel(name: str) -> bool:
    """AllReduce kernels; NCCL's generic kernels ("ncclKernel_..."/"ncclDevKernel_...")
    name the collective in their template arguments."""
    return bool(gpu.ALLREDUCE_KERNEL.search(name))


def op_type(op: str) -> str:
    """The op type of a framework op string: "scope/dense/MatMul:MatMul#shape=...#" -> "MatMul".

    XLA instruction names have no type suffix; their base name ("dot.3" -> "dot") is returned.
    """
    base = op.split("#", 1)[0]
    if ":" in base:
        return base.rsplit(":", 1)[1]
    return re.sub(r"\.\d+$", "", base.rsplit("/", 1)[-1])


def python_api(op_type: str) -> str | None:
    """The Python API that made an op of type OP_TYPE run Python code ("EagerPyFunc" ->
    "tf.py_function"), None for any other op."""
    return tensorflow.PYTHON_OPS.get(op_type)


def op_display_name(op: str) -> str:
    """An op string without its trailing annotation arguments ("#shape=...#")."""
    return op.split("#", 1)[0]


def is_math_kernel(name: str) -> bool:
    """False for the kernels of eligible ops that do no matrix math (FFT, flips, shuffles, helpers)."""
    return not gpu.NOT_MATH_KERNEL.search(name)


def is_tensor_core_eligible_op(op: str) -> bool:
    if not op:
        return False
    kind = op_type(op)
    return kind in tensorflow.TENSOR_CORE_ELIGIBLE_OPS or bool(xla.TENSOR_CORE_ELIGIBLE.match(kind))


def annotated_shapes(op: str) -> list[tuple[str, tuple[int, ...]]]:
    """Input shapes TensorFlow appends to some op annotations ("#shape=(half[4,1];int32[1])#")."""
    match = _SHAPE_ANNOTATION.search(op)
    if not match:
        return []
    shapes = []
    for dtype, dims in _TENSOR_SHAPE.findall(match.group(1)):
        shapes.append((dtype, tuple(int(d) for d in dims.split(",") if d)))
    return shapes


def dims_not_multiple_of_8(op: str) -> list[int]:
    """Matrix dimensions (the last two of each annotated input) that are not multiples of 8."""
    bad: list[int] = []
    for _dtype, dims in annotated_shapes(op):
        for dim in dims[-2:]:
            if dim % 8 and dim not in bad:
                bad.append(dim)
    return bad


def name_mask(names: Sequence[str], predicate: Callable[[str], object]) -> np.ndarray:
    """``predicate`` evaluated once per distinct name, as a table that event name ids index."""
    return np.fromiter((bool(predicate(name)) for name in names), bool, count=len(names))


def named_events(table: HostActivity | DeviceActivity, key: str, predicate: Callable[[str], object]) -> np.ndarray:
    """Per-event mask of TABLE's events whose name satisfies PREDICATE, kept in this
    module's memo under KEY (read-only, ``arrays.kept_mask``): computed once per table, whoever asks."""
    mask = _MEMO.of(table).get(key)
    if mask is None:
        mask = _MEMO.of(table)[key] = kept_mask(name_mask(table.names, predicate)[table.name])
    return mask



def torch_precision_masks(dev: DeviceActivity) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(float64 events, fp32 GEMMs on CUDA cores where the GPU has TF32, 32-bit Tensor Core kernels
    there: TF32) of a PyTorch trace's device, by kernel name (vocab.pytorch); the precision check
    and the replay both read them."""
    fp64 = named_events(dev, "fp64", pytorch.is_fp64_kernel)
    if not pytorch.runs_tf32(dev.device.vendor, dev.device.cc_major):
        none = np.zeros(len(dev), bool)
        return fp64, none, none
    cls = classify(dev)
    return (fp64, named_events(dev, "cuda_core_fp32", pytorch.is_fp32_cuda_core_gemm),
            cls.tensor_core & ~cls.low_precision)

@dataclass
class KernelClasses:
    """Per-event masks of one device's activity, computed once per distinct name."""

    kernel: np.ndarray           # compute kernels (not copies, memsets or collectives)
    collective: np.ndarray
    allreduce: np.ndarray
    tensor_core: np.ndarray
    low_precision: np.ndarray
    eligible: np.ndarray         # kernel belongs to a Tensor-Core-eligible op (see _launched_eligible)
    layout: np.ndarray           # layout-conversion kernel


def classify(dev: DeviceActivity) -> KernelClasses:
    """Masks over ``dev``'s events for every kernel class the device checks use (computed once)."""
    classes = _MEMO.of(dev).get("kernel_classes")
    if classes is None:
        classes = _MEMO.of(dev)["kernel_classes"] = _classify(dev)
    return classes


def _classify(dev: DeviceActivity) -> KernelClasses:
    names_tc = name_mask(dev.names, is_tensor_core_kernel)
    names_low = name_mask(dev.names, is_low_precision_kernel)
    if dev.launch_op.size:
        names_tc |= name_mask(dev.names, gpu.MATRIX_UNIT_KERNEL.search)
        names_tc |= name_mask(dev.names, gpu.FUSED_ATTENTION_KERNEL.search) & names_low
    names_coll = name_mask(dev.names, is_collective_kernel)
    names_ar = name_mask(dev.names, is_allreduce_kernel)
    ops_eligible = name_mask(dev.ops, is_tensor_core_eligible_op)
    names_math = name_mask(dev.names, is_math_kernel)
    has_op = dev.op >= 0
    op_idx = np.where(has_op, dev.op, 0)
    eligible_op = has_op & (ops_eligible[op_idx] if ops_eligible.size else False)

    is_kernel_kind = dev.kind == DeviceEventKind.KERNEL
    collective = (dev.kind == DeviceEventKind.COLLECTIVE) | (is_kernel_kind & names_coll[dev.name])
    kernel = is_kernel_kind & ~collective
    layout_names = name_mask(dev.names, gpu.LAYOUT_KERNEL.search)
    layout_ops = name_mask(dev.ops, tensorflow.LAYOUT_OP.search)
    layout = kernel & (layout_names[dev.name]
                       | (has_op & (layout_ops[op_idx] if layout_ops.size else False)))
    layout |= kernel & _transposes_next_to_conv(dev, kernel, has_op, op_idx)
    eligible = (eligible_op | _launched_eligible(dev, names_tc & ~names_low)) if dev.launch_op.size else eligible_op
    return KernelClasses(
        kernel=kernel,
        collective=collective,
        allreduce=collective & names_ar[dev.name],
        tensor_core=kernel & names_tc[dev.name],
        low_precision=kernel & names_low[dev.name],
        eligible=kernel & eligible & names_math[dev.name],
        layout=layout,
    )


def _launched_eligible(dev: DeviceActivity, names_tf32: np.ndarray) -> np.ndarray:
    """Events whose device table names no op (PyTorch) that belong to Tensor-Core-eligible work:
    a matrix-math kernel launched by a matmul/convolution/attention/einsum/RNN op (``launch_op``,
    vocab.pytorch), or a library GEMM/convolution kernel whatever launched it (a compiled region
    calls cuBLAS with no aten op around it).  A 32-bit kernel already on Tensor Cores (TF32,
    NAMES_TF32 per name) is left out: the fixes that put 32-bit work on Tensor Cores are applied."""
    library = (name_mask(dev.names, gpu.LIBRARY_MATRIX_KERNEL.search) & ~names_tf32)[dev.name]
    if not dev.launch_ops:
        return library
    linked = dev.launch_op >= 0
    math_op = name_mask(dev.launch_ops, pytorch.tensor_core_op_kind)[np.where(linked, dev.launch_op, 0)]
    names = (name_mask(dev.names, gpu.MATRIX_MATH_KERNEL.search) & ~names_tf32)[dev.name]
    return (linked & math_op & names) | library


def op_column(dev: DeviceActivity) -> tuple[np.ndarray, list[str]]:
    """(per event, index into the list; the list of op names) of the op each event belongs to: the
    device table's own op (TensorFlow, XLA), or where it names none the op whose host call launched
    it (``launch_op``: PyTorch).  -1 for an event of neither."""
    if dev.launch_op.size and not np.any(dev.op >= 0):
        return dev.launch_op, dev.launch_ops
    return dev.op, dev.ops


def _transposes_next_to_conv(dev: DeviceActivity, kernel: np.ndarray, has_op: np.ndarray,
                             op_idx: np.ndarray) -> np.ndarray:
    """Transpose kernels launched right before or after a convolution on the same stream."""
    out = np.zeros(len(dev), bool)
    if not dev.ops:
        return out
    types = [op_type(op) for op in dev.ops]
    is_transpose = name_mask(types, lambda t: t in ("Transpose", "ConjugateTranspose"))
    is_conv = name_mask(types, tensorflow.CONV_OP.search)
    transpose = kernel & has_op & is_transpose[op_idx]
    conv = kernel & has_op & is_conv[op_idx]
    if not transpose.any() or not conv.any():
        return out
    for stream in np.unique(dev.stream[kernel]):
        idx = np.flatnonzero(kernel & (dev.stream == stream))   # time order within the stream
        t, c = transpose[idx], conv[idx]
        near = np.zeros(idx.size, bool)
        near[:-1] |= c[1:]
        near[1:] |= c[:-1]
        out[idx[t & near]] = True
    return out


def tensor_core_speedup(device: Device) -> float:
    """Assumed speed-up of Tensor-Core-eligible work moved from 32-bit to 16-bit math.

    The model behind every precision/Tensor Core saving: Volta and Turing (cc 7.x) run
    fp32 GEMMs on CUDA cores and fp16 on Tensor Cores, about 3x faster (the TensorFlow
    guide's "up to 3x"); Ampere and newer (cc >= 8.0) already run fp32 matmuls as TF32 on
    Tensor Cores by default, so fp16/bf16 gains about 2x; AMD CDNA matrix cores (gfx9xx)
    about 2x. GPUs without matrix units gain nothing (1.0).
    """
    major = device.cc_major
    if major is None:
        return 1.0
    if (device.vendor or "").upper() == "AMD":
        return 2.0 if major >= 9 else 1.0
    if major >= 8:
        return 2.0
    if major == 7:
        return 3.0
    return 1.0


def has_tensor_cores(device: Device) -> bool:
    return tensor_core_speedup(device) > 1.0


def step_windows(model: SessionModel) -> tuple[np.ndarray, np.ndarray, int]:
    """Windows [lo, hi) the device checks measure in, and how many steps they stand for.

    The session's step periods when it has steps; otherwise the span of all device
    activity counted as one step, so per-step numbers stay meaningful on captures
    without markers.
    """
    steps = model.steps
    if len(steps):
        return steps.start_ps.astype(np.int64), steps.end_ps.astype(np.int64), len(steps)
    devices = [dev for dev in model.devices if len(dev)]
    if not devices:
        return np.empty(0, np.int64), np.empty(0, np.int64), 0
    lo = min(int(dev.start_ps.min()) for dev in devices)
    hi = max(int(dev.end_ps.max()) for dev in devices)
    return np.array([lo], np.int64), np.array([hi], np.int64), 1


def in_steps(dev: DeviceActivity, model: SessionModel) -> np.ndarray:
    """Events of ``dev`` that count for per-step numbers (all of them when there are no steps)."""
    if len(model.steps) and dev.step.size == len(dev):
        return dev.step >= 0
    return np.ones(len(dev), bool)


def top_by_time(keys: np.ndarray, durations: np.ndarray, limit: int) -> list[tuple[int, int, int]]:
    """(key, total duration, count) of the ``limit`` keys with the most time, largest first."""
    if keys.size == 0:
        return []
    uniq, inverse = np.unique(keys, return_inverse=True)
    totals = np.bincount(inverse, weights=durations.astype(np.float64))
    counts = np.bincount(inverse)
    order = np.argsort(-totals, kind="stable")[:limit]
    return [(int(uniq[i]), int(totals[i]), int(counts[i])) for i in order if totals[i] > 0]


def device_label(model: SessionModel, dev: DeviceActivity) -> str:
    """A device's name, prefixed by its host when the session spans several hosts."""
    if max(len(model.hosts), model.session_hosts) > 1:
        return f"{dev.device.host}{dev.device.name}"
    return dev.device.name


# An eager memory-bound kernel counts as fusible below this duration: a kernel that long streams
# hundreds of MB at HBM speed, past the size where one more pass over memory is the kernel's cost.
FUSIBLE_MAX_PS = 100_000_000        # 100 us


def unfused_chains(dev: DeviceActivity) -> np.ndarray:
    """Per event of a PyTorch trace's device: an eager memory-bound ATen kernel
    (``pytorch.is_eager_memory_bound_kernel``) shorter than FUSIBLE_MAX_PS that runs right before or
    after another such kernel on its stream (copies and memsets in between neither break nor join
    a chain): a chain of at least two, which torch.compile would fuse into fewer passes over memory.
    Kept in this module's memo; the unfused_ops check and its replay scenario read it."""
    mask = _MEMO.of(dev).get("unfused_chains")
    if mask is not None:
        return mask
    small = (classify(dev).kernel & (dev.dur_ps < FUSIBLE_MAX_PS)
             & named_events(dev, "eager_memory_bound", pytorch.is_eager_memory_bound_kernel))
    rows = np.flatnonzero(dev.kind == DeviceEventKind.KERNEL)
    rows = rows[np.argsort(dev.stream[rows], kind="stable")]      # by stream, in time order within each
    linked = small[rows[:-1]] & small[rows[1:]] & (dev.stream[rows[:-1]] == dev.stream[rows[1:]])
    member = np.zeros(len(dev), bool)
    member[rows[:-1][linked]] = True
    member[rows[1:][linked]] = True
    _MEMO.of(dev)["unfused_chains"] = mask = kept_mask(member)
    return mask
