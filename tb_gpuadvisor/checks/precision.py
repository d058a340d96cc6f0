"""precision: how much GPU compute runs in 16-bit floating point.

## What it measures
``low_precision_percent``: the time of 16-bit kernels (fp16 or bf16; fp8 and int8 count too)
as a share of all GPU compute-kernel time inside the profiled steps, summed over every GPU
(copies and collectives excluded). A kernel's precision is read from its name (``half``,
``fp16``, ``bf16``, ``h884``/``h1688`` MMA shapes ...). Also reported per GPU, with the
32-bit kernels of Tensor-Core-eligible ops (MatMul, Conv, BatchMatMul, Einsum, RNN) that
cost the most.

## Why it matters
GPUs with Tensor Cores (compute capability 7.0 and newer) multiply 16-bit matrices several
times faster than 32-bit ones, and memory-bound kernels move half the bytes. A model trained
in float32 on such a GPU leaves most of its math throughput unused. Warning when less than
10% of compute is 16-bit on a GPU with compute capability >= 7.0; older GPUs have no
Tensor Cores, so there the check only informs.

## How to fix
Turn on Keras mixed precision (``mixed_float16``; ``mixed_bfloat16`` on Ampere and newer,
which needs no loss scaling), keep the last layer's output in float32, and if dynamic loss
scaling shows up as host gaps, use a fixed loss scale.

In PyTorch, torch.autocast: float16 with a GradScaler on Volta and Turing (compute capability
7.x, whose Tensor Cores take fp16 only), bfloat16 on Ampere and newer and on AMD MI200/MI300
(no loss scaling), plus TF32 (``torch.set_float32_matmul_precision("high")``,
``torch.backends.cudnn.allow_tf32``) for what stays float32 on Ampere and newer.

## PyTorch traces
The device table names no op: a kernel belongs to the aten op whose runtime call launched it
(``launch_op``, by correlation id: aten::cudnn_convolution, aten::addmm, aten::bmm ...), and its
name says its precision (``volta_sgemm``/``implicit_convolve_sgemm``/``volta_scudnn`` fp32 on
CUDA cores, ``h884``/``bf16``/``f16`` 16-bit, ``s1688gemm``/``tf32``/``xmma`` on Tensor Cores).
Eligible 32-bit work is the matrix-math kernels of matmul/convolution/attention/einsum/RNN ops
(and cuBLAS/cuDNN GEMMs and convolutions of a compiled region) that are neither 16-bit nor
already on Tensor Cores (TF32): a fix the run already applied is never offered, and a run whose
eligible work is mostly 16-bit already uses autocast.  A GPU without deviceProperties is placed
by the architecture its cuBLAS/cuDNN kernels were built for (``volta_``, ``ampere_``, ``sm90_``).

Savings model: a replay of the step's dependency graph (attribution/replay.py) with the
32-bit kernels of Tensor-Core-eligible ops running ``speedup`` times faster: 3x on cc 7.x,
2x on cc >= 8.0 (fp32 already uses TF32 there) and AMD matrix-core GPUs, 1x without Tensor
Cores. The factors are conservative next to the peak rates: V100 does 15.7 TFLOPS in fp32 and
125 in fp16 on Tensor Cores (8x), yet convolution and GEMM kernels of real layers gain 2-4x
(memory traffic, small layers), and NVIDIA's mixed-precision ResNet-50 training runs about 3x
faster; on A100 fp32 CUDA cores do 19.5 TFLOPS against 156 in TF32 and 312 in bf16, and a fp32
GEMM already on TF32 is not counted at all. Only kernels on the step's critical path shorten it: on a GPU that mostly waits for
the host, faster kernels only lengthen its idle gaps and save about nothing. Elementwise
kernels would also speed up (half the bytes) but are not counted, so the estimate is
conservative. tensor_core describes the same fix for these kernels; the report counts
their time once.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from tb_gpuadvisor.model import kernels
from tb_gpuadvisor.checks.context import Analysis, StepScale, judged, measurement
from tb_gpuadvisor.checks import fixes
from tb_gpuadvisor.checks.fixes import MIXED_PRECISION_GUIDE, Remedy
from tb_gpuadvisor.attribution.replay import Scenario
from tb_gpuadvisor.checks.base import (
    NoMarks,
    Compared, CrossHost, Finding, HostAlignment, Replayed, Severity, join_per_gpu, needs_gpu, register,
)
from tb_gpuadvisor.checks.finding import Evidence
from tb_gpuadvisor.timeline import PS_PER_MS, DeviceActivity, SessionModel
from tb_gpuadvisor.vocab import pytorch

CHECK_ID = "precision"
WARNING_BELOW = 10.0
TOP = 5
# PyTorch traces: float64 kernels, or fp32 GEMMs on CUDA cores of an Ampere+ GPU (TF32 off), taking
# at least this share of GPU compute are a finding of their own.
WRONG_PRECISION_PERCENT = 5.0
# PyTorch traces: TF32 Tensor Core kernels taking this share of GPU compute are worth moving to 16 bits.
TF32_WARNING_AT = 20.0

TORCH_FLOAT32 = fixes.Fix(
    text="Keep tensors and the model in float32 (or lower): float64 runs at a fraction of float32 "
         "speed on most GPUs. float64 usually enters through NumPy arrays (torch.from_numpy keeps "
         "their dtype), Python floats turned into tensors with dtype=torch.double, or model.double().",
    code="x = torch.from_numpy(array).float()      # NumPy arrays are float64 by default\n"
         "model = model.float()\n"
         "torch.set_default_dtype(torch.float32)",
    doc=fixes.TORCH_TUNING_GUIDE)

# TF32 for what autocast leaves in float32 (Ampere and newer): a PyTorch setting only.
TORCH_TF32_REMEDY = Remedy(fixes.TORCH_TF32.text, fixes.TORCH_TF32.code, fixes.TORCH_TF32.doc, tensorflow=False,
                           pytorch=fixes.TORCH_TF32)

FIXES = [
    fixes.MIXED_PRECISION,
    Remedy("On Ampere or newer GPUs (compute capability >= 8.0) prefer bfloat16: same range as "
        "float32, so no loss scaling is needed.",
        'keras.mixed_precision.set_global_policy("mixed_bfloat16")',
        MIXED_PRECISION_GUIDE, jax=fixes.JAX_BF16),
    Remedy("If the dynamic loss scale's overflow checks show up as host gaps between steps, use a "
        "fixed (static) loss scale (tf.keras / Keras 2 API).",
        "optimizer = tf.keras.mixed_precision.LossScaleOptimizer(\n"
        "    tf.keras.optimizers.Adam(), dynamic=False, initial_scale=1024)",
        MIXED_PRECISION_GUIDE),
]


@dataclass
class GpuPrecision:
    """One GPU's compute kernel time by precision inside the steps (ps, totals over all steps)."""

    device: str
    host: str
    compute_capability: str | None
    tensor_cores: bool
    speedup: float              # of 32-bit eligible work moved onto Tensor Cores
    total_ps: int
    low_ps: int                 # fp16/bf16
    eligible32_ps: int          # 32-bit kernels of Tensor-Core-eligible ops
    offenders: list[tuple[str, int, int]]   # (kernel, ps, launches) of the largest 32-bit eligible ones
    fp64_ps: int = 0            # float64 kernels (PyTorch traces)
    cuda_core_fp32_ps: int = 0  # fp32 GEMMs on CUDA cores of an Ampere+ NVIDIA GPU: TF32 off (PyTorch traces)
    tf32_ps: int = 0            # 32-bit Tensor Core (TF32) kernels of an Ampere+ NVIDIA GPU (PyTorch traces)
    tf32_conv_ps: int = 0       # of which launched by convolution ops
    wrong_kernels: list[tuple[str, int, int]] = field(default_factory=list)  # the largest of either
    vendor: str | None = None
    eligible_low_ps: int = 0    # 16-bit kernels of Tensor-Core-eligible ops (autocast at work)
    torch: bool = False         # a PyTorch trace's GPU
    offender_ops: dict[str, str] = field(default_factory=dict)  # offender kernel -> the op that launched most of it

    def scaled(self, k: float) -> "GpuPrecision":
        """Every total times K."""
        return replace(self, total_ps=round(self.total_ps * k), low_ps=round(self.low_ps * k),
                       eligible32_ps=round(self.eligible32_ps * k), fp64_ps=round(self.fp64_ps * k),
                       cuda_core_fp32_ps=round(self.cuda_core_fp32_ps * k), eligible_low_ps=round(self.eligible_low_ps * k),
                       tf32_ps=round(self.tf32_ps * k), tf32_conv_ps=round(self.tf32_conv_ps * k),
                       offenders=[(name, round(ps * k), n) for name, ps, n in self.offenders],
                       wrong_kernels=[(name, round(ps * k), n) for name, ps, n in self.wrong_kernels])


