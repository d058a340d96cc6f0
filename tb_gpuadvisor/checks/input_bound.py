"""input_bound: is the input pipeline the bottleneck?

## What it measures
``input_percent``: the share of step time during which the device had nothing to run
while the training loop was waiting for its next batch from tf.data
(``IteratorGetNextOp::DoCompute``). Only waits that are not overlapped by device work
count: a wait during which the GPU is still busy with the previous step costs nothing.
On CPU-only captures it is the time the training threads spend in those waits.
Measured on the primary device (the first active GPU, or the host).

The evidence names the slowest tf.data stage, the ``Iterator::...`` event with the
longest self time (its own time minus the time of the stages it pulls from), the ops the
user's dataset functions ran on tf.data's threads (a ``tf.py_function`` shows as
``EagerPyFunc``), and whether the user's code prefetches and maps in parallel, told apart
from what tf.data inserted itself (see ``model/pipeline.py``).

In a PyTorch trace the input time also holds the host preparing the batch in the loop itself
(``attribution.breakdown.cpu_preprocessing``: a ``record_function`` scope or function named for
it, an image processor's or a decoder's frames, launching no kernel). Where that preprocessing
is most of the input time the finding names it (its scopes and frames, ms per step, share of the
step), and its fix moves it into a Dataset that DataLoader workers run ahead of the step (into the
dataset the workers already run, when the loop has some), or onto the GPU. Preprocessing inside a
single-process DataLoader's calls is named as what that DataLoader spends its time in.

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

from dataclasses import dataclass

import numpy as np

from tb_gpuadvisor.checks import fixes
from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.model.pipeline import Pipeline, Stage, pipeline_stages
from tb_gpuadvisor.attribution.breakdown import batch_copies, cpu_preprocessing
from tb_gpuadvisor.attribution.replay import Scenario
from tb_gpuadvisor.checks.base import (
    Marks,
    Compared, Finding, Severity, Replayed, needs_steps, register, severity_by_threshold,
)
from tb_gpuadvisor.checks.finding import Evidence
from tb_gpuadvisor.model import intervals as iv
from tb_gpuadvisor.timeline import JAX, PS_PER_MS, PYTORCH, HostActivity
from tb_gpuadvisor.kinds import HostEventKind

CHECK_ID = "input_bound"
CRITICAL, WARNING = 20.0, 5.0
# The batch's copy calls, or the loop's own preprocessing, holding this share of the input time are
# what it is about (PyTorch).
COPY_SHARE = 0.5
# The preprocessing scopes and frames named in the summary and the evidence.
PREPROCESS_NAMES = 3

def _dataloader_waits(analysis: Analysis) -> list[Evidence]:
    """The PyTorch DataLoader calls the training loop waited in, longest first (ms per step)."""
    host = analysis.primary_host
    act = host.activity
    rows = np.flatnonzero((act.kind == HostEventKind.INPUT_WAIT) & (act.step >= 0))
    totals = np.bincount(act.name[rows], weights=act.dur_ps[rows], minlength=len(act.names))
    steps = analysis.steps_count
    return [Evidence(kind="op", name=act.names[i], value=round(totals[i] / PS_PER_MS / steps, 3), unit="ms/step",
                     detail="the training loop waiting for the DataLoader's next batch"
                     + ("; num_workers=0: batches are loaded in the training process itself"
                        if _in_process(act, act.names[i]) else ""), host=host.name)
            for i in np.argsort(-totals, kind="stable")[:2] if totals[i] > 0]


def _in_process(act: HostActivity, name: str) -> bool:
    """Whether the DataLoader wait NAME loads its batches in the training process (num_workers=0)."""
    stage = act.stages.get(name)
    return stage is not None and stage.in_process


def _dataloader_sentence(waits: list[Evidence], act: HostActivity, inside: list[tuple[str, float]]) -> str:
    """What the loop waited in; INSIDE: the preprocessing run within those calls (name, ms per step)."""
    if not waits:
        return "The trace has no DataLoader events, so the slow part of the input cannot be named."
    top = waits[0]
    text = (f"{top.name} takes {top.value:.2f} ms per step"
            + (", with num_workers=0: batches are loaded in the training process." if
               _in_process(act, top.name) else "."))
    if inside:
        text += (" Inside it the dataset prepares each sample on the host: "
                 + ", ".join(f"{name} {ms:.2f} ms" for name, ms in inside) + " per step.")
    return text


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
    if pipeline.user_ops:
        top = pipeline.user_ops[0]
        parts.append(f"Your dataset functions spend most of their time in {_op_label(top)} "
                     f"({top.self_ps / PS_PER_MS / steps:.2f} ms of thread time per step).")
    return " ".join(parts)


def _op_label(op: Stage) -> str:
    return f"{op.name} ({op.python}, Python code)" if op.python else op.name


def _in_memory(pipeline: Pipeline) -> bool:
    """Whether the pipeline starts from data in memory and reads no files (no file fix fits)."""
    facts = [stage.facts for stage in pipeline.stages]
    return any(f.in_memory_source for f in facts) and not any(f.reads_files for f in facts)


def _fixes(pipeline: Pipeline, copies: bool = False) -> list:
    """The remedies in order; COPIES: the batch's copy is most of the wait, so pinned non-blocking
    copies (PyTorch's form of PARALLEL_MAP) come first."""
    ordered = [fixes.PARALLEL_MAP] if copies else []
    if pipeline.stages and not pipeline.prefetches:
        ordered.append(fixes.PREFETCH)
    if pipeline.stages and not pipeline.parallel:
        ordered.append(fixes.PARALLEL_MAP)
    cache = fixes.CACHE_AFTER_MAP if _in_memory(pipeline) else fixes.CACHE_AND_INTERLEAVE
    for fix in (fixes.PREFETCH, fixes.PARALLEL_MAP, cache, fixes.SYNTHETIC_INPUT_TEST):
        if fix not in ordered:
            ordered.append(fix)
    return ordered


@register(CHECK_ID, "Input pipeline bottleneck", __doc__,
          what_if=Replayed(lambda model: Scenario(idle={"input": 1.0}), on_cpu=True,
                           what="device idle time spent waiting for input removed"),
          explains="input", compared=Compared("input_percent", "input_ms_per_step"),
          marks=Marks(("input",), "input_percent"))
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
    pipeline = pipeline_stages(host, windows, read_origin=severity is not Severity.OK)
    on_cpu = breakdown.device_kind == "cpu"
    who = "the training threads waited" if on_cpu else f"{primary.name} sat idle while the host waited"

    framework = analysis.model.framework
    source = {JAX: "", PYTORCH: " from the DataLoader"}.get(framework, " from tf.data")
    loader = _dataloader_waits(analysis) if framework == PYTORCH else []
    summary = (f"In {percent:.1f}% of step time ({input_ms:.2f} ms of a {analysis.mean_step_ms:.2f} ms step) "
               f"{who} for the next batch{source}. ")
    copies_ms = _batch_copy_ms(analysis) if framework == PYTORCH and not on_cpu else 0.0
    prepared = _Preprocessing.of(analysis) if framework == PYTORCH else None
    # Told where the input is worth a word: the loop's own preprocessing holding most of it.
    preprocessing = (severity is not Severity.OK and prepared is not None
                     and prepared.idle_ms >= COPY_SHARE * input_ms > 0)
    if preprocessing:
        summary = prepared.sentence(analysis, on_cpu) + " "
    if severity is Severity.OK:
        summary += "The input pipeline keeps up with training."
        title = f"Input pipeline keeps up ({percent:.1f}% of step time waiting)"
    else:
        about = (_dataloader_sentence(loader, host.activity, prepared.in_loader if prepared else [])
                 if framework == PYTORCH
                 else _pipeline_sentence(pipeline, analysis.steps_count))
        if copies_ms >= COPY_SHARE * input_ms:
            about = (f"{copies_ms:.2f} ms of it per step the host spent inside the calls copying the batch to "
                     f"{primary.name}: a batch in pageable memory is staged by the host while the GPU waits. Pin it "
                     "and copy with non_blocking=True, or keep the dataset on the GPU. ")
        if preprocessing:
            about = ("The loop prepares each batch itself, so the next one is not ready until this step's work is "
                     "done: prepared in DataLoader workers it would be made while the model runs. ")
        summary += about + analysis.gain_note(severity, saving)
        title = (prepared.title(analysis, on_cpu) if preprocessing
                 else f"Training waits on input {percent:.1f}% of step time")

    evidence: list[Evidence] = prepared.evidence(analysis) if preprocessing else []
    evidence += loader
    for stage in pipeline.stages[:3]:
        evidence.append(Evidence(
            kind="stage", name=stage.name, value=round(stage.self_ps / PS_PER_MS / analysis.steps_count, 3),
            unit="ms/step", detail=f"self time on thread {stage.thread}"
            + ("; waits for the stage feeding it" if stage.facts.buffer else ""),
            host=primary.host, tool="input_pipeline_analyzer"))
    for op in pipeline.user_ops[:2]:
        evidence.append(Evidence(
            kind="op", name=_op_label(op), value=round(op.self_ps / PS_PER_MS / analysis.steps_count, 3),
            unit="ms/step", detail=f"run by your dataset functions on tf.data threads (e.g. {op.thread})",
            host=primary.host, tool="trace_viewer@"))
    if pipeline.stages:
        evidence.append(Evidence(
            kind="stage", name="pipeline", value=len(pipeline.stages), unit="stages",
            detail=pipeline.describe(), host=primary.host, tool="input_pipeline_analyzer"))
    evidence += analysis.step_evidence(primary.parts["input"], "waiting for input in this step",
                                       device=primary.name, host=primary.host)

    metrics = {"input_percent": round(percent, 2), "input_ms_per_step": round(input_ms, 3)}
    if preprocessing:
        metrics.update(preprocess_ms_per_step=round(prepared.own_ms, 3),
                       preprocess_idle_ms_per_step=round(prepared.idle_ms, 3))
    fix_list = [] if severity is Severity.OK else _fixes(pipeline, copies_ms >= COPY_SHARE * input_ms)
    if preprocessing:
        fix_list = [*PREPROCESS_FIXES, fixes.SYNTHETIC_INPUT_TEST]
    return Finding(
        check=CHECK_ID, severity=severity, title=title, summary=summary, metrics=metrics,
        estimated_savings_ms_per_step=saving, evidence=evidence, fixes=fix_list,
    )


def _batch_copy_ms(analysis: Analysis) -> float:
    """Ms per step of the input time spent inside host-to-device copy calls (PyTorch)."""
    host, primary = analysis.primary_host, analysis.breakdown.primary
    act = host.activity
    calls = iv.union(act.start_ps, act.end_ps, batch_copies(host))
    return analysis.ms_per_step(iv.total(iv.intersect(primary.sets["input"], calls)))


# The loop's own preprocessing moved into DataLoader workers (or, on a run with workers, into its
# dataset), or done on the GPU; only PyTorch's vocabulary names preprocessing in the loop.
PREPROCESS_FIXES = [fixes.Remedy(fix.text, fix.code, fix.doc, tensorflow=False, pytorch=fix)
                    for fix in (fixes.TORCH_PREPROCESS_IN_WORKERS, fixes.TORCH_PREPROCESS_ON_GPU)]


@dataclass
class _Preprocessing:
    """The step's input prepared on the host (``cpu_preprocessing``), per step: in the loop itself,
    its own time, the device idle behind it and its scopes and frames by time; inside the
    DataLoader's calls (its dataset's preprocessing, in the loop's process when num_workers=0), its
    scopes and frames by time."""

    own_ms: float                           # the union of its events in the loop (outside the DataLoader)
    idle_ms: float                          # of which the primary device sat idle (input time)
    names: list[tuple[str, float]]          # (scope or frame, ms per step) in the loop, longest first
    in_loader: list[tuple[str, float]]      # the same inside the DataLoader's calls

    @classmethod
    def of(cls, analysis: Analysis) -> "_Preprocessing | None":
        host = analysis.primary_host
        act = host.activity
        rows = np.flatnonzero(cpu_preprocessing(host) & (act.step >= 0))
        if not rows.size:
            return None
        windows = iv.union(analysis.model.steps.start_ps, analysis.model.steps.end_ps)
        waits = np.flatnonzero((act.kind == HostEventKind.INPUT_WAIT) & (act.step >= 0))
        loader = iv.intersect(iv.union(act.start_ps[waits], act.end_ps[waits]), windows)
        loop = iv.subtract(windows, loader)
        spans = iv.intersect(iv.union(act.start_ps[rows], act.end_ps[rows]), loop)
        idle = iv.intersect(analysis.breakdown.primary.sets["input"], spans)
        return cls(analysis.ms_per_step(iv.total(spans)), analysis.ms_per_step(iv.total(idle)),
                   _by_name(analysis, rows, loop), _by_name(analysis, rows, loader))

    def title(self, analysis: Analysis, on_cpu: bool) -> str:
        percent = 100.0 * self.idle_ms / analysis.mean_step_ms
        name = self.names[0][0]
        if on_cpu:
            return f"Preprocessing in the loop ({name}) takes {percent:.1f}% of step time"
        return (f"Preprocessing in the loop ({name}) leaves {analysis.breakdown.primary.name} idle "
                f"{percent:.1f}% of step time")

    def sentence(self, analysis: Analysis, on_cpu: bool) -> str:
        step = analysis.mean_step_ms
        parts = ", ".join(f"{name} {ms:.2f} ms" for name, ms in self.names)
        waiting = "no op of the model ran" if on_cpu else f"{analysis.breakdown.primary.name} sat idle"
        return (f"Each step prepares its input on the host before its work: {self.own_ms:.2f} ms per step "
                f"({100 * self.own_ms / step:.0f}% of the {step:.2f} ms step) in {parts}; for "
                f"{self.idle_ms:.2f} ms of it {waiting}.")

    def evidence(self, analysis: Analysis) -> list[Evidence]:
        host = analysis.primary_host
        return [Evidence(kind="op", name=name, value=round(ms, 3), unit="ms/step",
                         detail=f"preparing the input on the host inside the step ({100 * ms / analysis.mean_step_ms:.0f}% "
                                "of it)", host=host.name, tool="trace_viewer@")
                for name, ms in self.names]


def _by_name(analysis: Analysis, rows: np.ndarray, within: iv.Intervals) -> list[tuple[str, float]]:
    """The names of the primary host's events ROWS with their time inside WITHIN (ms per step), the
    longest PREPROCESS_NAMES first."""
    act = analysis.primary_host.activity
    out = []
    for name in np.unique(act.name[rows]):
        mine = rows[act.name[rows] == name]
        ms = analysis.ms_per_step(iv.total(iv.intersect(iv.union(act.start_ps[mine], act.end_ps[mine]), within)))
        if ms > 0:
            out.append((act.names[int(name)], ms))
    return sorted(out, key=lambda pair: -pair[1])[:PREPROCESS_NAMES]
