"""profile_quality: can this capture be trusted, and what kind of capture is it?

## What it measures
Problems that make the other findings less reliable, each reported with its fix:
host files that could not be read; no training steps found (or steps only inferred from
repeated function runs); GPU planes without any events (the CUDA profiling library,
CUPTI, was not found or the user lacks permission to profile); fewer than 3 steps (too
few to average); a first step more than twice as slow as the median (warm-up or tracing
captured); more than 10 steps (the guides warn that long traces blow up memory); dropped
events or warnings written by the profiler. The summary also says what was captured:
how many GPUs (and how many of them ran kernels), TPUs, or the host CPU only.

## Why it matters
Every other check divides by step time and reads device activity. A capture without GPU
events makes a GPU job look like a CPU job; a warm-up step inflates every average; one or
two steps are noise. Warning when the analysis is degraded, info for notes that do not
change the numbers, ok otherwise.

## How to fix
Make CUPTI visible (``LD_LIBRARY_PATH``) and allow non-admin profiling
(``NVreg_RestrictProfilingToAdminUsers=0``); profile a window of 3-10 steps after
warm-up (``profile_batch=(10, 15)``); mark steps in custom loops with
``tf.profiler.experimental.Trace("train", step_num=step, _r=1)``.

Savings model: none (0 ms); this check is about the measurement, not the program.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.checks.base import Evidence, Finding, Fix, Severity, register
from tb_gpuadvisor.checks.fixes import JAX_PROFILING_GUIDE, JAX_STEP_ANNOTATION, Remedy
from tb_gpuadvisor.model.timeline import PS_PER_MS

CHECK_ID = "profile_quality"
MIN_STEPS, MAX_STEPS = 3, 10
WARMUP_RATIO = 2.0
PROFILER_GUIDE = "https://www.tensorflow.org/guide/profiler"
_SOURCES = {"custom_loop": "step annotations (events with _r=1 and step_num)", "keras2": "Keras TraceContext markers",
            "keras": "Keras 3 'Profiled batch' markers", "steps_line": "TensorFlow's derived Steps line",
            "inferred": "inferred from repeated function runs",
            "inferred_device": "inferred from repeated XLA program runs on the device",
            "window": "none repeats, so the capture is analysed as one window"}

JAX_CUPTI = Fix(
    text="The GPU trace is empty: the profiler could not use CUPTI. Put CUPTI on the library path "
         "and allow non-admin users to read GPU performance counters (or run the profiler as root / "
         "a container with --cap-add=SYS_ADMIN).",
    code="export LD_LIBRARY_PATH=/usr/local/cuda/extras/CUPTI/lib64:$LD_LIBRARY_PATH\n"
         "# permanently allow profiling for all users, then reboot:\n"
         "echo 'options nvidia NVreg_RestrictProfilingToAdminUsers=0' | \\\n"
         "    sudo tee /etc/modprobe.d/nvidia-profiling.conf",
    doc=JAX_PROFILING_GUIDE,
)
CUPTI = Remedy(JAX_CUPTI.text, JAX_CUPTI.code, PROFILER_GUIDE, jax=JAX_CUPTI)
STEP_WINDOW = Remedy(
    text="Profile a short window of steps after warm-up: skip the first steps (tracing, autotuning, "
         "memory allocation) and keep the window to about 3-10 steps.",
    code="tensorboard = keras.callbacks.TensorBoard(log_dir, profile_batch=(10, 15))\n"
         "model.fit(dataset, epochs=1, callbacks=[tensorboard])",
    doc=PROFILER_GUIDE,
    jax=Fix(
        text="Profile a short window of steps after warm-up: skip the first steps (compilation, "
             "autotuning, memory allocation) and keep the window to about 3-10 steps.",
        code="for step, batch in enumerate(batches):\n"
             "    if step == 10: jax.profiler.start_trace(log_dir)\n"
             "    with jax.profiler.StepTraceAnnotation('train', step_num=step):\n"
             "        state, loss = train_step(state, batch)\n"
             "    if step == 15: loss.block_until_ready(); jax.profiler.stop_trace()",
        doc=JAX_PROFILING_GUIDE),
)
STEP_MARKERS = Remedy(
    text="Mark each training step so the profiler can group events into steps.",
    code="for step, (x, y) in enumerate(dataset):\n"
         "    with tf.profiler.experimental.Trace('train', step_num=step, _r=1):\n"
         "        train_step(x, y)",
    doc=PROFILER_GUIDE,
    jax=JAX_STEP_ANNOTATION,
)


@dataclass
class Issue:
    severity: Severity
    title: str
    text: str
    fix: Fix | None = None
    evidence: list[Evidence] = field(default_factory=list)


def capture_kind(analysis: Analysis) -> tuple[str, str]:
    """(kind, sentence): what the capture holds."""
    model = analysis.model
    gpus, active = model.gpus, model.active_gpus
    tpus = [d for d in model.devices if d.device.kind == "tpu"]
    hosts = len(model.hosts)
    where = f"{hosts} host{'s' if hosts != 1 else ''}"
    if gpus:
        vendors = sorted({d.device.vendor for d in gpus if d.device.vendor})
        vendor = f" {'/'.join(vendors)}" if vendors else ""
        if not active:
            return "gpu_empty", f"a capture of {len(gpus)}{vendor} GPU(s) on {where} with no GPU kernels recorded"
        return "gpu", f"a GPU capture: {len(active)} of {len(gpus)}{vendor} GPU(s) ran kernels, on {where}"
    if tpus:
        return "tpu", (f"a TPU capture ({len(tpus)} TPU(s) on {where}); the GPU checks do not apply, "
                       "the step-level checks still do")
    return "cpu", f"a CPU-only capture on {where} (no accelerator planes); the host is analysed as the device"


def _issues(analysis: Analysis, kind: str) -> list[Issue]:
    model = analysis.model
    steps = model.steps
    n = len(steps)
    issues: list[Issue] = []
    if model.errors:
        issues.append(Issue(Severity.WARNING, f"{len(model.errors)} host file(s) unreadable",
                            "Some host files could not be read: "
                            + "; ".join(f"{e.get('host')}: {e.get('message')}" for e in model.errors)
                            + ". Findings cover the other hosts only."))
    if kind == "gpu_empty":
        issues.append(Issue(Severity.WARNING, "Empty GPU trace",
                            "The capture has GPU planes but not a single kernel or copy on them, which "
                            "happens when CUPTI is missing or the user may not profile the GPU. Everything "
                            "below is measured on the host only.", CUPTI,
                            [Evidence(kind="device", name=d.device.name, value=len(d), unit="events",
                                      host=d.device.host) for d in model.gpus]))
    if n == 0:
        issues.append(Issue(Severity.WARNING, "No training steps found",
                            "No step markers and no repeated function runs were found, so no per-step "
                            "numbers can be computed.", STEP_MARKERS))
        return issues
    if steps.source.startswith("inferred"):
        issues.append(Issue(Severity.INFO, "Steps inferred",
                            f"Steps were inferred from repeated runs of {steps.marker_name or 'a function'}, "
                            "not from step markers.", STEP_MARKERS))
    durations = steps.duration_ps
    if n < MIN_STEPS:
        issues.append(Issue(Severity.WARNING, f"Only {n} step{'s' if n != 1 else ''} captured",
                            f"Only {n} step(s) were captured; averages over so few steps are noisy and a "
                            "single slow step dominates them.", STEP_WINDOW))
    else:
        median = float(np.median(durations[1:]))
        ratio = float(durations[0]) / median if median else 0.0
        if ratio >= WARMUP_RATIO:
            issues.append(Issue(
                Severity.WARNING, "Warm-up step captured",
                f"The first step took {durations[0] / PS_PER_MS:.2f} ms, {ratio:.1f}x the median of the "
                "others: it probably includes tracing or warm-up, which skews every average.", STEP_WINDOW,
                analysis.step_evidence(np.where(np.arange(n) == 0, durations, 0), "first step, much slower "
                                       "than the median", top=1)))
    if n > MAX_STEPS:
        issues.append(Issue(Severity.INFO, f"{n} steps captured",
                            f"{n} steps were profiled; more than about {MAX_STEPS} makes traces large enough to "
                            "exhaust memory when captured or viewed, with nothing gained.", STEP_WINDOW))
    dropped = sum(h.dropped_events for h in model.hosts)
    if dropped or model.warnings:
        text = f"The profiler dropped {dropped} events." if dropped else "The profiler reported problems."
        if model.warnings:
            text += " " + "; ".join(model.warnings[:3])
        issues.append(Issue(Severity.WARNING, "Profiler dropped events or warned",
                            text + " Time in the missing events is counted as idle.", STEP_WINDOW))
    return issues


@register(CHECK_ID, "Profile quality", __doc__)
def check(analysis: Analysis) -> Finding:
    model = analysis.model
    kind, what = capture_kind(analysis)
    issues = _issues(analysis, kind)
    severity = max((i.severity for i in issues), key=lambda s: s.weight, default=Severity.OK)
    durations = model.steps.duration_ps
    ratio = (float(durations[0]) / float(np.median(durations[1:]))
             if durations.size >= MIN_STEPS and np.median(durations[1:]) else None)
    summary = f"This is {what}."
    if model.steps.source != "none":
        n = len(model.steps)
        summary += (f" {n} step{' was' if n == 1 else 's were'} found "
                    f"({_SOURCES.get(model.steps.source, model.steps.source)}).")
    summary += (" " + " ".join(i.text for i in issues)) if issues else " Nothing in it limits the analysis."
    worst = [i for i in issues if i.severity is severity]
    title = ("; ".join(i.title for i in worst) if issues and severity is not Severity.OK
             else "Capture is complete and usable")
    fix_list: list[Fix] = []
    for issue in sorted(issues, key=lambda i: -i.severity.weight):
        if issue.fix is not None and issue.fix not in fix_list:
            fix_list.append(issue.fix)
    return Finding(
        check=CHECK_ID, severity=severity, title=title, summary=summary,
        metrics={"capture_kind": kind, "steps_count": len(model.steps), "step_source": model.steps.source,
                 "gpu_count": len(model.gpus), "active_gpu_count": len(model.active_gpus),
                 "dropped_events": sum(h.dropped_events for h in model.hosts),
                 "first_step_ratio": round(ratio, 2) if ratio is not None else None},
        estimated_savings_ms_per_step=0.0,
        evidence=[e for i in issues for e in i.evidence],
        fixes=fix_list,
    )