@dataclass
class Precision:
    """What the precision judgement needs, however it was measured (one process or joined hosts)."""

    gpus: list[GpuPrecision]
    windows: int


@measurement
def measure(analysis: Analysis) -> Precision | Finding:
    model = analysis.model
    if not model.active_gpus:
        return needs_gpu(CHECK_ID, "kernels")
    _, _, windows = kernels.step_windows(model)
    rows = []
    for dev in model.active_gpus:
        cls = kernels.classify(dev)
        compute = cls.kernel & kernels.in_steps(dev, model)
        # bf16 counts as 16-bit here (XProf files it under 32-bit): it is what "mixed_bfloat16"
        # runs on Ampere+, and calling it 32-bit would tell users to enable what they already use.
        fp32_eligible = compute & cls.eligible & ~cls.low_precision
        offenders = [(dev.names[name_idx], int(dur), int(count)) for name_idx, dur, count in
                     kernels.top_by_time(dev.name[fp32_eligible], dev.dur_ps[fp32_eligible], TOP)]
        row = GpuPrecision(dev.device.name, dev.device.host, dev.device.compute_capability,
                           kernels.has_tensor_cores(dev.device), kernels.tensor_core_speedup(dev.device),
                           int(dev.dur_ps[compute].sum()), int(dev.dur_ps[compute & cls.low_precision].sum()),
                           int(dev.dur_ps[fp32_eligible].sum()), offenders, vendor=dev.device.vendor,
                           eligible_low_ps=int(dev.dur_ps[compute & cls.eligible & cls.low_precision].sum()))
        rows.append(_torch_precision(row, dev, compute) if model.framework == pytorch.FRAMEWORK else row)
    return Precision(rows, windows)


