"""host_overhead: do Python, callbacks or eager ops leave the device idle?

## What it measures
``other_idle_percent``: the share of step time during which the device was idle while the
host was neither waiting on input nor launching work for it, i.e. running Python, Keras
callbacks and metrics, ops outside ``tf.function``, host-side conditionals such as dynamic
loss scaling checks, or nothing at all between steps. On CPU-only captures it is step
time covered by neither framework ops, the runtime's threads running the graph (and the
graph calls, when the tracer recorded no op), JAX's program calls, nor input waits, and it
is said of the CPU (there is no device to idle). Measured on the primary device.
The evidence lists the host activities that overlapped those gaps the most, the longest
gaps with their time range, and the steps that lost the most time.

## Why it matters
Every millisecond the host spends between launches is a millisecond the GPU does
nothing; with a fast GPU this host work often dominates the step. Critical at 15% of
step time or more, warning from 3%.

## How to fix
Run several steps per call (``steps_per_execution``), give GPU launches their own
threads (``TF_GPU_THREAD_MODE=gpu_private``), call callbacks and compute metrics less
often, keep the whole step (and in custom loops, the loop itself) inside ``tf.function``,
and replace dynamic loss scaling by a fixed scale when its checks show up between steps.

GPU idle time behind framework ops computing on the host is op_placement's, and step time
the device's trace does not cover is never counted as idle: when the GPU ran the model but its
trace is empty, the check does not apply. When the model ran on the CPU beside an unused GPU,
placement comes first (op_placement) and this finding is at most info. A JAX step that calls
many programs runs op by op: jax.jit is then its first fix.

Savings model: a replay of the step's dependency graph (attribution/replay.py) with the
other-host time removed from the host's timeline: device work released after it moves
earlier, device work queued anyway does not.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tb_gpuadvisor.checks import fixes
from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.attribution.replay import Scenario
from tb_gpuadvisor.checks.graph_fixes import graph_remedies
from tb_gpuadvisor.checks.helper_frames import helper_overhead, user_syncs
from tb_gpuadvisor.checks.sync_stalls import idle_gaps, stall_evidence, stall_sentence, sync_stalls
from tb_gpuadvisor.checks.base import (
    Marks,
    Compared, Finding, Severity, Replayed, needs_steps, register, severity_by_threshold,
)
from tb_gpuadvisor.checks.finding import ACTIONABLE, Evidence, Fix
from tb_gpuadvisor.model import intervals as iv
from tb_gpuadvisor.model.intervals import Intervals
from tb_gpuadvisor.model.kernels import named_events
from tb_gpuadvisor.timeline import PS_PER_MS, HostActivity
from tb_gpuadvisor.kinds import HostEventKind
from tb_gpuadvisor.vocab import jax, pytorch, tensorflow

CHECK_ID = "host_overhead"
CRITICAL, WARNING = 15.0, 3.0
TOP = 5

# Host events that explain nothing about a gap: markers and whole-function wrappers span the
# entire step, launches and input waits are attributed to other checks.
_NOT_CULPRITS = (HostEventKind.STEP_MARKER, HostEventKind.FUNCTION, HostEventKind.EXECUTOR,
                 HostEventKind.LAUNCH, HostEventKind.INPUT_WAIT, HostEventKind.INPUT_STAGE,
                 HostEventKind.MEMORY, HostEventKind.SCOPE)
# Events that wrap work rather than do it: a gap they alone cover holds no recorded host work.
_WRAPPERS = (HostEventKind.STEP_MARKER, HostEventKind.FUNCTION, HostEventKind.SCOPE)
# Above this share of the gaps inside a phase annotation with no work recorded, "the host was
# busy" is a guess.
UNRECORDED_SHARE = 0.5


def _jax_host_work(syncs: bool) -> Fix:
    """JAX's "keep host work out of the loop"; SYNCS names block_until_ready among the read-backs
    (not when the only calls in the capture are the profiling helper's own)."""
    readbacks = "float(loss), print, .block_until_ready()" if syncs else "float(loss), print"
    return Fix(
        text=f"Keep host work out of the step loop: do not read results back every step ({readbacks}); "
             "log every N steps so dispatch can run ahead of the device.",
        code="for step, batch in enumerate(batches):\n"
             "    state, loss = train_step(state, batch)\n"
             "    if step % 100 == 0:\n"
             "        print(step, float(loss))   # the only host sync",
        doc=fixes.JAX_GPU_TIPS)


FEWER_CALLBACKS = fixes.Remedy(
    text="Do less per-step work in callbacks and metrics: log to TensorBoard per epoch, drop "
         "metrics you do not need during training, avoid .numpy() or print in the step.",
    code="tensorboard = keras.callbacks.TensorBoard(log_dir, update_freq='epoch')\n"
         "model.compile(optimizer=optimizer, loss=loss, metrics=['accuracy'])  # only what you read",
    doc=fixes.GPU_PERF_GUIDE,
    jax=_jax_host_work(syncs=True), pytorch=fixes.TORCH_NO_HOST_SYNC,
)

STATIC_LOSS_SCALE = fixes.Remedy(
    text="The step runs dynamic loss scaling, whose finite-check and conditional update add host "
         "work every step; a fixed loss scale removes it (or use bfloat16, which needs none).",
    code="optimizer = keras.mixed_precision.LossScaleOptimizer(\n"
         "    keras.optimizers.Adam(), dynamic=False, initial_scale=1024)",
    doc=fixes.MIXED_PRECISION_GUIDE,
    jax=Fix(
        text="The step runs dynamic loss scaling, whose finite-check and conditional update add "
             "work every step; bfloat16 needs no loss scaling at all.",
        code="x = x.astype(jnp.bfloat16)   # bf16 activations: no loss scale to check",
        doc=fixes.JAX_GPU_TIPS),
)

# PyTorch's memory notes: the caching allocator, empty_cache, PYTORCH_CUDA_ALLOC_CONF (ROCm reads
# PYTORCH_HIP_ALLOC_CONF, the HIP notes say).
TORCH_MEMORY_DOC = "https://pytorch.org/docs/stable/notes/cuda.html#memory-management"
# Allocator calls holding at least this share of the host-overhead idle time are its cause.
ALLOCATOR_SHARE = 0.5

_KEEP_ALLOCATOR_CACHE = Fix(
    text="Device memory is allocated and freed through the driver inside the step, and freeing "
         "waits for the GPU: PyTorch's caching allocator is being bypassed or emptied. Do not call "
         "torch.cuda.empty_cache() in the loop, unset PYTORCH_NO_CUDA_MEMORY_CACHING, keep tensor "
         "shapes stable from step to step, and let the allocator grow its segments instead of "
         "returning them (expandable_segments; PYTORCH_HIP_ALLOC_CONF on ROCm).",
    code="# shell: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py\n"
         "#        (ROCm: PYTORCH_HIP_ALLOC_CONF=expandable_segments:True; PYTORCH_NO_CUDA_MEMORY_CACHING unset)\n"
         "for x, y in loader:\n"
         "    train_step(x, y)          # no torch.cuda.empty_cache() inside the loop",
    doc=TORCH_MEMORY_DOC)
# Only PyTorch's vocabulary marks allocator calls, so the remedy has no TensorFlow or JAX form.
KEEP_ALLOCATOR_CACHE = fixes.Remedy(_KEEP_ALLOCATOR_CACHE.text, _KEEP_ALLOCATOR_CACHE.code,
                                    TORCH_MEMORY_DOC, tensorflow=False, pytorch=_KEEP_ALLOCATOR_CACHE)


def allocator_note(activity: HostActivity, gaps: Intervals, steps: int) -> str:
    """A sentence naming the driver allocator calls (cudaFree, hipFree, ...) when they fill most of
    the GAPS, empty otherwise: the host then stalls in memory management, not in Python."""
    calls = (activity.kind == HostEventKind.ALLOCATOR) & (activity.step >= 0)
    if not calls.any() or not gaps[0].size:
        return ""
    inside = iv.overlap(iv.union(activity.start_ps[calls], activity.end_ps[calls]), gaps)
    share = inside / max(iv.total(gaps), 1)
    if share < ALLOCATOR_SHARE:
        return ""
    rows = np.flatnonzero(calls)
    per_name = np.bincount(activity.name[rows], weights=activity.dur_ps[rows], minlength=len(activity.names))
    top = int(np.argmax(per_name))
    count = int(np.count_nonzero(activity.name[rows] == top))
    return (f" {100 * share:.0f}% of that idle time the host sat in memory allocation calls: "
            f"{activity.names[top]} ({count / steps:.0f} calls and {per_name[top] / PS_PER_MS / steps:.1f} ms per "
            "step) blocks the host until the device drains, so the caching allocator is being bypassed "
            "or emptied.")


def unrecorded_share(activity: HostActivity, gaps: Intervals) -> float:
    """Share of GAPS that lies inside a phase annotation of the program ("## backward ##", a
    record_function scope) while the host trace holds no work there, only wrappers.  Inside a phase
    the profiler records every op the host runs, so an empty stretch means the host waited on
    something untraced (another rank, a sync) or its events were filtered out of the trace.  Gaps
    outside any phase are left alone: untraced Python looks like that."""
    total = iv.total(gaps)
    scopes = activity.kind == HostEventKind.SCOPE
    if not total or not scopes.any():
        return 0.0
    work = ~activity.mask(*_WRAPPERS)
    scoped = iv.intersect(iv.union(activity.start_ps[scopes], activity.end_ps[scopes]), gaps)
    empty = iv.subtract(scoped, iv.union(activity.start_ps[work], activity.end_ps[work]))
    return iv.total(empty) / total


def culprits(activity: HostActivity, gaps: Intervals, steps: int, top: int = TOP,
             idle: str = "the device was idle", kinds: tuple[HostEventKind, ...] = ()) -> list[Evidence]:
    """Host events (by thread and name) with the most time inside the gaps (while IDLE); only
    events of KINDS when given."""
    if not gaps[0].size:
        return []
    wanted = activity.mask(*kinds) if kinds else ~activity.mask(*_NOT_CULPRITS)
    near = iv.may_overlap(gaps, activity.start_ps, activity.end_ps)    # a cheap filter first
    candidates = np.flatnonzero(near & wanted & ~helper_overhead(activity))
    if not candidates.size:
        return []
    overlap = iv.per_bin_total(gaps, activity.start_ps[candidates], activity.end_ps[candidates])
    hit = overlap > 0
    candidates, overlap = candidates[hit], overlap[hit]
    if not candidates.size:
        return []
    key = activity.thread[candidates].astype(np.int64) * len(activity.names) + activity.name[candidates]
    uniq, inverse = np.unique(key, return_inverse=True)
    sums = np.bincount(inverse, weights=overlap)
    order = np.argsort(-sums, kind="stable")[:top]
    out = []
    for i in order:
        thread, name = divmod(int(uniq[i]), len(activity.names))
        out.append(Evidence(kind="thread", name=activity.names[name],
                            value=round(sums[i] / PS_PER_MS / steps, 3), unit="ms/step",
                            detail=f"on thread {activity.threads[thread]} while {idle}",
                            host=activity.host, tool="trace_viewer@"))
    return out


# An un-jitted JAX step calls a program per jax.numpy op (PjitFunction(matmul), (tanh), ...); a
# jitted one calls its step and perhaps device_put's "stage": this many distinct programs or more
# in the steps is a step run op by op.
OP_BY_OP_PROGRAMS = 4


def op_by_op_programs(analysis: Analysis) -> list[str]:
    """The distinct JAX programs the steps call when they are that many (the step runs op by op,
    and jax.jit is the first fix), else none."""
    if analysis.model.framework != jax.FRAMEWORK:
        return []
    for host in analysis.model.hosts:
        act = host.activity
        calls = named_events(act, "jax_call", jax.FUNCTION.match) & (act.step >= 0)
        names, counts = np.unique(act.name[calls], return_counts=True)
        if names.size >= OP_BY_OP_PROGRAMS:
            return [act.names[int(i)] for i in names[np.argsort(-counts, kind="stable")]]
    return []


def uses_dynamic_loss_scale(analysis: Analysis) -> bool:
    names = [n for host in analysis.model.hosts for n in host.activity.names]
    names += [o for dev in analysis.model.devices for o in dev.ops]
    return any(tensorflow.LOSS_SCALE.search(n) for n in names)


@register(CHECK_ID, "Host overhead between launches", __doc__,
          what_if=Replayed(lambda model: Scenario(idle={"other_host": 1.0}), on_cpu=True,
                           what="device idle time while the host ran other work removed"),
          explains="host", explains_order=2, compared=Compared("other_idle_percent", "other_idle_ms_per_step"),
          marks=Marks(("other_host",), "other_idle_percent"))
def check(analysis: Analysis) -> Finding:
    breakdown = analysis.breakdown
    primary = breakdown.primary
    if primary is None or not analysis.steps_count:
        return needs_steps(CHECK_ID, "Host overhead", "host gaps")
    if analysis.trust.placement.where == "gpu_trace_lost":
        # The GPU ran the model but its trace is empty: the CPU breakdown stands in for the
        # steps, and its "idle" time says nothing of when the GPU waited.
        return Finding(CHECK_ID, Severity.NOT_APPLICABLE, "GPU idle time not measurable",
                       "The GPU ran the model but its trace is empty (see the profile quality finding), so "
                       "when it sat idle while the host ran Python, callbacks or other work cannot be measured.")
    percent = primary.percent("other_host")
    other_ms = analysis.ms_per_step(primary.total("other_host"))
    saving = analysis.what_if.saving_ms(CHECK_ID)
    severity = analysis.gated(severity_by_threshold(percent, CRITICAL, WARNING), saving)
    # The model ran on the CPU beside an unused GPU: placement is the fix (op_placement), and the
    # host's share of a CPU run says little of the GPU run that fix makes.
    placed_first = analysis.trust.placement.where == "host_despite_gpu" and severity in ACTIONABLE
    if placed_first:
        severity = Severity.INFO
    host = analysis.primary_host
    loss_scale = uses_dynamic_loss_scale(analysis)
    on_cpu = breakdown.device_kind == "cpu"
    # Without an accelerator the CPU is what waits: for the step's ops, not for launches.
    idle = "no op of the step ran on the CPU" if on_cpu else f"{primary.name} sat idle"
    busy = "input" if on_cpu else "input or kernel launches"

    summary = (f"In {percent:.1f}% of step time ({other_ms:.2f} ms of a {analysis.mean_step_ms:.2f} ms step) "
               f"{idle} while the host was busy with something other than {busy}: "
               f"Python code, callbacks, metrics, ops run outside "
               f"{fixes.compiled_step(analysis.model.framework)}, or gaps between steps.")
    allocator = allocator_note(host.activity, primary.sets["other_host"], analysis.steps_count)
    summary += allocator
    stalls = (sync_stalls(host.activity, idle_gaps(primary.sets))
              if analysis.model.framework == pytorch.FRAMEWORK and not on_cpu else [])
    summary += stall_sentence(stalls, analysis.steps_count)
    if loss_scale:
        summary += " The step uses dynamic loss scaling, whose checks run every step."
    programs = op_by_op_programs(analysis)
    if programs:
        summary += (f" The step runs op by op: it calls {len(programs)} programs ({', '.join(programs[:3])}, ...), "
                    "each traced and dispatched from Python; compiled with jax.jit it is one.")
    if placed_first:
        summary += (" The model ran on the CPU beside an unused GPU: place it on the GPU first (see the op "
                    "placement finding); this share describes the CPU run.")
    else:
        summary += analysis.gain_note(severity, saving)
    if severity is Severity.OK:
        title = f"Little host overhead ({percent:.1f}% of step time)"
    elif on_cpu:
        title = f"Host overhead takes {percent:.1f}% of the CPU's step time"
    else:
        title = f"Host overhead idles the device {percent:.1f}% of step time"

    evidence = culprits(host.activity, primary.sets["other_host"], analysis.steps_count,
                        idle="no op of the step ran" if on_cpu else "the device was idle")
    evidence = stall_evidence(stalls, analysis.steps_count, primary.name, primary.host) + evidence
    if allocator:       # the calls themselves first: the frames around them name no cause
        evidence = culprits(host.activity, primary.sets["other_host"], analysis.steps_count,
                            top=2, kinds=(HostEventKind.ALLOCATOR,)) + evidence
    evidence += analysis.gap_evidence(primary.sets["other_host"],
                                      "no op running, host busy elsewhere" if on_cpu else "device idle, host busy elsewhere",
                                      device=primary.name, host=primary.host)
    evidence += analysis.step_evidence(primary.part("other_host"), "host overhead in this step",
                                       device=primary.name, host=primary.host)

    fewer = FEWER_CALLBACKS
    if helper_overhead(host.activity).any() and not user_syncs(host.activity):
        fewer = dataclasses.replace(FEWER_CALLBACKS, jax=_jax_host_work(syncs=False))
    fix_list = [fixes.STEPS_PER_EXECUTION, fixes.GPU_PRIVATE_THREADS, fewer, *graph_remedies(analysis)]
    if loss_scale:
        fix_list.insert(0, STATIC_LOSS_SCALE)
    if programs:
        fix_list = [fixes.TF_FUNCTION, *(f for f in fix_list if f is not fixes.TF_FUNCTION)]
    if stalls:
        fix_list.insert(0, fixes.TORCH_NO_HOST_SYNC)
    if allocator:
        fix_list.insert(0, KEEP_ALLOCATOR_CACHE)
    if on_cpu:
        fix_list.remove(fixes.GPU_PRIVATE_THREADS)
    unrecorded = unrecorded_share(host.activity, primary.sets["other_host"])
    doubt = []
    if unrecorded > UNRECORDED_SHARE and severity in ACTIONABLE:
        doubt = [f"the trace records no host activity in {100 * unrecorded:.0f}% of this idle time: the "
                 "GPU may wait on another rank, an untraced sync, or events a trace filter removed"]
        summary += f" But {doubt[0]}."
    return Finding(
        check=CHECK_ID, severity=severity, title=title, summary=summary,
        confidence="low" if doubt else "high", confidence_reasons=doubt,
        metrics={"other_idle_percent": round(percent, 2), "other_idle_ms_per_step": round(other_ms, 3)},
        estimated_savings_ms_per_step=saving, evidence=evidence,
        fixes=fix_list if severity is not Severity.OK else [],
    )
