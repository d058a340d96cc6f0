"""unfused_ops: is a busy GPU's step spent in chains of small eager element-wise kernels?

## What it measures
``unfused_percent``: the share of step time the primary GPU spends in chains of small eager
memory-bound kernels: ATen's own element-wise, cast, copy, concatenation (``CatArrayBatchedCopy``),
reduction, softmax and normalisation kernels (``vocab.pytorch.is_eager_memory_bound_kernel``),
each shorter than 100 us (``kernels.FUSIBLE_MAX_PS``), that follow one another on their stream
(``kernels.unfused_chains``: at least two in a row; copies and memsets in between do not break a
chain, a GEMM or attention kernel does).  Also ``memory_bound_percent`` (all eager memory-bound
kernels, chained or not, as a share of GPU kernel time), ``busy_percent`` (the GPU busy share of
the step), ``kernels_per_step`` and ``median_kernel_us``, and as evidence the aten ops and the
kernels with the most chained time.  PyTorch traces only.

## Why it matters
An eager PyTorch model runs every pointwise op as its own kernel, which reads its inputs from GPU
memory and writes its output back: an RMSNorm is a cast, a pow, a mean, an add, an rsqrt, two
muls and a cast, eight passes over the activations where one would do; a KV cache grown with
``torch.cat`` copies the whole cache each token.  On a GPU busy most of the step (the device paces
the steps, or is busy at least 60% of them: ``BUSY_MIN``) those kernels are the step's time, not
launch gaps (``kernel_launch``'s) or input waits: the GPU is working, but mostly moving memory.
Warning from 15% of step time in such chains (``WARNING``: at half that time fused away, a
7% shorter step, about what the other checks warn at in saved time; a convolutional network's
BatchNorm/ReLU pairs stay below it, 4-5% of a ResNet-50 step in the corpus, whose first fixes
are elsewhere), gated by the replayed saving; no critical level, since how far a chain fuses
depends on the code (medium confidence at best).  A GPU idle most of the step is left to the
checks of what it waited for.

## How to fix
``model = torch.compile(model)``: Inductor fuses each chain of pointwise and reduction ops into
one Triton kernel (and the normalisation into the ops around it), so the activations cross memory
once.  When launch gaps also show (``kernel_launch``'s launch share 3% or more),
``mode="reduce-overhead"`` also replays the step as a CUDA graph.  In inference, where
``torch.cat`` kernels hold 10% of the chained time or more (``CAT_SHARE``: a KV cache grown by
concatenation), preallocate the cache (a static cache) and write each token in place.  A run that already
uses torch.compile (Inductor's ``triton_poi_``/``triton_red_``/``triton_per_``/``triton_tem_``
kernels hold at least half of the memory-bound kernel time: ``COMPILED_SHARE``) is not told to
compile: the eager chains left are code outside the compiled regions (graph breaks), said as info.
TensorFlow and JAX are not checked: XLA fuses element-wise chains itself (``xla_ops`` reads its
fusions), and the names here are ATen's.

Savings model: a replay of the step (attribution/replay.py) with every chained kernel twice as
fast (``FUSION_SPEEDUP``): fusing a chain of N memory-bound kernels reads and writes memory about
once instead of N times, which for N >= 2 saves at least half its traffic; a chain often fuses
further (and its launches go), so the saving is a conservative one.  Single kernels between GEMMs
are not counted: Inductor's epilogue fusion into a cuBLAS GEMM is not assumed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tb_gpuadvisor.attribution.replay import Scenario
from tb_gpuadvisor.checks import fixes
from tb_gpuadvisor.checks.base import (
    NoMarks,
    Compared, Finding, Replayed, Severity, needs_gpu, needs_steps, register, severity_by_threshold,
)
from tb_gpuadvisor.checks.finding import Evidence, Fix
from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.checks.launch_bound import LAUNCH_WARNING_PERCENT
from tb_gpuadvisor.model import kernels
from tb_gpuadvisor.timeline import PS_PER_US, DeviceActivity, SessionModel
from tb_gpuadvisor.vocab import pytorch

CHECK_ID = "unfused_ops"
WARNING = 15.0
BUSY_MIN = 60.0                 # % of the step the GPU must be busy for its kernels' time to be the step's
FUSION_SPEEDUP = 2.0            # a fused chain: memory read and written once instead of N >= 2 times
TOP = 5
COMPILED_SHARE = 0.5            # of the memory-bound kernel time in Triton kernels: the model is compiled
CAT_SHARE = 0.1                 # of the chained time in torch.cat kernels: in inference, a KV cache grown by cat

TORCH_COMPILE_FUSION = Fix(
    text="Compile the model with torch.compile: Inductor fuses each chain of element-wise, "
         "reduction and normalisation ops into one Triton kernel that reads and writes memory once.",
    code="model = torch.compile(model)",
    doc=fixes.TORCH_COMPILE_DOC,
)
TORCH_COMPILE_GRAPHED = Fix(
    text="Compile the model with torch.compile in \"reduce-overhead\" mode: Inductor fuses the "
         "element-wise chains, and the step is replayed as a CUDA graph, so its launch gaps go too "
         "(needs static shapes).",
    code="model = torch.compile(model, mode=\"reduce-overhead\")",
    doc=fixes.TORCH_COMPILE_DOC,
)
TORCH_STATIC_KV_CACHE = Fix(
    text="Preallocate the KV cache and write each new token in place instead of growing it with "
         "torch.cat, which copies the whole cache at every step.",
    code="cache = torch.empty(batch, heads, max_len, head_dim, device=\"cuda\", dtype=torch.bfloat16)\n"
         "cache[:, :, pos:pos + n] = new_kv   # instead of cache = torch.cat([cache, new_kv], dim=2)\n"
         "# Hugging Face: model.generate(..., cache_implementation=\"static\")",
    doc="https://huggingface.co/docs/transformers/kv_cache",
)
TORCH_GRAPH_BREAKS = Fix(
    text="Find the graph breaks that leave these ops outside the compiled regions and remove them.",
    code="explanation = torch._dynamo.explain(model)(*example_inputs)\n"
         "print(explanation.break_reasons)\n"
         "# or run with TORCH_LOGS=\"graph_breaks\"",
    doc=fixes.TORCH_COMPILE_DOC,
)
_CAT_KERNEL = "CatArrayBatchedCopy"


@dataclass
class Unfused:
    """The primary GPU's chained eager kernels inside the steps."""

    chain_ps: int
    chain_count: int
    memory_bound_ps: int            # every eager memory-bound kernel, chained or not
    kernel_ps: int                  # every compute kernel
    kernel_count: int
    median_kernel_us: float
    cat_ps: int                     # chained concatenation kernels (a KV cache grown by torch.cat)
    compiled: bool                  # the model runs under torch.compile (_compiled)
    evidence: list[Evidence]


