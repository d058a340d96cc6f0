"""Trust: what a capture can tell, decided before anything is attributed or advised.

The model holds every step candidate the markers gave. This stage decides, in order:

1. the window of each step a user pays (``windows``): from its host call to the end of its
   own work (the device work it launched included), with the profiler's trace export cut off;
2. which devices were traced and for how long (``coverage``): missing device data is never
   idle time, and replicas traced at different times are not compared;
3. which steps count (``typical``): steps without device data and one-off slow steps
   (compilation, warm-up, checkpoints) are listed and left out; markers that cover several
   training steps (``steps_per_execution``) are divided out;
4. where the model ran (``placement``);
5. for a one-step capture, whether that step looks typical.

``assess`` returns a :class:`Trust` holding a view of the session on the steps that count
(``Trust.view``: the same tables, each event's ``step`` indexing the trusted steps), so every
later stage measures only those. The model itself is never changed: assessing it twice gives
the same trust.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from tb_gpuadvisor.model.intervals import Intervals
from tb_gpuadvisor.model.steps import step_columns
from tb_gpuadvisor.timeline import PS_PER_MS, PYTORCH, SessionModel, Steps
from tb_gpuadvisor.trust.coverage import (
    DeviceCoverage, device_coverage, expected_device_count, misaligned_replicas, missing_heavy_work, partial_trace,
)
from tb_gpuadvisor.trust.placement import Placement, where_it_ran
from tb_gpuadvisor.trust.typical import outliers, single_step_evidence, steps_per_marker
from tb_gpuadvisor.trust import warmup
from tb_gpuadvisor.trust.windows import (
    ExportCut, anchor_to_host_calls, cut_profiler_export, emptied_by_cut, include_launched_work,
)

# A step whose window the primary device's trace covers less than this share of has no device data.
MIN_STEP_COVERAGE = 0.5


@dataclass
class ExcludedStep:
    """A candidate step left out of every per-step number, and why."""

    number: int
    start_ps: int
    end_ps: int
    reason: str

    def to_json(self) -> dict:
        return {"step": self.number, "start_ms": round(self.start_ps / PS_PER_MS, 3),
                "duration_ms": round((self.end_ps - self.start_ps) / PS_PER_MS, 3), "reason": self.reason}


@dataclass
class Trust:
    """What the capture covers and which of its steps count."""

    candidates: Steps                       # every step the markers gave
    view: SessionModel                      # the session on the steps that count (what later stages read)
    devices: list[DeviceCoverage] = field(default_factory=list)
    excluded: list[ExcludedStep] = field(default_factory=list)
    export_cuts: list[ExportCut] = field(default_factory=list)
    misaligned: list[str] = field(default_factory=list)    # replicas traced at other times than the primary
    placement: Placement = field(default_factory=lambda: Placement("gpu"))
    single_step_atypical: list[str] = field(default_factory=list)
    expected_devices: int = 0
    missing_work: str | None = None        # why the device trace holds only part of the steps' work
    retake: str | None = None              # why the capture holds warm-up, not training steps (PyTorch)
    # host name -> its one-time set-up (PyTorch): device idle behind it is set-up, not a host cost
    setup: dict[str, Intervals] = field(default_factory=dict)

    @property
    def steps(self) -> Steps:
        """The steps that count."""
        return self.view.steps

    @cached_property
    def covered(self) -> dict[str, Intervals]:
        """Device name -> the time its trace covers: the whole capture for a traced device (it may
        simply be idle at either end), up to its last event for one that stopped early, from the end
        of the work queued before the capture for one still running it; devices that recorded no
        kernel are absent."""
        whole = np.iinfo(np.int64).max
        return {d.name: (np.array([d.covers_from_ps], np.int64),
                         np.array([d.last_ps if d.status == "stops_early" else whole], np.int64))
                for d in self.devices if d.last_ps is not None and d.kernels}

    def covered_by(self, device_name: str) -> Intervals:
        """The window DEVICE_NAME's trace covers; empty when it recorded nothing."""
        empty = np.empty(0, np.int64)
        return self.covered.get(device_name, (empty, empty))

    def coverage_of(self, device_name: str) -> DeviceCoverage | None:
        return next((d for d in self.devices if d.name == device_name), None)

    @property
    def partial_devices(self) -> list[DeviceCoverage]:
        """Devices the host used whose trace is missing or incomplete."""
        return [d for d in self.devices if d.partial]

    @property
    def partial(self) -> bool:
        return bool(self.partial_devices or self.misaligned or self.missing_work)

    @property
    def export_excluded_ms(self) -> float:
        return sum(c.excluded_ps for c in self.export_cuts) / PS_PER_MS

    @property
    def one_step(self) -> bool:
        return len(self.steps) == 1

    def to_json(self) -> dict:
        out: dict = {
            "steps_marked": self.candidates.source not in ("inferred", "inferred_device", "window", "none"),
            "candidate_steps": len(self.candidates),
            "trusted_steps": len(self.steps),
            "excluded_steps": [e.to_json() for e in self.excluded],
            "devices": [d.to_json() for d in self.devices if d.status != "unused"],
            "partial_device_trace": self.partial,
            "model_ran_on": self.placement.where,
        }
        if self.steps.per_marker > 1:
            out["steps_per_execution"] = self.steps.per_marker
        if self.export_cuts:
            out["profiler_export_excluded_ms"] = round(self.export_excluded_ms, 3)
        if self.misaligned:
            out["replicas_traced_at_other_times"] = self.misaligned
        if self.missing_work:
            out["missing_device_work"] = self.missing_work
        if self.retake:
            out["capture_to_retake"] = self.retake
        if self.expected_devices:
            out["devices_the_host_used"] = self.expected_devices
        if self.placement.where not in ("gpu", "tpu", "unknown"):
            out["placement"] = self.placement.to_json()
        if self.one_step:
            out["single_step"] = {"typical": not self.single_step_atypical, "atypical_because": self.single_step_atypical}
        return out


