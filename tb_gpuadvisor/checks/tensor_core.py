"""tensor_core: do the ops that could use Tensor Cores actually use them?

## What it measures
Tensor-Core-eligible ops are MatMul, BatchMatMul (V2/V3), _FusedMatMul, Conv2D/Conv3D and
their backprop and fused variants, Einsum and the cuDNN RNN ops (plus XLA dot/convolution
instructions); any kernel that runs on Tensor Cores counts as eligible work too. Over the
kernel time of that work inside the profiled steps, on every GPU with Tensor Cores:
``tensor_core_percent`` is the share spent in Tensor Core kernels (recognised by name,
Hopper's included) and ``eligible_not_using_percent`` the share spent in other kernels.
Evidence lists the eligible ops that miss Tensor Cores, the time spent converting tensor
layouts (``nhwcToNchw``/``nchwToNhwc`` kernels, layout-optimizer transposes, Transposes
next to a convolution) and, when the capture records op shapes, matrix dimensions that are
not multiples of 8.

## Why it matters
A GEMM or convolution that runs on CUDA cores instead of Tensor Cores is several times
slower. It happens when the op computes in float32 (on Volta/Turing), when dimensions are
not multiples of 8, or when cuDNN picks a non-Tensor-Core algorithm; layout conversions
around convolutions are pure overhead added when the data layout is not the one the
GPU kernels prefer.

## How to fix
Compute in 16-bit (mixed precision), make channel, unit, batch and vocabulary sizes
multiples of 8, keep convolutions in the channels_last layout, and on Ampere or newer keep
TF32 enabled for float32 models.

PyTorch traces: a kernel belongs to the aten op whose runtime call launched it (``launch_op``,
by correlation id; see precision), so an op's evidence is the aten op (aten::cudnn_convolution,
aten::mm); fp32 kernels already on Tensor Cores (TF32) count as on them, and a run whose
eligible work is mostly 16-bit (autocast) is not told to turn mixed precision on.

Savings model: a replay of the step's dependency graph (attribution/replay.py) with the
eligible kernels not on Tensor Cores running ``speedup`` times faster (3x on cc 7.x, 2x on
cc >= 8.0, see precision); kernels off the critical path save nothing. For 32-bit kernels
this is the same fix as precision's: the report counts that time once (whichever ranks
first carries it). Warning when ``eligible_not_using_percent`` >= 10 and the replayed
saving is real time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from tb_gpuadvisor.model import kernels
from tb_gpuadvisor.checks.context import Analysis, StepScale, judged, measurement
from tb_gpuadvisor.checks import fixes
from tb_gpuadvisor.checks.fixes import GPU_PERF_GUIDE, Remedy, mixed_precision_remedy
from tb_gpuadvisor.attribution.replay import Scenario
from tb_gpuadvisor.checks.base import (
    NoMarks,
    Compared, CrossHost, Finding, HostAlignment, Replayed, Severity, join_per_gpu, needs_gpu, register,
)
from tb_gpuadvisor.checks.finding import Evidence, Fix
from tb_gpuadvisor.vocab import gpu
from tb_gpuadvisor.timeline import PS_PER_MS, DeviceActivity, SessionModel

CHECK_ID = "tensor_core"
# The check whose fix (mixed precision) is also this one's: its replayed saving counts here too.
PRECISION_ID = "precision"
WARNING_AT = 10.0
TOP = 6

DIMS_FIX = Remedy(
    "Make the dimensions that feed matrix multiplies and convolutions multiples of 8 "
    "(units, filters, embedding and vocabulary sizes, batch size): Tensor Core kernels are "
    "only picked for aligned shapes.",
    "def round_up(n, multiple=8):\n    return (n + multiple - 1) // multiple * multiple\n\n"
    "vocab_size = round_up(vocab_size)          # pad the vocabulary, e.g. 30522 -> 30528\n"
    "x = keras.layers.Dense(round_up(1000))(x)   # 1000 units -> 1000 (already aligned)\n"
    "x = keras.layers.Conv2D(round_up(60), 3, padding=\"same\")(x)  # 60 filters -> 64",
    "https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/index.html",
    jax=Fix(
        "Make the dimensions that feed matrix multiplies and convolutions multiples of 8 (hidden "
        "and feature sizes, vocabulary, batch): matrix-unit kernels are only picked for aligned shapes.",
        "def round_up(n, multiple=8):\n    return (n + multiple - 1) // multiple * multiple\n\n"
        "vocab_size = round_up(vocab_size)   # pad the vocabulary, e.g. 30522 -> 30528\n"
        "w = jnp.zeros((round_up(d_in), round_up(d_out)), jnp.bfloat16)",
        "https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/index.html"))
LAYOUT_FIX = Remedy(
    "Keep convolutions in the channels_last (NHWC) layout that Tensor Core kernels use, and "
    "avoid manual transposes around them, so no layout-conversion kernels are needed.",
    'keras.config.set_image_data_format("channels_last")\n'
    'x = keras.layers.Conv2D(64, 3, data_format="channels_last")(x)',
    GPU_PERF_GUIDE, jax=fixes.JAX_CONV_LAYOUT, pytorch=fixes.TORCH_CHANNELS_LAST)
TF32_FIX = Remedy(
    "On Ampere or newer GPUs float32 matmuls and convolutions use Tensor Cores through TF32, "
    "unless it was switched off; make sure it is on.",
    "import tensorflow as tf\ntf.config.experimental.enable_tensor_float32_execution(True)",
    "https://www.tensorflow.org/api_docs/python/tf/config/experimental/enable_tensor_float32_execution",
    jax=Fix(
        "On Ampere or newer GPUs float32 matmuls and convolutions can use Tensor Cores through TF32; "
        "make sure the matmul precision was not raised to full float32.",
        "jax.config.update('jax_default_matmul_precision', 'tensorfloat32')",
        fixes.JAX_PRECISION_DOC), pytorch=fixes.TORCH_TF32)


@dataclass
class _OffTensorCores:
    """One eligible op's kernels on one GPU that did not run on Tensor Cores."""

    host: str
    time_ps: int = 0
    count: int = 0
    kernel_names: set[str] = field(default_factory=set)