def _fused_chains(model: SessionModel) -> Scenario:
    """The fix as a replay: every chained kernel FUSION_SPEEDUP times faster."""
    return Scenario(faster={"unfused": FUSION_SPEEDUP})


def _compiled(dev: DeviceActivity, inside: np.ndarray, memory_bound_ps: int) -> bool:
    """Whether the model already runs under torch.compile: Inductor's Triton kernels hold at least
    COMPILED_SHARE of the memory-bound work (theirs and ATen's eager kernels').  A few compiled
    helpers in an eager model (a sampler, a loss) do not make the model compiled."""
    inductor_ps = int(dev.dur_ps[inside & kernels.named_events(dev, "inductor", pytorch.is_inductor_kernel)].sum())
    return inductor_ps > 0 and inductor_ps >= COMPILED_SHARE * (inductor_ps + memory_bound_ps)


def _top(keys: np.ndarray, durations: np.ndarray, labels: list[str], kind: str, detail: str,
         analysis: Analysis, dev: DeviceActivity) -> list[Evidence]:
    """The TOP keys (LABELS' indices) by chained time, per step."""
    return [Evidence(kind, labels[key], round(analysis.ms_per_step(ps), 3), "ms/step",
                     detail=f"{count / analysis.steps_count:.1f} {detail} per step", device=dev.device.name,
                     host=dev.device.host, tool="kernel_stats")
            for key, ps, count in kernels.top_by_time(keys, durations, TOP)]


def measure(analysis: Analysis, dev: DeviceActivity) -> Unfused:
    cls = kernels.classify(dev)
    inside = kernels.in_steps(dev, analysis.model)
    compute = cls.kernel & inside
    chained = kernels.unfused_chains(dev) & inside
    memory_bound = compute & kernels.named_events(dev, "eager_memory_bound", pytorch.is_eager_memory_bound_kernel)
    cat = chained & kernels.named_events(dev, "cat_kernel", lambda name: _CAT_KERNEL in name)
    op_of, op_names = kernels.op_column(dev)
    rows = np.flatnonzero(chained)
    linked = rows[op_of[rows] >= 0]
    evidence = _top(op_of[linked], dev.dur_ps[linked], op_names, "op", "chained kernels launched", analysis, dev)
    evidence += _top(dev.name[rows], dev.dur_ps[rows], dev.names, "kernel", "launches", analysis, dev)
    durations = dev.dur_ps[compute]
    return Unfused(int(dev.dur_ps[chained].sum()), int(rows.size), int(dev.dur_ps[memory_bound].sum()),
                   int(durations.sum()), int(durations.size),
                   float(np.median(durations)) / PS_PER_US if durations.size else 0.0,
                   int(dev.dur_ps[cat].sum()), _compiled(dev, inside, int(dev.dur_ps[memory_bound].sum())), evidence)