def _offender_ops(dev: DeviceActivity, rows: np.ndarray, offenders: list[tuple[str, int, int]]) -> dict[str, str]:
    """For each offender kernel, the op (``launch_op``) that launched most of its time among ROWS."""
    op_of, op_names = kernels.op_column(dev)
    by_name = {name: i for i, name in enumerate(dev.names)}
    out = {}
    for name, _, _ in offenders:
        mine = rows & (dev.name == by_name[name]) & (op_of >= 0)
        if mine.any():
            time_by_op = np.bincount(op_of[mine], weights=dev.dur_ps[mine], minlength=len(op_names))
            out[name] = op_names[int(np.argmax(time_by_op))]
    return out


def _torch_precision(row: GpuPrecision, dev: DeviceActivity, compute: np.ndarray) -> GpuPrecision:
    """ROW with the float64 and TF32-off kernel time of a PyTorch trace's GPU (kernel names of
    vocab.pytorch); the TF32 test needs the GPU's compute capability (deviceProperties).  Matmul TF32
    is on where 32-bit Tensor Core GEMMs (not convolutions: cuDNN's TF32 is on by default) take at
    least the time of the fp32 CUDA-core GEMMs (cuBLAS still picks an sgemm for some shapes with
    TF32 allowed): then those GEMMs do not say it is off."""
    fp64, cuda_core, tf32 = (compute & mask for mask in kernels.torch_precision_masks(dev))
    cls = kernels.classify(dev)
    tf32_gemm = compute & cls.tensor_core & ~cls.low_precision & kernels.named_events(dev, "matmul", pytorch.is_matmul_kernel)
    if cuda_core.any() and dev.dur_ps[tf32_gemm].sum() >= dev.dur_ps[cuda_core].sum():
        cuda_core = np.zeros_like(cuda_core)
    wrong = fp64 | cuda_core
    top = [(dev.names[i], int(ps), int(n)) for i, ps, n in kernels.top_by_time(dev.name[wrong], dev.dur_ps[wrong], TOP)]
    eligible32 = compute & cls.eligible & ~cls.low_precision
    op_of, op_names = kernels.op_column(dev)
    conv_ops = np.array([pytorch.is_convolution_op(n) for n in op_names] + [False], bool)
    tf32_conv = tf32 & conv_ops[np.where(op_of >= 0, op_of, len(op_names))]
    return replace(row, fp64_ps=int(dev.dur_ps[fp64].sum()), cuda_core_fp32_ps=int(dev.dur_ps[cuda_core].sum()),
                   wrong_kernels=top, torch=True, offender_ops=_offender_ops(dev, eligible32, row.offenders),
                   tf32_ps=int(dev.dur_ps[tf32].sum()), tf32_conv_ps=int(dev.dur_ps[tf32_conv].sum()))