def _align_to_primary(steps: Steps, model: SessionModel, misaligned: list[str]) -> Steps:
    """End each step with the work of the replicas traced with the primary, not with replicas
    whose same step ran at another time."""
    if not misaligned:
        return steps
    ends = steps.start_ps.copy()
    for dev in model.active_gpus:
        if dev.device.name in misaligned:
            continue
        inside = dev.step >= 0
        if inside.any():
            last = np.full(len(steps), np.iinfo(np.int64).min)
            np.maximum.at(last, dev.step[inside], dev.end_ps[inside])
            ends = np.maximum(ends, last)
    ends = np.where(ends > steps.start_ps, np.minimum(ends, steps.end_ps), steps.end_ps)
    return replace(steps, end_ps=ends)


def _without_device_data(steps: Steps, primary_cov: DeviceCoverage | None) -> list[ExcludedStep]:
    if primary_cov is None or primary_cov.last_ps is None:
        return []
    # A trace that stops early loses the end of the capture; its start is the capture's start.
    hi = np.minimum(steps.end_ps, primary_cov.last_ps)
    share = np.clip(hi - steps.start_ps, 0, None) / np.maximum(steps.duration_ps, 1)
    missing = np.flatnonzero(share < MIN_STEP_COVERAGE)
    if missing.size == len(steps):
        return []            # nothing would be left: keep them, the partial trace is reported
    return [ExcludedStep(int(steps.number[i]), int(steps.start_ps[i]), int(steps.end_ps[i]),
                         f"{primary_cov.name}'s trace covers {100 * share[i]:.0f}% of it "
                         f"(its events end at {primary_cov.last_ps / PS_PER_MS:.2f} ms)")
            for i in missing]


def _emptied(steps: Steps, cuts: list[ExportCut], already: set[int]) -> list[ExcludedStep]:
    """Steps the export cut left nothing of (not already left out), while other steps remain."""
    empty = [c for c in emptied_by_cut(steps, cuts) if int(steps.number[c.step]) not in already]
    if len(empty) + len(already) >= len(steps):
        return []            # nothing would be left: keep them, the capture's quality is reported
    return [ExcludedStep(int(steps.number[c.step]), int(steps.start_ps[c.step]),
                         int(steps.start_ps[c.step]) + c.excluded_ps,
                         f"cutting the profiler's trace export (from {c.start_ps / PS_PER_MS:.2f} ms) "
                         "left nothing of it")
            for c in empty]


def _warm_up(model: SessionModel, steps: Steps) -> tuple[warmup.SetUp, str | None, list[ExcludedStep]]:
    """The set-up found, why the capture is to be taken again (None: it is not), and the warm-up
    iterations left out (``warmup``); none are left out when nothing else would remain."""
    setup = warmup.measure(model.hosts, steps)
    warm = np.flatnonzero(setup.share(steps) >= warmup.WARM_UP_SHARE)
    # Set-up filling the capture makes it one to take again unless enough clean steps remain.
    retake = setup.window_reason(steps) if len(steps) - warm.size < warmup.CLEAN_STEPS else None
    if warm.size == len(steps):
        return setup, retake, []
    return setup, retake, [ExcludedStep(int(steps.number[i]), int(steps.start_ps[i]), int(steps.end_ps[i]),
                                        setup.reason(int(i), steps)) for i in warm]