@register(CHECK_ID, "Unfused element-wise kernels", __doc__,
          what_if=Replayed(_fused_chains, what=f"chains of small eager element-wise kernels {FUSION_SPEEDUP:.0f}x "
                                               "faster (fused by torch.compile)"),
          aspect="kernels", explains="device compute", explains_order=3,
          compared=Compared("unfused_percent", "unfused_ms_per_step"), frameworks=(pytorch.FRAMEWORK,),
          marks=NoMarks("its share is a share of kernel time in unfused chains, not idle intervals"))
def check(analysis: Analysis) -> Finding:
    primary = analysis.breakdown.primary
    dev = analysis.primary_device
    if analysis.breakdown.device_kind != "gpu" or primary is None or dev is None:
        return needs_gpu(CHECK_ID, "kernels")
    if not analysis.steps_count:
        return needs_steps(CHECK_ID, "Unfused kernels", "chained kernel time")
    m = measure(analysis, dev)
    duration = int(np.sum(primary.duration))
    busy = 100.0 * int(np.sum(primary.busy)) / duration if duration else 0.0
    paced = analysis.model.steps.paced_by == "device"
    percent = 100.0 * m.chain_ps / duration if duration else 0.0
    chain_ms = analysis.ms_per_step(m.chain_ps)
    saving = analysis.what_if.saving_ms(CHECK_ID)
    metrics = {"unfused_percent": round(percent, 2), "unfused_ms_per_step": round(chain_ms, 3),
               "unfused_kernels_per_step": round(m.chain_count / analysis.steps_count, 1),
               "memory_bound_percent": round(100.0 * m.memory_bound_ps / m.kernel_ps, 2) if m.kernel_ps else 0.0,
               "busy_percent": round(busy, 2), "kernels_per_step": round(m.kernel_count / analysis.steps_count, 1),
               "median_kernel_us": round(m.median_kernel_us, 2)}
    where = (f"{dev.device.name} spends {percent:.1f}% of step time ({chain_ms:.2f} ms of a "
             f"{analysis.mean_step_ms:.2f} ms step) in {metrics['unfused_kernels_per_step']:.0f} small eager "
             f"element-wise, copy, reduction and normalisation kernels per step that run back to back")
    if not m.chain_ps:
        return Finding(CHECK_ID, Severity.OK, "No chains of small element-wise kernels",
                       f"{dev.device.name} runs no two small eager element-wise kernels in a row inside the steps.",
                       metrics, round(saving, 3), m.evidence, [])
    if m.compiled:
        severity = Severity.INFO if percent >= WARNING else Severity.OK
        return Finding(CHECK_ID, severity, "torch.compile is in use" + (
            f"; {percent:.0f}% of the step still runs eager element-wise chains" if severity is Severity.INFO else ""),
            f"The model already runs under torch.compile (Inductor's Triton kernels). {where}: ops outside the "
            "compiled regions, such as code after a graph break.", metrics, round(saving, 3), m.evidence,
            [TORCH_GRAPH_BREAKS] if severity is Severity.INFO else [])
    if not paced and busy < BUSY_MIN:
        return Finding(CHECK_ID, Severity.OK, f"GPU idle most of the step ({busy:.0f}% busy)",
                       f"{where}, but the GPU is busy only {busy:.0f}% of the step: what it waits for (launches, "
                       "input, host work) comes first, and the other findings say what that is.",
                       metrics, round(saving, 3), m.evidence, [])
    severity = analysis.gated(severity_by_threshold(percent, None, WARNING), saving)
    pace = "the GPU paces the steps" if paced else f"the GPU is busy {busy:.0f}% of the step"
    summary = (f"{where}; {pace}, so their time is the step's. Each of them reads its inputs from GPU memory and "
               f"writes its output back; fused, a chain would cross memory once. A replay of the step with "
               f"those chains {FUSION_SPEEDUP:.0f}x faster predicts it {saving:.2f} ms shorter.")
    if severity is Severity.OK:
        return Finding(CHECK_ID, Severity.OK, f"Element-wise chains take {percent:.0f}% of step time",
                       summary, metrics, round(saving, 3), m.evidence, [])
    launch_bound = primary.percent("launch") >= LAUNCH_WARNING_PERCENT
    remedies = [TORCH_COMPILE_GRAPHED if launch_bound else TORCH_COMPILE_FUSION]
    if m.cat_ps >= CAT_SHARE * m.chain_ps and not _training(analysis):
        remedies.append(TORCH_STATIC_KV_CACHE)
    return Finding(CHECK_ID, severity, f"Unfused element-wise kernels take {percent:.0f}% of step time",
                   summary + analysis.gain_note(severity, saving), metrics, round(saving, 3), m.evidence, remedies,
                   confidence="medium", confidence_reasons=[
                       f"how far the chains fuse depends on the code (graph breaks, dynamic shapes); the "
                       f"{FUSION_SPEEDUP:.0f}x of chained kernels is assumed, not measured."])


def _training(analysis: Analysis) -> bool:
    """Whether the primary host runs backward or optimizer work (no KV cache to preallocate there)."""
    host = analysis.primary_host
    return host is not None and bool(kernels.named_events(host.activity, "training_work",
                                                          pytorch.is_training_work).any())
