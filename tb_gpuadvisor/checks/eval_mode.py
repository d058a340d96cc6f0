"""eval_mode: does inference still run dropout and training-mode batch norm (PyTorch)?

## What it measures
Where a PyTorch trace runs inference (the trace holds no backward or optimizer work, or the
kernels were launched inside an annotation naming an inference phase: ``model_inference``,
``eval``, ``validation``, ``no_grad``, ``predict``), the GPU time of kernels that only run in a
module's training mode: dropout (``fused_dropout`` kernels) and batch norm computing the batch's
statistics (cuDNN ``bn_fw_tr_*``, ATen ``batch_norm_collect_statistics``, MIOpen
``BatchNormFwdTrain*``; in eval mode these are ``bn_fw_inf_*`` or a plain transform).
``training_kernel_ms_per_step`` is their time per step (per window without steps); the
evidence lists the kernels and the inference annotation.

## Why it matters
``torch.no_grad()`` and ``torch.inference_mode()`` stop autograd, not training behaviour: a
model left in training mode drops activations at random and normalises each batch by its own
statistics (and updates the running ones), so predictions are wrong and change from run to
run, and the GPU does work eval mode skips. A warning whenever such kernels run in inference,
however little time they take: the results are wrong.

## How to fix
Call ``model.eval()`` before inference (and ``model.train()`` before training again), and run
inference under ``torch.inference_mode()``.

Savings model: not replayed; dropout kernels disappear in eval mode and training-mode batch
norm becomes the inference kernel, assumed to take half the time (it skips the statistics
pass), so the estimate is the dropout time plus half the batch-norm time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tb_gpuadvisor.checks import fixes
from tb_gpuadvisor.checks.base import NoMarks, Finding, NoReplay, Severity, needs_gpu, register
from tb_gpuadvisor.checks.finding import Evidence
from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.model.kernels import named_events
from tb_gpuadvisor.model.steps import launch_rows
from tb_gpuadvisor.timeline import PS_PER_MS, DeviceActivity, HostModel
from tb_gpuadvisor.kinds import HostEventKind
from tb_gpuadvisor.vocab import pytorch

CHECK_ID = "eval_mode"
TOP = 5
# Training-mode batch norm in eval mode: the statistics pass goes, the transform stays.
BATCH_NORM_EVAL_SHARE = 0.5


@dataclass
class _Region:
    """Where a host runs inference: the whole trace (no training work), or annotated ranges."""

    whole: bool
    names: list[str]
    start_ps: np.ndarray
    end_ps: np.ndarray


def _inference(host: HostModel) -> _Region | None:
    act = host.activity
    if not named_events(act, "training_work", pytorch.is_training_work).any():
        return _Region(True, [], np.empty(0, np.int64), np.empty(0, np.int64))
    scope = np.flatnonzero((act.kind == HostEventKind.SCOPE)
                           & named_events(act, "inference_scope", pytorch.is_inference_scope))
    if not scope.size:
        return None
    return _Region(False, sorted({act.names[i] for i in act.name[scope].tolist()}),
                   act.start_ps[scope], act.start_ps[scope] + act.dur_ps[scope])


def _launched_inside(dev: DeviceActivity, host: HostModel, region: _Region, rows: np.ndarray) -> np.ndarray:
    """ROWS of DEV whose launch call (same correlation id) started inside one of REGION's ranges."""
    act = host.activity
    launch = launch_rows(act, dev)[rows]
    launch_ps = act.start_ps[np.clip(launch, 0, None)]
    inside = np.zeros(rows.size, bool)
    for lo, hi in zip(region.start_ps.tolist(), region.end_ps.tolist()):
        inside |= (launch_ps >= lo) & (launch_ps < hi)
    return rows[(launch >= 0) & inside]


@register(CHECK_ID, "Inference in training mode (model.eval())", __doc__,
          what_if=NoReplay("dropout kernels vanish and training-mode batch norm is assumed to halve in eval "
                           "mode; the estimate is that kernel time, not a replay"),
          aspect="kernels", frameworks=(pytorch.FRAMEWORK,),
          marks=NoMarks("it estimates kernel time eval mode would drop, not intervals of the step"))