@dataclass
class GpuTensorCores:
    """One Tensor Core GPU's eligible work inside the steps (ps, totals over all steps)."""

    device: str
    host: str
    cc_major: int | None
    speedup: float
    eligible_ps: int
    tc_ps: int
    missing_ps: int
    compute_ps: int
    layout_ps: int
    layout_kernels: int
    layout_first_ps: int          # start of the first layout conversion (0 without one)
    ops: dict[str, _OffTensorCores]         # op display name -> its kernels off Tensor Cores
    misaligned: dict[str, list[int]]        # op display name -> dimensions not a multiple of 8
    vendor: str | None = None
    low_ps: int = 0               # 16-bit eligible work (PyTorch traces: autocast at work when it dominates)

    def scaled(self, k: float) -> "GpuTensorCores":
        """Every total times K (the first layout change is a time, not a total)."""
        return replace(self, eligible_ps=round(self.eligible_ps * k), tc_ps=round(self.tc_ps * k),
                       missing_ps=round(self.missing_ps * k), compute_ps=round(self.compute_ps * k),
                       low_ps=round(self.low_ps * k),
                       layout_ps=round(self.layout_ps * k),
                       ops={name: replace(op, time_ps=round(op.time_ps * k)) for name, op in self.ops.items()})


@dataclass
class TensorCores:
    """What the Tensor Core judgement needs, however it was measured (one process or joined hosts)."""

    gpus: list[GpuTensorCores]
    windows: int


def _measure_gpu(dev: DeviceActivity, model: SessionModel) -> GpuTensorCores:
    cls = kernels.classify(dev)
    keep = kernels.in_steps(dev, model)
    # A kernel on Tensor Cores proves its op was eligible, whatever the op is called.
    eligible = (cls.eligible | cls.tensor_core) & keep
    missing = eligible & ~cls.tensor_core
    op_of, op_names = kernels.op_column(dev)
    # Aggregate per op id first, so only the distinct ops are visited in Python.
    rows = np.flatnonzero(missing & (op_of >= 0))
    op_ids = op_of[rows]
    time_by_op = np.bincount(op_ids, weights=dev.dur_ps[rows], minlength=len(op_names))
    count_by_op = np.bincount(op_ids, minlength=len(op_names))
    example_name = np.full(len(op_names), -1, np.int64)
    example_name[op_ids[::-1]] = dev.name[rows][::-1]          # the first kernel of each op
    ops: dict[str, _OffTensorCores] = {}
    for op_id in np.flatnonzero(count_by_op):
        entry = ops.setdefault(kernels.op_display_name(op_names[op_id]), _OffTensorCores(dev.device.host))
        entry.time_ps += int(time_by_op[op_id])
        entry.count += int(count_by_op[op_id])
        entry.kernel_names.add(dev.names[example_name[op_id]])
    misaligned = {}
    for op in {op_names[j] for j in np.unique(op_of[eligible & (op_of >= 0)])}:
        bad = kernels.dims_not_multiple_of_8(op)
        if bad:
            misaligned[kernels.op_display_name(op)] = bad
    layout = cls.layout & keep
    return GpuTensorCores(
        dev.device.name, dev.device.host, dev.device.cc_major, kernels.tensor_core_speedup(dev.device),
        int(dev.dur_ps[eligible].sum()), int(dev.dur_ps[eligible & cls.tensor_core].sum()),
        int(dev.dur_ps[missing].sum()), int(dev.dur_ps[cls.kernel & keep].sum()), int(dev.dur_ps[layout].sum()),
        int(layout.sum()), int(dev.start_ps[np.flatnonzero(layout)[0]]) if layout.any() else 0, ops, misaligned,
        vendor=dev.device.vendor,
        low_ps=int(dev.dur_ps[eligible & cls.low_precision].sum()) if dev.launch_op.size else 0)