def _scenario(model: SessionModel) -> Scenario:
    """The precision fix: 32-bit eligible work on Tensor Cores; on PyTorch traces also float64
    kernels computed in float32 and CUDA-core fp32 GEMMs run as TF32, or, where neither runs, TF32
    work in 16 bits."""
    faster = {"fp32_eligible": 0.0}
    if model.framework == pytorch.FRAMEWORK:
        faster.update(fp64=pytorch.FP64_SPEEDUP, cuda_core_fp32=pytorch.TF32_SPEEDUP)
        # TF32 work moves to 16 bits once nothing runs in float64 or with TF32 off: until then the
        # first fix is TF32 itself, and its saving is what it wins.
        if not any(np.any(wrong & kernels.in_steps(dev, model)) for dev in model.active_gpus
                   for wrong in kernels.torch_precision_masks(dev)[:2]):
            faster["tf32"] = pytorch.TF32_TO_16BIT_SPEEDUP
    return Scenario(faster=faster)


def join(alignment: HostAlignment, primary: object, parts: list, steps: int) -> Precision | None:
    """Every host's GPUs, their totals brought to the primary host's number of step windows."""
    return join_per_gpu(primary, parts, Precision, lambda gpu, k, host: gpu.scaled(k))


@register(CHECK_ID, "Mixed precision (16-bit compute)", __doc__,
          what_if=Replayed(lambda model: _scenario(model),
                           what="fp32 Tensor-Core-eligible kernels sped up by each GPU's Tensor Core factor "
                                "(PyTorch traces: float64 kernels and TF32-off fp32 GEMMs too)"),
          aspect="kernels", explains="device compute", explains_order=1,
          compared=Compared("low_precision_percent", "fp32_eligible_ms_per_step"),
          cross_host=CrossHost(measure, join, lambda m, scale: judge(m, scale.what_if.saving_ms(CHECK_ID), scale),
                               "every host's GPUs, scaled to the primary host's steps"),
          marks=NoMarks("its share is a share of kernel time by precision, not idle intervals"))
def check(analysis: Analysis) -> Finding:
    return judged(measure(analysis), lambda m: judge(m, analysis.what_if.saving_ms(CHECK_ID), analysis))