def check(analysis: Analysis) -> Finding:
    model = analysis.model
    if not model.active_gpus:
        return needs_gpu(CHECK_ID, "kernels")
    hosts = {host.name: host for host in model.hosts}
    per_kind: dict[str, int] = {pytorch.DROPOUT: 0, pytorch.TRAINING_BATCH_NORM: 0}
    kernels: list[tuple[int, str, int, DeviceActivity]] = []
    scopes: set[str] = set()
    regions = {name: _inference(hosts[name]) for name in {dev.device.host for dev in model.active_gpus}}
    counted = analysis.steps_count > 0
    for dev in model.active_gpus:
        host = hosts[dev.device.host]
        region = regions[host.name]
        if region is None:
            continue
        kind_of = named_events(dev, "training_mode_kernel", pytorch.training_mode_kernel)
        rows = np.flatnonzero(kind_of & ((dev.step >= 0) if counted else True))
        if not region.whole:
            rows = _launched_inside(dev, host, region, rows)
            scopes.update(region.names)
        for name_idx in np.unique(dev.name[rows]).tolist():
            sel = rows[dev.name[rows] == name_idx]
            name = dev.names[name_idx]
            ps = int(dev.dur_ps[sel].sum())
            per_kind[pytorch.training_mode_kernel(name)] += ps
            kernels.append((ps, name, int(sel.size), dev))
    if all(region is None for region in regions.values()):
        return Finding(CHECK_ID, Severity.OK, "Training trace: no inference region to check",
                       "The trace runs backward and optimizer work and no annotation names an inference "
                       "phase, so training-mode dropout and batch norm are expected here.")
    where = ("inside " + ", ".join(f"'{s}'" for s in sorted(scopes)) if scopes
             else "in a trace with no backward or optimizer work")
    if not kernels:
        return Finding(CHECK_ID, Severity.OK, "Inference runs in eval mode",
                       f"No dropout or training-mode batch-norm kernel runs {where}.")
    per_step = analysis.ms_per_step if counted else (lambda ps: float(ps) / PS_PER_MS)
    unit = "ms/step" if counted else "ms"
    dropout_ms, norm_ms = per_step(per_kind[pytorch.DROPOUT]), per_step(per_kind[pytorch.TRAINING_BATCH_NORM])
    saving = dropout_ms + BATCH_NORM_EVAL_SHARE * norm_ms
    what = " and ".join(k for k in per_kind if per_kind[k])
    evidence = [Evidence("kernel", name, round(per_step(ps), 3), unit,
                         detail=f"{pytorch.training_mode_kernel(name)} kernel, {n} launch(es)",
                         device=dev.device.name, host=dev.device.host, tool="kernel_stats")
                for ps, name, n, dev in sorted(kernels, key=lambda k: -k[0])[:TOP]]
    evidence += [Evidence("op", scope, 0.0, "ms", detail="annotation naming an inference phase") for scope in sorted(scopes)]
    per = "per step" if counted else "in the profiled window"
    return Finding(
        CHECK_ID, Severity.WARNING, f"Inference runs {what}: model.eval() was not called",
        f"The GPU runs {what} kernels {where}: {dropout_ms + norm_ms:.2f} ms {per} ({dropout_ms:.2f} ms "
        f"dropout, {norm_ms:.2f} ms batch norm). These only run when modules are in training mode: "
        "no_grad/inference_mode do not switch it off, so predictions are randomly dropped out and "
        "normalised by each batch's own statistics. Eval mode would save about "
        f"{saving:.2f} ms {per} and make the results right.",
        {"training_kernel_ms_per_step": round(dropout_ms + norm_ms, 3), "dropout_ms_per_step": round(dropout_ms, 3),
         "training_batch_norm_ms_per_step": round(norm_ms, 3)},
        round(saving, 3) if counted else 0.0, evidence, [fixes.TORCH_EVAL_MODE])