@measurement
def measure(analysis: Analysis) -> TensorCores | Finding:
    model = analysis.model
    active = model.active_gpus
    if not active:
        return needs_gpu(CHECK_ID, "kernels")
    gpus = [dev for dev in active if kernels.has_tensor_cores(dev.device)]
    if not gpus:
        cc = ", ".join(sorted({d.device.compute_capability or "?" for d in active}))
        return Finding(CHECK_ID, Severity.NOT_APPLICABLE, "GPU has no Tensor Cores",
                       f"Tensor Cores arrived with compute capability 7.0; this capture's GPUs "
                       f"report {cc}.")
    _, _, windows = kernels.step_windows(model)
    return TensorCores([_measure_gpu(dev, model) for dev in gpus], windows)


def join(alignment: HostAlignment, primary: object, parts: list, steps: int) -> TensorCores | None:
    """Every host's GPUs, their totals brought to the primary host's number of step windows and
    their first layout change onto the session clock."""
    return join_per_gpu(primary, parts, TensorCores, lambda gpu, k, host: replace(
        gpu.scaled(k), layout_first_ps=int(alignment.on_session_clock(host, np.int64(gpu.layout_first_ps)))))


def judge_joined(measured: TensorCores, scale) -> Finding:
    """The session's Tensor Core use over every host's GPUs (SCALE: the merged session)."""
    return judge(measured, scale.what_if.saving_ms(CHECK_ID), scale.what_if.saving_ms(PRECISION_ID), scale)


@register(CHECK_ID, "Tensor Core usage", __doc__,
          what_if=Replayed(lambda model: Scenario(faster={"off_tensor_core": 0.0}),
                           what="eligible kernels off Tensor Cores sped up by each GPU's Tensor Core factor"),
          aspect="kernels", explains="device compute", explains_order=2, compared=Compared("eligible_not_using_percent"),
          cross_host=CrossHost(measure, join, judge_joined, "every host's GPUs, scaled to the primary host's steps"),
          marks=NoMarks("its share is a share of eligible kernel time, not intervals of the step"))
def check(analysis: Analysis) -> Finding:
    what_if = analysis.what_if
    return judged(measure(analysis),
                  lambda m: judge(m, what_if.saving_ms(CHECK_ID), what_if.saving_ms(PRECISION_ID), analysis))


