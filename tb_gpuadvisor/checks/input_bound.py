"""input_bound: is the input pipeline the bottleneck?

## What it measures
``input_percent``: the share of step time during which the device had nothing to run
while the training loop was waiting for its next batch from tf.data
(``IteratorGetNextOp::DoCompute``). Only waits that are not overlapped by device work
count: a wait during which the GPU is still busy with the previous step costs nothing.
On CPU-only captures it is the time the training threads spend in those waits.
Measured on the primary device (the first active GPU, or the host).

The evidence names the slowest tf.data stage, the ``Iterator::...`` event with the
longest self time (its own time minus the time of the stages it pulls from), and says
whether the pipeline prefetches and runs its map functions in parallel.

## Why it matters
A GPU waiting on input does no work at all, whatever the model. The Profiler guides
tell users to rule out an input bottleneck first, before tuning anything on the device.
Critical at 20% of step time or more, warning from 5%.

## How to fix
Overlap input with training (``prefetch(tf.data.AUTOTUNE)``), parallelise and vectorise
preprocessing (``map(..., num_parallel_calls=tf.data.AUTOTUNE)`` after ``batch``),
read files in parallel with ``interleave`` and ``cache()`` what fits in memory. Check
the diagnosis by training on synthetic tensors: if that is not faster, input is not the
problem.

Savings model: a replay of the step's dependency graph (attribution/replay.py) with every
input wait removed from the host's timeline: device work the host released after a wait
moves earlier by the waits before it, so a wait hidden behind device work saves nothing.
Severity also needs the replayed saving to be real time (see ``Analysis.gated``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from tb_gpuadvisor.checks import fixes
from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.checks.base import (
    Evidence, Finding, Severity, needs_steps, register, severity_by_threshold,
)
from tb_gpuadvisor.model import intervals as iv
from tb_gpuadvisor.model.timeline import PS_PER_MS, HostActivity, HostEventKind

CHECK_ID = "input_bound"
CRITICAL, WARNING = 20.0, 5.0

# Stage kinds (the last component of a long stage name, without "[n]" input indices).
# Buffer stages only hand over elements another thread produced; their self time is waiting
# for that producer, so they never count as "the slowest stage" themselves.
_BUFFER_STAGES = frozenset({"Model", "Prefetch", "MaxIntraOpParallelism", "PrivateThreadPool"})
_PARALLEL_STAGES = ("ParallelMap", "MapAndBatch", "ParallelBatch", "ParallelInterleave")
_INPUT_INDEX = re.compile(r"\[\d+\]$")


def stage_kind(long_name: str) -> str:
    """"Iterator::Model::ParallelMapV2::Zip[0]::FlatMap" -> "FlatMap"."""
    return _INPUT_INDEX.sub("", long_name.rsplit("::", 1)[-1])


@dataclass
class Stage:
    name: str
    self_ps: int
    thread: str


@dataclass
class Pipeline:
    """What the capture shows about the tf.data pipeline."""

    stages: list[Stage]          # by self time, longest first
    prefetches: bool
    parallel: bool               # some map/batch/interleave stage runs in parallel
    sequential_map: bool         # a plain Map stage exists

    @property
    def slowest(self) -> Stage | None:
        for stage in self.stages:
            if stage_kind(stage.name) not in _BUFFER_STAGES:
                return stage
        return self.stages[0] if self.stages else None


def pipeline_stages(activity: HostActivity, windows: iv.Intervals) -> Pipeline:
    """Self time of every ``Iterator::...`` stage inside the steps.

    A stage's self time is its time on a thread minus the time its descendants (long
    names extending its own) run nested in it on that same thread.
    """
    mask = activity.kind == HostEventKind.INPUT_STAGE
    idx = np.flatnonzero(mask)
    kinds = {stage_kind(activity.names[i]) for i in np.unique(activity.name[idx])}
    totals: dict[str, tuple[int, str]] = {}
    for thread in np.unique(activity.thread[idx]):
        on_thread = idx[activity.thread[idx] == thread]
        name_ids = activity.name[on_thread]
        thread_names = {int(i): activity.names[int(i)] for i in np.unique(name_ids)}
        for name_id, name in thread_names.items():
            own = on_thread[name_ids == name_id]
            descendant_ids = [i for i, other in thread_names.items()
                              if other.startswith((name + "::", name + "["))]
            children = on_thread[np.isin(name_ids, descendant_ids)]
            own_set = iv.intersect(iv.union(activity.start_ps[own], activity.end_ps[own]), windows)
            child_set = iv.union(activity.start_ps[children], activity.end_ps[children])
            self_ps = iv.total(iv.subtract(own_set, child_set))
            previous, _ = totals.get(name, (0, ""))
            totals[name] = (previous + self_ps, activity.threads[int(thread)])
    stages = sorted((Stage(n, ps, t) for n, (ps, t) in totals.items() if ps > 0),
                    key=lambda s: -s.self_ps)
    return Pipeline(
        stages=stages,
        prefetches=any(k.startswith("Prefetch") for k in kinds),
        parallel=any(k.startswith(_PARALLEL_STAGES) for k in kinds),
        sequential_map=any(k in ("Map", "MapV2") for k in kinds),
    )


def _pipeline_sentence(pipeline: Pipeline, steps: int) -> str:
    if not pipeline.stages:
        return "The capture has no tf.data stage events, so the slow stage cannot be named."
    slowest = pipeline.slowest
    parts = [f"The slowest tf.data stage is {slowest.name} "
             f"({slowest.self_ps / PS_PER_MS / steps:.2f} ms of its own time per step)."]
    if not pipeline.prefetches:
        parts.append("The pipeline does not prefetch, so batches are produced only when asked for.")
    if pipeline.sequential_map and not pipeline.parallel:
        parts.append("Its map function runs on a single thread.")
    return " ".join(parts)


def _fixes(pipeline: Pipeline) -> list:
    ordered = []
    if pipeline.stages and not pipeline.prefetches:
        ordered.append(fixes.PREFETCH)
    if pipeline.stages and not pipeline.parallel:
        ordered.append(fixes.PARALLEL_MAP)
    for fix in (fixes.PREFETCH, fixes.PARALLEL_MAP, fixes.CACHE_AND_INTERLEAVE, fixes.SYNTHETIC_INPUT_TEST):
        if fix not in ordered:
            ordered.append(fix)
    return ordered


@register(CHECK_ID, "Input pipeline bottleneck", __doc__)
def check(analysis: Analysis) -> Finding:
    breakdown = analysis.breakdown
    primary = breakdown.primary
    if primary is None or not analysis.steps_count:
        return needs_steps(CHECK_ID, "Input wait", "the time spent waiting for input")
    percent = primary.percent("input")
    input_ms = analysis.ms_per_step(primary.total("input"))
    saving = analysis.what_if.saving_ms(CHECK_ID)
    severity = analysis.gated(severity_by_threshold(percent, CRITICAL, WARNING), saving)
    host = analysis.primary_host
    windows = iv.union(analysis.model.steps.start_ps, analysis.model.steps.end_ps)
    pipeline = pipeline_stages(host.activity, windows)
    on_cpu = breakdown.device_kind == "cpu"
    who = "the training threads waited" if on_cpu else f"{primary.name} sat idle while the host waited"

    summary = (f"In {percent:.1f}% of step time ({input_ms:.2f} ms of a {analysis.mean_step_ms:.2f} ms step) "
               f"{who} for the next batch from tf.data. ")
    if severity is Severity.OK:
        summary += "The input pipeline keeps up with training."
        title = f"Input pipeline keeps up ({percent:.1f}% of step time waiting)"
    else:
        summary += _pipeline_sentence(pipeline, analysis.steps_count) + analysis.gain_note(severity, saving)
        title = f"Training waits on input {percent:.1f}% of step time"

    evidence: list[Evidence] = []
    for stage in pipeline.stages[:3]:
        evidence.append(Evidence(
            kind="stage", name=stage.name, value=round(stage.self_ps / PS_PER_MS / analysis.steps_count, 3),
            unit="ms/step", detail=f"self time on thread {stage.thread}"
            + ("; waits for the stage feeding it" if stage_kind(stage.name) in _BUFFER_STAGES else ""),
            host=primary.host, tool="input_pipeline_analyzer"))
    if pipeline.stages:
        evidence.append(Evidence(
            kind="stage", name="pipeline", value=len(pipeline.stages), unit="stages",
            detail=f"prefetch: {'yes' if pipeline.prefetches else 'no'}; "
                   f"parallel map/batch: {'yes' if pipeline.parallel else 'no'}",
            host=primary.host, tool="input_pipeline_analyzer"))
    evidence += analysis.step_evidence(primary.input, "waiting for input in this step",
                                       device=primary.name, host=primary.host)

    return Finding(
        check=CHECK_ID, severity=severity, title=title, summary=summary,
        metrics={"input_percent": round(percent, 2), "input_ms_per_step": round(input_ms, 3)},
        estimated_savings_ms_per_step=saving,
        evidence=evidence, fixes=_fixes(pipeline) if severity is not Severity.OK else [],
    )