def assess(model: SessionModel) -> Trust:
    """Decide the step windows, the coverage and which steps count (see the module docstring)."""
    candidates = replace(model.steps, per_marker=steps_per_marker(model.steps))
    steps = include_launched_work(anchor_to_host_calls(candidates, model.hosts), model.hosts)
    steps, cuts = cut_profiler_export(steps, model.hosts)
    primary = model.primary_gpu
    misaligned: list[str] = []
    if primary is not None and len(steps) and len(model.active_gpus) >= 2:
        # Replicas are compared step by step: their events are placed in these windows first.
        windows = model.with_steps(steps, step_columns(steps, model.hosts))
        misaligned = misaligned_replicas(windows, steps, windows.primary_gpu)
        steps = _align_to_primary(steps, windows, misaligned)
    devices = device_coverage(model, steps)
    primary_cov = next((d for d in devices if primary is not None and d.name == primary.device.name
                        and d.host == primary.device.host), None)
    retake, excluded, setup = None, [], {}
    if model.framework == PYTORCH and len(steps):
        # Warm-up iterations are recognised first: their set-up (a final sync included) is what
        # makes them slow or leaves the device's trace short of them.
        found, retake, excluded = _warm_up(model, steps)
        setup = found.by_host
    warm = {e.number for e in excluded}
    excluded += [e for e in _without_device_data(steps, primary_cov) if e.number not in warm]
    excluded += _emptied(steps, cuts, {e.number for e in excluded})
    keep = np.ones(len(steps), bool)
    position = {int(n): i for i, n in enumerate(steps.number)}
    for e in excluded:
        keep[position[e.number]] = False
    for o in outliers(steps, keep):
        keep[o.index] = False
        excluded.append(ExcludedStep(int(steps.number[o.index]), int(steps.start_ps[o.index]),
                                     int(steps.end_ps[o.index]), o.reason))
    trusted = steps.take(keep)
    # Events outside every trusted window (the export, left-out steps) belong to no step, even
    # when they carry a trusted step's group id.
    view = model.with_steps(trusted, step_columns(trusted, model.hosts, within=True))
    return Trust(candidates=candidates, view=view, devices=devices,
                 excluded=sorted(excluded, key=lambda e: e.start_ps), export_cuts=cuts, misaligned=misaligned,
                 placement=where_it_ran(view, trusted),
                 single_step_atypical=single_step_evidence(view, trusted, first_use=retake is None),
                 expected_devices=expected_device_count(view),
                 missing_work=missing_heavy_work(view) or partial_trace(view), retake=retake, setup=setup)


# What a finding rests on, for its confidence: per-step idle attribution on the primary device,
# the composition of device kernels, the comparison of replicas, allocator records, or nothing
# measured from steps at all.
def confidence(trust: Trust, model: SessionModel, aspect: str) -> tuple[str, list[str]]:
    """How far a finding resting on ASPECT can be believed, with the reasons in words."""
    if aspect == "capture":
        return "high", []
    low: list[str] = []
    medium: list[str] = []
    steps = trust.steps
    if aspect != "memory":
        if not len(steps):
            low.append("no training steps were found, so nothing per step can be measured")
        elif trust.candidates.source.startswith("inferred"):
            medium.append(f"steps were inferred from repeated runs of {trust.candidates.marker_name or 'a function'}, "
                          "not marked by the program")
        elif trust.candidates.source == "window":
            medium.append("nothing repeats like a training step, so the capture is judged as one window")
        if len(steps) == 1 and trust.single_step_atypical:
            low.append("the only captured step is not typical: " + "; ".join(trust.single_step_atypical))
        elif len(steps) == 1 and trust.candidates.source != "window":
            medium.append("judged on the one step the capture holds (nothing atypical was found in it)")
        elif len(steps) == 2:
            medium.append("only 2 steps count, too few to tell a typical step from noise")
        dropped = sum(h.dropped_events for h in model.hosts)
        if dropped:
            medium.append(f"the profiler dropped {dropped} events")
    if trust.placement.where == "gpu_trace_lost" and aspect in ("idle", "kernels", "replicas"):
        low.append("the GPU trace is empty although the model ran on the GPU: device time is unknown")
    if not trust.placement.ops_traced and aspect == "idle":
        low.append("the host tracer recorded no op events: the CPU's compute is known only as the runtime's "
                   "activity and its graph calls, and when it sat idle inside a call cannot be measured")
    if trust.retake and aspect in ("idle", "kernels"):
        low.append(trust.retake + ": its idle and launch times are not a trained step's")
    if trust.missing_work and aspect in ("idle", "kernels"):
        low.append(trust.missing_work + ": device idle time and kernel shares may be unrecorded work")
    partial = trust.partial_devices
    if aspect == "replicas" and (partial or trust.misaligned):
        names = [d.name for d in partial] + trust.misaligned
        low.append("the device trace is partial (" + ", ".join(sorted(set(names))[:4])
                   + (", ..." if len(set(names)) > 4 else "") + "): replicas cannot be compared")
    elif aspect in ("idle", "kernels") and partial:
        traced = sum(1 for d in trust.devices if d.kernels)
        if aspect == "idle" and (any(d.status == "stops_early" for d in partial)
                                 or (trust.expected_devices >= 2 and 2 * traced < trust.expected_devices)):
            low.append(f"only {traced} of the {max(trust.expected_devices, traced)} devices the host drove were "
                       "traced, and not for the whole capture: device idle time the host's dispatch seems to "
                       "cause may be spent on the devices that were not traced")
        elif any(d.status == "stops_early" for d in partial):
            medium.append("a device trace stops before the host did; only steps it covers are measured")
        else:
            medium.append(f"{len(partial)} device(s) the host used recorded no kernels: only the traced ones "
                          "are measured")
    if low:
        return "low", low + medium
    return ("medium", medium) if medium else ("high", [])