def judge(measured: Precision, savings: float, scale: StepScale) -> Finding:
    """The finding from every GPU's kernel time by precision and the replayed saving."""
    gpus, steps = measured.gpus, measured.windows
    total_ps = sum(g.total_ps for g in gpus)
    low_ps = sum(g.low_ps for g in gpus)
    eligible32_ps = sum(g.eligible32_ps for g in gpus)
    savings_ps = sum(g.eligible32_ps * (1.0 - 1.0 / g.speedup) for g in gpus)
    per_gpu = [Evidence("device", g.device, round(100.0 * g.low_ps / g.total_ps if g.total_ps else 0.0, 1),
                        "% 16-bit", detail=f"compute capability {g.compute_capability or '?'}, "
                                           f"{g.total_ps / PS_PER_MS / steps:.2f} ms compute per step",
                        device=g.device, host=g.host) for g in gpus]
    offenders = [Evidence("kernel", name, round(dur / PS_PER_MS / steps, 3), "ms/step",
                          detail=f"32-bit kernel of {_op_words(g.offender_ops.get(name))}, {count} launch(es)",
                          device=g.device, host=g.host, tool="kernel_stats")
                 for g in gpus for name, dur, count in g.offenders]
    if total_ps == 0:
        return Finding(CHECK_ID, Severity.NOT_APPLICABLE, "No GPU compute to assess",
                       "The GPUs ran no compute kernels inside the profiled steps.")
    percent = 100.0 * low_ps / total_ps
    capable = [g for g in gpus if g.tensor_cores]
    cc = ", ".join(sorted({g.compute_capability or "?" for g in gpus}))
    metrics = {"low_precision_percent": round(percent, 2),
               "fp32_eligible_ms_per_step": round(eligible32_ps / PS_PER_MS / steps, 3),
               "compute_ms_per_step": round(total_ps / PS_PER_MS / steps, 3)}
    offenders.sort(key=lambda item: -item.value)
    evidence = offenders[:TOP] + (per_gpu if len(per_gpu) > 1 else [])
    busy_savings = savings_ps / PS_PER_MS / steps
    metrics["kernel_savings_ms_per_step"] = round(busy_savings, 3)
    wrong = _wrong_precision(gpus, total_ps, steps, metrics, savings, scale)
    if wrong is not None:
        return wrong
    if any(g.torch for g in gpus):
        torch = _torch_judge(gpus, percent, metrics, savings, busy_savings, evidence, scale)
        if torch is not None:
            return torch
    if percent >= WARNING_BELOW:
        return Finding(CHECK_ID, Severity.OK, f"{percent:.0f}% of GPU compute runs in 16-bit",
                       f"{percent:.1f}% of GPU kernel time uses 16-bit (fp16/bf16) math, so mixed "
                       "precision is in effect.", metrics, round(savings, 3), evidence, [])
    if not capable:
        return Finding(CHECK_ID, Severity.OK, "32-bit compute on a GPU without Tensor Cores",
                       f"Only {percent:.1f}% of GPU kernel time is 16-bit, but this GPU (compute "
                       f"capability {cc}) has no Tensor Cores, so mixed precision would gain little.",
                       metrics, 0.0, evidence, [])
    severity = scale.gated(Severity.WARNING, savings)
    return Finding(
        CHECK_ID, severity,
        f"Only {percent:.0f}% of GPU compute is 16-bit on a Tensor Core GPU",
        f"{100 - percent:.0f}% of GPU kernel time runs in 32-bit on a GPU with compute capability "
        f"{cc}, whose Tensor Cores only pay off with 16-bit inputs. Matrix multiplications and "
        f"convolutions spend {metrics['fp32_eligible_ms_per_step']:.2f} ms per step in 32-bit; "
        f"they would run {busy_savings:.2f} ms per step faster with mixed precision (assumed "
        f"{capable[0].speedup:.0f}x speed-up of that work), and a replay of "
        f"the step predicts it {savings:.2f} ms shorter." + scale.gain_note(severity, savings),
        metrics, round(savings, 3), evidence, FIXES)


def _op_words(op: str | None) -> str:
    """How an offender's op is named: the op that launched it (PyTorch), else its class."""
    return op or "a Tensor-Core-eligible op"