def judge(measured: TensorCores, savings: float, shared: float, scale: StepScale) -> Finding:
    """The finding from every Tensor Core GPU's eligible work; SHARED is the precision fix's
    replayed saving (the same fix for 32-bit kernels)."""
    gpus, steps = measured.gpus, measured.windows
    units = gpu.matrix_units({g.vendor for g in gpus})        # Tensor Cores, or AMD's Matrix Cores
    eligible_word = units[:-1].replace(" ", "-") + "-eligible"
    eligible_ps = sum(g.eligible_ps for g in gpus)
    tc_ps = sum(g.tc_ps for g in gpus)
    not_using_ps = sum(g.missing_ps for g in gpus)
    layout_ps = sum(g.layout_ps for g in gpus)
    savings_ps = sum(g.missing_ps * (1.0 - 1.0 / g.speedup) for g in gpus)
    ops_missing: dict[tuple[str, str], _OffTensorCores] = {}
    misaligned: dict[str, list[int]] = {}
    for g in gpus:
        for name, op in g.ops.items():
            entry = ops_missing.setdefault((g.device, name), _OffTensorCores(op.host))
            entry.time_ps += op.time_ps
            entry.count += op.count
            entry.kernel_names |= op.kernel_names
        misaligned.update(g.misaligned)
    layout_items = [Evidence(
        "kernel", "layout conversions (NHWC<->NCHW transposes)",
        round(g.layout_ps / PS_PER_MS / steps, 3), "ms/step",
        detail=f"{g.layout_kernels} kernels, {100.0 * g.layout_ps / max(g.compute_ps, 1):.1f}% "
               f"of compute; first at {g.layout_first_ps / PS_PER_MS:.3f} ms",
        device=g.device, host=g.host, tool="kernel_stats") for g in gpus if g.layout_ps]
    if eligible_ps == 0:
        return Finding(CHECK_ID, Severity.NOT_APPLICABLE, "No Tensor-Core-eligible work",
                       "No GPU kernel belongs to a MatMul, convolution, Einsum or RNN op, so there is "
                       "nothing that could run on Tensor Cores (or the capture does not record "
                       "which op launched each kernel).")
    tc_percent = 100.0 * tc_ps / eligible_ps
    missing_percent = 100.0 * not_using_ps / eligible_ps
    metrics = {
        "tensor_core_percent": round(tc_percent, 2),
        "eligible_not_using_percent": round(missing_percent, 2),
        "eligible_ms_per_step": round(eligible_ps / PS_PER_MS / steps, 3),
        "eligible_ops_not_using": len({name for _, name in ops_missing}),
        "layout_conversion_ms_per_step": round(layout_ps / PS_PER_MS / steps, 3),
    }
    evidence = _op_evidence(ops_missing, steps) + layout_items
    evidence += [Evidence("op", name, float(dims[0]), "dim", detail="dimension(s) not a multiple of 8: "
                          + ", ".join(map(str, dims)), tool="tensorflow_stats")
                 for name, dims in list(misaligned.items())[:TOP]]
    metrics["kernel_savings_ms_per_step"] = round(savings_ps / PS_PER_MS / steps, 3)
    severity = scale.gated(Severity.WARNING if missing_percent >= WARNING_AT else Severity.OK, savings)
    if severity is Severity.OK:
        return Finding(CHECK_ID, severity, f"{tc_percent:.0f}% of eligible work runs on {units}",
                       f"Matrix multiplications and convolutions spend {tc_percent:.1f}% of their GPU "
                       f"time in {units[:-1]} kernels.", metrics, round(savings, 3), evidence, [])
    # Autocast already at work (PyTorch: most eligible time in 16-bit kernels) is not offered again.
    autocast = sum(g.low_ps for g in gpus) > not_using_ps
    fixes = [] if autocast else [mixed_precision_remedy([(g.vendor, g.cc_major) for g in gpus])]
    fixes.append(DIMS_FIX)
    if layout_ps:
        fixes.append(LAYOUT_FIX)
    if any((g.cc_major or 0) >= 8 for g in gpus):
        fixes.append(TF32_FIX)
    count = metrics["eligible_ops_not_using"]
    summary = (f"{count} {eligible_word} op(s) (MatMul, convolution, Einsum, RNN) spend "
               f"{missing_percent:.0f}% of their {metrics['eligible_ms_per_step']:.2f} ms per step in "
               f"kernels that do not use {units}. Running them on {units} would shorten the "
               f"step by about {savings:.2f} ms (replayed).")
    if shared > 0:
        summary += (" For their 32-bit kernels this is the same fix as mixed precision (the precision "
                    "finding): the time is counted once.")
    summary += scale.gain_note(severity, savings)
    if layout_ps:
        summary += (f" Another {metrics['layout_conversion_ms_per_step']:.2f} ms per step goes to "
                    "converting tensors between NHWC and NCHW layouts.")
    return Finding(CHECK_ID, severity,
                   f"{missing_percent:.0f}% of {eligible_word} time misses {units}",
                   summary, metrics, round(savings, 3), evidence, fixes)


def _op_evidence(ops_missing: dict[tuple[str, str], _OffTensorCores], steps: int) -> list[Evidence]:
    """The eligible ops with the most kernel time off Tensor Cores."""
    ranked = sorted(ops_missing.items(), key=lambda item: -item[1].time_ps)[:TOP]
    return [Evidence("op", name, round(op.time_ps / PS_PER_MS / steps, 3), "ms/step",
                     detail=f"{op.count} kernel(s) without Tensor Cores, e.g. {min(op.kernel_names)[:80]}",
                     device=device, host=op.host, tool="kernel_stats")
            for (device, name), op in ranked]