def _torch_judge(gpus: list[GpuPrecision], percent: float, metrics: dict, savings: float, busy_savings: float,
                 evidence: list[Evidence], scale: StepScale) -> Finding | None:
    """A PyTorch trace's verdict in PyTorch's words (autocast, GradScaler, TF32), or None to
    leave it to the common one (no GPU has Tensor Cores, or 16-bit compute is WARNING_BELOW% or more
    and the eligible work is not mostly 32-bit: 16-bit embeddings or elementwise kernels beside
    fp32 GEMMs do not mean that autocast is on)."""
    capable = [g for g in gpus if g.tensor_cores]
    low_ps, fp32_ps = sum(g.eligible_low_ps for g in gpus), sum(g.eligible32_ps for g in gpus)
    if not capable or (percent >= WARNING_BELOW and fp32_ps <= low_ps):
        return None
    if low_ps and low_ps >= fp32_ps:
        return Finding(CHECK_ID, Severity.OK, "Autocast is in effect",
                       f"Matrix multiplications and convolutions spend {100 * low_ps / (low_ps + fp32_ps):.0f}% "
                       "of their GPU time in 16-bit kernels: the run already uses autocast.", metrics,
                       round(savings, 3), evidence, [])
    generations = [(g.vendor, int(g.compute_capability.split(".")[0]) if g.compute_capability else None)
                   for g in capable]
    if not fp32_ps:
        return _tf32_judge(gpus, generations, metrics, savings, evidence, scale)
    dtype = pytorch.autocast_dtype(*generations[0])
    how = "float16 with a GradScaler" if dtype == "float16" else "bfloat16"
    cc = ", ".join(sorted({g.compute_capability or "?" for g in capable}))
    severity = scale.gated(Severity.WARNING, savings)
    fixes_now = [fixes.mixed_precision_remedy(generations)]
    if any(pytorch.runs_tf32(vendor, major) for vendor, major in generations):
        fixes_now.append(TORCH_TF32_REMEDY)
    return Finding(
        CHECK_ID, severity,
        f"fp32 matmuls and convolutions miss the Tensor Cores: {metrics['fp32_eligible_ms_per_step']:.2f} ms per step",
        f"{100 - percent:.0f}% of GPU kernel time runs in 32-bit on a GPU with compute capability {cc}. "
        f"Its matmul, convolution and attention ops spend {metrics['fp32_eligible_ms_per_step']:.2f} ms per step "
        f"in fp32 kernels on CUDA cores; under torch.autocast in {how} they would run on Tensor Cores, "
        f"{busy_savings:.2f} ms per step faster (assumed {capable[0].speedup:.0f}x for that work), and a replay "
        f"of the step predicts it {savings:.2f} ms shorter." + scale.gain_note(severity, savings),
        metrics, round(savings, 3), evidence, fixes_now)


def _tf32_judge(gpus: list[GpuPrecision], generations: list[tuple[str | None, int | None]], metrics: dict,
                savings: float, evidence: list[Evidence], scale: StepScale) -> Finding:
    """No 32-bit matrix work on CUDA cores: where it runs as TF32 on Tensor Cores, 16-bit autocast
    (with channels_last for convolutions) is the next step; else nothing to do."""
    compute_ps = sum(g.total_ps for g in gpus)
    tf32_ps, conv_ps = sum(g.tf32_ps for g in gpus), sum(g.tf32_conv_ps for g in gpus)
    if not tf32_ps:
        return Finding(CHECK_ID, Severity.OK, "32-bit matrix work already runs on Tensor Cores",
                       "No 32-bit matmul or convolution kernel runs on CUDA cores: they run as TF32 "
                       "on Tensor Cores, or the run has none.", metrics, round(savings, 3), evidence, [])
    share = 100.0 * tf32_ps / compute_ps
    tf32_ms = metrics["compute_ms_per_step"] * tf32_ps / compute_ps
    metrics["tf32_ms_per_step"] = round(tf32_ms, 3)
    severity = scale.gated(Severity.WARNING if share >= TF32_WARNING_AT else Severity.INFO, savings)
    dtype = pytorch.autocast_dtype(*generations[0])
    how = "float16 with a GradScaler" if dtype == "float16" else "bfloat16"
    remedies = [fixes.mixed_precision_remedy(generations)] + ([fixes.TORCH_CHANNELS_LAST] if conv_ps else [])
    return Finding(
        CHECK_ID, severity, f"TF32 matmuls and convolutions: 16-bit would halve {tf32_ms:.2f} ms per step",
        f"{share:.0f}% of GPU kernel time runs 32-bit matrix math as TF32 on Tensor Cores"
        + (f" ({100 * conv_ps / tf32_ps:.0f}% of it in convolutions)" if conv_ps else "")
        + f". TF32 is not the fastest the Tensor Cores go: under torch.autocast in {how} the same work runs "
        f"at twice TF32's rate on half the bytes ({pytorch.TF32_TO_16BIT_SPEEDUP:.0f}x assumed)"
        + (", with convolutions in channels_last, the layout 16-bit Tensor Core convolutions read" if conv_ps else "")
        + f"; a replay of the step predicts it {savings:.2f} ms shorter." + scale.gain_note(severity, savings),
        metrics, round(savings, 3), evidence, remedies if severity is not Severity.OK else [])


def _wrong_precision(gpus: list[GpuPrecision], total_ps: int, steps: int, metrics: dict, savings: float,
                     scale: StepScale) -> Finding | None:
    """The finding for float64 kernels or TF32 left off (PyTorch traces), None when neither takes
    WRONG_PRECISION_PERCENT of compute; SAVINGS is the replayed gain of the precision scenario."""
    fp64_ps = sum(g.fp64_ps for g in gpus)
    cuda_core_ps = sum(g.cuda_core_fp32_ps for g in gpus)
    fp64_pct, cuda_core_pct = 100.0 * fp64_ps / total_ps, 100.0 * cuda_core_ps / total_ps
    if max(fp64_pct, cuda_core_pct) < WRONG_PRECISION_PERCENT:
        return None
    evidence = sorted((Evidence("kernel", name, round(ps / PS_PER_MS / steps, 3), "ms/step",
                                detail=f"{'float64' if pytorch.is_fp64_kernel(name) else 'fp32 on CUDA cores'} "
                                       f"kernel, {count} launch(es)", device=g.device, host=g.host)
                       for g in gpus for name, ps, count in g.wrong_kernels), key=lambda e: -e.value)[:TOP]
    metrics.update(fp64_percent=round(fp64_pct, 2), cuda_core_fp32_gemm_percent=round(cuda_core_pct, 2))
    severity = scale.gated(Severity.WARNING, savings)
    replayed = f" A replay of the step with the fix predicts it {savings:.2f} ms shorter." + scale.gain_note(severity, savings)
    if fp64_pct >= cuda_core_pct:
        return Finding(
            CHECK_ID, severity, f"float64 kernels take {fp64_pct:.0f}% of GPU compute",
            f"{fp64_pct:.1f}% of GPU kernel time ({fp64_ps / PS_PER_MS / steps:.2f} ms per step) runs "
            "float64 math, which GPUs run at a fraction of float32 speed (1/2 on A100/H100, 1/32 or "
            f"less on most others; {pytorch.FP64_SPEEDUP:.0f}x assumed)." + replayed,
            metrics, round(savings, 3), evidence, [TORCH_FLOAT32, fixes.TORCH_AUTOCAST])
    cc = ", ".join(sorted({g.compute_capability or "?" for g in gpus if g.cuda_core_fp32_ps}))
    return Finding(
        CHECK_ID, severity, f"TF32 is off: fp32 GEMMs on CUDA cores take {cuda_core_pct:.0f}% of GPU compute",
        f"{cuda_core_pct:.1f}% of GPU kernel time ({cuda_core_ps / PS_PER_MS / steps:.2f} ms per step) runs "
        f"fp32 matrix multiplications on CUDA cores (sgemm kernels) on a GPU of compute capability {cc}, "
        "whose Tensor Cores run them as TF32 when allowed; PyTorch leaves TF32 off for matmuls by "
        f"default ({pytorch.TF32_SPEEDUP:.0f}x assumed for TF32)." + replayed,
        metrics, round(savings, 3), evidence, [fixes.TORCH_TF32, fixes.TORCH_AUTOCAST])
