"""profile_quality: what this capture can and cannot tell, and how to capture a better one.

## What it measures
Nothing about the program: it reports what the trust stage found about the capture, before
the other checks are read. What kind of capture it is (GPUs and how many ran kernels, TPUs,
or the host CPU only) and where the model ran; host files that could not be read; no steps
found, or steps only inferred from repeated function runs; device traces that are missing,
stop before the host did, or hold copies but no kernels although the host used the device;
replicas whose same steps were traced at different times; steps left out of every number
(no device data, or far slower than the median: compilation, warm-up, checkpoints); the
profiler's own trace export cut off the end of the step; markers that each cover several
training steps (``steps_per_execution``); for a one-step capture, whether that step looks
typical (autotuning kernels, compilation); more than 10 steps; dropped events. In a PyTorch
trace three of these come before every other finding (metrics ``leads``): launch calls with no
device event at all (the device trace is missing, not the device idle), a run on the CPU, and a
capture whose steps are mostly one-time set-up (``trust.warmup``: take it again after warm-up).
A PyTorch trace of device activity alone (``ProfilerActivity.CUDA`` only) is said to have no
host side: its idle time has no known cause.

## Why it matters
Every other finding divides by step time and reads device activity. Missing device data
looks like idle time, a compile step or the trace export looks like a huge per-step cost, and
one step can be a warm-up step. The findings' confidence comes from the same facts; this
check says them in one place with the fix. Warning when the analysis is degraded (the
findings that depend on the missing part are marked low confidence), info for what was
handled (steps left out, the export cut off) or is worth knowing, ok otherwise.

## How to fix
Profile a window of steps after warm-up (``profile_batch=(10, 15)``, or ``tf.profiler``
around steps 10-15 of a custom loop); make CUPTI visible and allow non-admin profiling
(``NVreg_RestrictProfilingToAdminUsers=0``); enlarge the device trace buffer when traces stop
early; profile every GPU and host of a distributed job; mark steps in custom loops.

Savings model: none (0 ms); this check is about the measurement, not the program.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from tb_gpuadvisor.checks.base import NoMarks, Compared, Finding, NoReplay, PerHostJoin, Severity, register
from tb_gpuadvisor.checks.finding import Evidence, Fix
from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.checks.fixes import (
    CHECK_GPU_VISIBLE, JAX_PROFILING_GUIDE, JAX_STEP_ANNOTATION, TORCH_FULL_TRACE, TORCH_PROFILER_DOC,
    TORCH_WARM_CALL, TORCH_WARM_CAPTURE, Remedy,
)
from tb_gpuadvisor.kinds import DeviceEventKind
from tb_gpuadvisor.timeline import PS_PER_MS
from tb_gpuadvisor.trust.placement import LONG_OP_SHARE
from tb_gpuadvisor.vocab import pytorch, tensorflow

CHECK_ID = "profile_quality"
MIN_STEPS, MAX_STEPS = 3, 10
# An export cut shorter than this rounds to 0.00 ms: it changes no number, so it is not worth a line.
EXPORT_WORTH_SAYING_MS = 0.005
PROFILER_GUIDE = "https://www.tensorflow.org/guide/profiler"
_SOURCES = {"custom_loop": "step annotations (events with _r=1 and step_num)", "keras2": f"Keras {tensorflow.KERAS2_STEP} markers",
            "profiler_step": f"PyTorch {pytorch.STEP_ANNOTATION}N annotations",
            pytorch.DEVICE_STEP_SOURCE: f"PyTorch {pytorch.STEP_ANNOTATION}N annotations on the GPU side",
            "keras": f"Keras 3 '{tensorflow.KERAS3_STEP}' markers", "steps_line": "TensorFlow's derived Steps line",
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
        doc=JAX_PROFILING_GUIDE), pytorch=TORCH_WARM_CAPTURE)
STEP_MARKERS = Remedy(
    text="Mark each training step so the profiler can group events into steps.",
    code="for step, (x, y) in enumerate(dataset):\n"
         "    with tf.profiler.experimental.Trace('train', step_num=step, _r=1):\n"
         "        train_step(x, y)",
    doc=PROFILER_GUIDE,
    jax=JAX_STEP_ANNOTATION, pytorch=TORCH_WARM_CAPTURE)
FULL_DEVICE_TRACE = Remedy(
    text="Trace every device for the whole window: keep the window to a few steps so the device "
         "trace does not overflow, and in a distributed job profile every worker (each writes its "
         "own host file) from one client call.",
    code="# on every worker, once at start-up:\n"
         "tf.profiler.experimental.server.start(6009)\n"
         "# from one machine, after warm-up, for about 2 s of training:\n"
         "tf.profiler.experimental.client.trace(\n"
         "    'grpc://worker0:6009', log_dir, 2000,\n"
         "    worker_list='grpc://worker0:6009,grpc://worker1:6009')",
    doc=PROFILER_GUIDE,
    jax=Fix(
        text="Trace every device for the whole window: keep the window to a few steps so the device "
             "trace does not overflow, and in a multi-process job trace every process around the same "
             "steps (each writes its own host file into the same log dir).",
        code="# in every process, around the same few steps after warm-up:\n"
             "jax.profiler.start_trace(log_dir)\n"
             "for step in range(10, 15):\n"
             "    with jax.profiler.StepTraceAnnotation('train', step_num=step):\n"
             "        state, loss = train_step(state, next(batches))\n"
             "loss.block_until_ready()\n"
             "jax.profiler.stop_trace()",
        doc=JAX_PROFILING_GUIDE),
    pytorch=TORCH_FULL_TRACE,
)


@dataclass
class Issue:
    severity: Severity
    title: str
    text: str
    fix: Fix | None = None
    evidence: list[Evidence] = field(default_factory=list)
    leads: bool = False         # no other finding means anything until this is fixed (ranked first)


def capture_kind(analysis: Analysis) -> tuple[str, str]:
    """(kind, sentence): what the capture holds."""
    model = analysis.model
    gpus, active = model.gpus, model.active_gpus
    tpus = [d for d in model.devices if d.device.kind == "tpu"]
    hosts = len(model.hosts)
    where = f"{hosts} host{'s' if hosts != 1 else ''}"
    if model.hosts and model.session_hosts > hosts:     # one host of a many-host session (multihost's map)
        where = f"host {model.hosts[0].name}, one of the session's {model.session_hosts} hosts"
    if analysis.trust.placement.where == "unknown":
        return "unknown", ("a capture none of whose files could be read: nothing says where the model ran, "
                           "and nothing in this report measures the run")
    if not gpus and analysis.trust.placement.where == "gpu_trace_lost":
        return "gpu_empty", (f"a capture of a GPU run on {where} whose device trace is missing: the host launched "
                             "GPU work and no device event was recorded")
    if gpus:
        vendors = sorted({d.device.vendor for d in gpus if d.device.vendor})
        vendor = f" {'/'.join(vendors)}" if vendors else ""
        if not active:
            return "gpu_empty", f"a capture of {len(gpus)}{vendor} GPU(s) on {where} with no GPU kernels recorded"
        if not any(bool(np.any(d.kind == DeviceEventKind.KERNEL)) for d in active):
            return "gpu", (f"a GPU capture: {len(active)} of {len(gpus)}{vendor} GPU(s) ran copies and the host "
                           f"launched no kernel (a copy-only program), on {where}")
        return "gpu", f"a GPU capture: {len(active)} of {len(gpus)}{vendor} GPU(s) ran kernels, on {where}"
    if tpus:
        return "tpu", (f"a TPU capture ({len(tpus)} TPU(s) on {where}); the GPU checks do not apply, "
                       "the step-level checks still do")
    waits = analysis.trust.placement.untraced_device_ms_per_step
    if waits:
        return "cpu", (f"a capture with no device activity on {where}, whose value read-backs (.item()) waited "
                       f"{waits:.2f} ms per step for a device: the model ran on {pytorch.UNTRACED_DEVICES}, "
                       "not on the CPU, and every number in this report is about the host")
    return "cpu", (f"a CPU-only capture on {where}: no GPU or TPU was recorded, so the model ran on the CPU "
                   "and every number in this report is about the CPU and the host")


# What lists the GPUs each framework can use, said in a CPU-only capture's finding.
_LISTS_GPUS = {"tensorflow": "tf.config.list_physical_devices('GPU') lists the GPUs TensorFlow can use",
               "jax": "jax.devices() lists GPU devices only where a CUDA build of jaxlib is installed"}
# Leads the title of a CPU-only capture's finding, whatever else is wrong with the capture.
NO_GPU = "No GPU: the model ran on the CPU"
UNTRACED_DEVICE = "The model ran on a device the profiler cannot trace"

HOST_TRACER = Remedy(
    text="Record the ops the CPU runs: profile with the host tracer at its verbose level 3 (level 2, "
         "the default, leaves out ops the runtime deems cheap), so each op's time is traced and not "
         "only the executor's.",
    code="options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=3)\n"
         "tf.profiler.experimental.start(log_dir, options=options)\n"
         "# ... a few training steps ...\n"
         "tf.profiler.experimental.stop()",
    doc=PROFILER_GUIDE,
    jax=Fix(
        text="Record the ops the CPU runs: profile with the host tracer at its verbose level 3.",
        code="options = jax.profiler.ProfileOptions()\noptions.host_tracer_level = 3\n"
             "jax.profiler.start_trace(log_dir, profiler_options=options)",
        doc=JAX_PROFILING_GUIDE),
)


# A PyTorch trace whose host launched GPU work but holds no device event: Kineto's CUPTI could not
# trace this driver (a CUPTI older than the driver, or none found), or CUDA activity was not asked for.
TORCH_CUPTI = Fix(
    text="Record the GPU's activity: ask for ProfilerActivity.CUDA, and use a PyTorch build whose CUDA (and "
         "the CUPTI it loads) matches the driver (nvidia-smi's CUDA Version at least torch.version.cuda; "
         "upgrade the driver or install the build for it). A trace of a few steps then holds kernels, "
         "and prof.key_averages() shows CUDA time.",
    code="import torch\n"
         "from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler\n"
         "print(torch.version.cuda)   # compare with the CUDA Version nvidia-smi prints for the driver\n"
         "with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],\n"
         "             schedule=schedule(wait=1, warmup=3, active=3),\n"
         "             on_trace_ready=tensorboard_trace_handler(logdir)) as prof:\n"
         "    for x, y in loader:\n"
         "        train_step(x, y)\n"
         "        prof.step()\n"
         "print(prof.key_averages().table(sort_by='cuda_time_total', row_limit=5))",
    doc=TORCH_PROFILER_DOC)
TRACE_MISSING = "Device trace missing"
# Work queued before the profiler started runs on inside its window, untraced.
TORCH_SYNC_BEFORE_CAPTURE = Fix(
    text="Let the device finish what was queued before profiling starts: call torch.cuda.synchronize() "
         "right before entering the profiler, so its window opens on an idle device.",
    code="torch.cuda.synchronize()      # earlier work done: the window holds only what it traces\n"
         "with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:\n"
         "    model(x)",
    doc=TORCH_PROFILER_DOC)
# A PyTorch run on Apple's MPS: Kineto traces none of its work; the backend's own profiler writes OS
# signposts that Xcode Instruments shows.
TORCH_UNTRACED_DEVICE = Fix(
    text="Trace the device with its own profiler: on Apple silicon, torch.mps.profiler writes the MPS "
         "operations as OS signposts that Xcode Instruments (Logging, Metal System Trace) shows; and read "
         "values back (.item(), .cpu(), print) once every few steps, each waits for the device.",
    code="import torch\n"
         "with torch.mps.profiler.profile(mode='interval', wait_until_completed=False):\n"
         "    for step, (x, y) in enumerate(loader):\n"
         "        loss = train_step(x.to('mps'), y.to('mps'))\n"
         "        if step % 50 == 0:\n"
         "            print(loss.item())     # one wait for the device per 50 steps",
    doc="https://pytorch.org/docs/stable/generated/torch.mps.profiler.profile.html")
# A PyTorch trace of the GPU's activity alone (activities=[ProfilerActivity.CUDA]): no op, launch
# call or step of the host was recorded.
TORCH_HOST_ACTIVITY = Fix(
    text="Record the host too: add ProfilerActivity.CPU to the activities, so the ops, the launch calls "
         "and the ProfilerStep#N marks are traced with the GPU's work and its idle time gets a cause.",
    code="from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler\n"
         "with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],\n"
         "             schedule=schedule(wait=1, warmup=3, active=3),\n"
         "             on_trace_ready=tensorboard_trace_handler(logdir)) as prof:\n"
         "    for x, y in loader:\n"
         "        train_step(x, y)\n"
         "        prof.step()",
    doc=TORCH_PROFILER_DOC)
HOST_NOT_RECORDED = "Host side not recorded"


def _host_issues(analysis: Analysis) -> list[Issue]:
    """A PyTorch capture whose GPUs ran work while no host recorded a single event."""
    model = analysis.model
    if model.framework != pytorch.FRAMEWORK or not model.active_gpus or any(len(h.activity) for h in model.hosts):
        return []
    return [Issue(Severity.WARNING, HOST_NOT_RECORDED,
                  "The trace holds the GPU's kernels and copies but no host event (no op, launch call or "
                  "step mark): it was recorded with ProfilerActivity.CUDA only. What the GPU ran and for how "
                  "long is measured; why it sat idle (host overhead, input, launches, syncs) is not, so the "
                  "idle time is counted as not traced and no host finding is made.", TORCH_HOST_ACTIVITY)]


def _placement_issues(analysis: Analysis) -> list[Issue]:
    placement = analysis.trust.placement
    torch = analysis.model.framework == pytorch.FRAMEWORK
    if placement.where == "cpu_only" and placement.untraced_device_ms_per_step:
        return [Issue(Severity.WARNING, UNTRACED_DEVICE,
                      "The trace holds no device activity, yet the host's .item() calls waited "
                      f"{placement.untraced_device_ms_per_step:.2f} ms per step (milliseconds each; reading a CPU "
                      f"tensor takes microseconds): the model ran on {pytorch.UNTRACED_DEVICES}. PyTorch's "
                      "profiler records only the host's side of it, so the device's busy and idle time are "
                      "unknown and findings about the host are about dispatch, not compute.",
                      TORCH_UNTRACED_DEVICE, leads=True)]
    if placement.where == "cpu_only":
        # No GPU was listed at all: context, in every framework, and the run's own largest cost is
        # the first fix (a trace that lists a GPU the model never used is op_placement's finding).
        # The check is said in the text: the fix's code is not printed without -v.
        issues = [Issue(Severity.INFO, NO_GPU,
                        "If this machine has a GPU, PyTorch did not use it: torch.cuda.is_available() was False, "
                        "or the model and its batches stayed on the CPU." if torch
                        else "If this machine has a GPU, the framework did not see it: "
                        + _LISTS_GPUS.get(analysis.model.framework, _LISTS_GPUS["tensorflow"]) + ".",
                        CHECK_GPU_VISIBLE)]
        if not placement.ops_traced:
            issues.append(Issue(Severity.WARNING, "CPU ops not traced",
                                "The runtime ran the steps on its own threads but the host tracer recorded none "
                                "of their ops, so the CPU's compute is taken from the executor's activity; when "
                                "the CPU sat idle cannot be measured, and findings that rest on it are low "
                                "confidence.", HOST_TRACER))
        return issues
    if placement.where == "gpu_trace_lost" and not analysis.model.gpus:
        return [Issue(Severity.WARNING, TRACE_MISSING,
                      f"The host made {placement.launch_calls:,} GPU launch calls but the trace holds no device "
                      "activity at all (no kernel, copy or memset): the profiler did not record the GPU (its CUPTI "
                      "library could not trace this driver, or GPU activity was not requested). How long the GPU "
                      "worked and when it sat idle are unknown: nothing here says the device idled, and findings "
                      "about it are low confidence.", Remedy(CUPTI.text, CUPTI.code, CUPTI.doc, jax=CUPTI.jax,
                                                             pytorch=TORCH_CUPTI), leads=True)]
    if placement.where == "gpu_trace_lost":
        gpus = analysis.model.gpus
        return [Issue(Severity.WARNING, "Empty GPU trace",
                      "The capture has GPU planes but not a single kernel or copy on them, while the host "
                      "only dispatched ops (they last microseconds): the GPU ran the model but the profiler "
                      "could not record it, which happens when CUPTI is missing or the user may not profile "
                      "the GPU. Device time is unknown; findings about it are low confidence.", CUPTI,
                      [Evidence(kind="device", name=d.device.name, value=len(d), unit="events", host=d.device.host)
                       for d in gpus])]
    if placement.where == "host_despite_gpu":
        return [Issue(Severity.INFO, "The GPU trace is empty because the model ran on the CPU",
                      f"The model ran on the CPU: {'PyTorch' if torch else 'TensorFlow'} saw a GPU (the profiler "
                      "wrote its plane) but the "
                      f"model's ops ran on host threads, {placement.host_op_percent:.0f}% of the step, "
                      + ("most of them for milliseconds each" if placement.long_op_share >= LONG_OP_SHARE
                         else "and nothing on the host launched GPU work or sent it inputs")
                      + ": the GPU trace is empty because the GPU did nothing (see the op placement finding), "
                      "not because the profiler failed.")]
    return []


def _coverage_issues(analysis: Analysis) -> list[Issue]:
    trust = analysis.trust
    issues: list[Issue] = []
    # A wholly lost GPU trace is explained on its own (see _placement_issues).
    partial = trust.partial_devices if trust.placement.where != "gpu_trace_lost" else []
    if partial or trust.misaligned or trust.missing_work:
        parts = [f"{d.name}: {d.note}" + (f" ({'; '.join(d.used_because)})" if d.used_because else "")
                 for d in partial]
        parts += [f"{name}: its work for the same steps was traced at another time than the primary GPU's"
                  for name in trust.misaligned]
        parts += [trust.missing_work] if trust.missing_work else []
        used = f" The host drove {trust.expected_devices} device(s)." if trust.expected_devices else ""
        effect = (" Missing device time is not counted as idle: steps without device data are left out, "
                  "and findings that compare devices are low confidence." if partial or trust.misaligned else "")
        effect += (" Device idle time may be unrecorded work: findings that rest on it or on kernel shares "
                   "are low confidence." if trust.missing_work else "")
        issues.append(Issue(
            Severity.WARNING, "Partial device trace",
            "The device trace is partial: " + "; ".join(parts) + "." + used + effect, FULL_DEVICE_TRACE,
            [Evidence(kind="device", name=d.name, value=d.kernels, unit="kernels", detail=d.note, host=d.host)
             for d in partial]))
    queued = [d for d in trust.devices if d.covers_from_ps]
    if queued:
        issues.append(Issue(
            Severity.INFO, "Device busy with work from before the capture",
            "The capture opened while the device still ran work queued before it: "
            + "; ".join(f"{d.name} until {d.covers_from_ps / PS_PER_MS:.2f} ms (a blocking call waited for it)"
                        for d in queued)
            + ". The trace holds none of that work, so that time is counted as not traced, not as idle.",
            TORCH_SYNC_BEFORE_CAPTURE))
    if trust.retake:
        # One window without steps is the profiler recipe's capture of a first call: warm it up.
        one_window = trust.candidates.source == "window"
        issues.append(Issue(
            Severity.WARNING, "Warm-up capture: take it again after warm-up",
            f"The capture is to be taken again: {trust.retake}. It cannot show what a warmed-up "
            + ("call" if one_window else "step") + " costs: the device's idle time behind the set-up is "
            "counted as set-up, never as a host cost, and what is left is judged below (launch and idle "
            "times measured on it are low confidence).",
            replace(STEP_WINDOW, pytorch=TORCH_WARM_CALL) if one_window else STEP_WINDOW, leads=True))
    if trust.excluded:
        items = [Evidence(kind="step", name=f"step {e.number}", value=round((e.end_ps - e.start_ps) / PS_PER_MS, 3),
                          unit="ms", detail=e.reason, start_ms=round(e.start_ps / PS_PER_MS, 3),
                          end_ms=round(e.end_ps / PS_PER_MS, 3), tool="trace_viewer@")
                 for e in trust.excluded]
        issues.append(Issue(
            Severity.INFO, f"{len(trust.excluded)} step(s) left out",
            f"{len(trust.excluded)} of {len(trust.candidates)} steps are left out of every per-step number: "
            + "; ".join(f"step {e.number}: {e.reason}" for e in trust.excluded[:4])
            + ("; ..." if len(trust.excluded) > 4 else "") + ".", STEP_WINDOW, items))
    if trust.export_excluded_ms >= EXPORT_WORTH_SAYING_MS:
        issues.append(Issue(
            Severity.INFO, f"Profiler export excluded ({trust.export_excluded_ms:.2f} ms)",
            f"After the profiled step the TensorBoard callback exported the trace (an untraced stretch, then "
            f"summary ops carrying the step's group): {trust.export_excluded_ms:.2f} ms that training does not "
            "pay per step. It is cut off the step and left out of every number."))
    return issues


def _step_issues(analysis: Analysis) -> list[Issue]:
    model, trust = analysis.model, analysis.trust
    steps = model.steps
    n = len(steps)
    if trust.candidates.source == "none" or not len(trust.candidates):
        return [Issue(Severity.WARNING, "No training steps found",
                      "No step markers and no repeated function runs were found, so no per-step numbers can "
                      "be computed.", STEP_MARKERS)]
    issues: list[Issue] = []
    if trust.candidates.source.startswith("inferred"):
        issues.append(Issue(Severity.INFO, "Steps inferred",
                            f"Steps were inferred from repeated runs of {steps.marker_name or 'a function'}, "
                            "not from step markers.", STEP_MARKERS))
    elif trust.candidates.source == "window":
        issues.append(Issue(Severity.INFO, "No repeated step: one window",
                            "Nothing repeats in this capture the way training steps do (no markers, no "
                            "dominant repeated program), so it is analysed as one window: the numbers are per "
                            "capture, not per step.", STEP_MARKERS))
        return issues
    if steps.per_marker > 1:
        issues.append(Issue(Severity.INFO, f"{steps.per_marker} training steps per marker",
                            f"Each step marker covers {steps.per_marker} training steps (steps_per_execution): "
                            "every per-step number is per training step, i.e. divided by "
                            f"{steps.per_marker}."))
    if n == 1 and trust.single_step_atypical:
        issues.append(Issue(Severity.WARNING, "The only captured step is not typical",
                            "The capture holds one step and it is not a typical one: "
                            + "; ".join(trust.single_step_atypical) + ". Findings measured on it are low "
                            "confidence; profile later batches.", STEP_WINDOW))
    elif n == 1:
        issues.append(Issue(Severity.INFO, "One step captured",
                            "The capture holds one step"
                            + (". " if model.framework == pytorch.FRAMEWORK else
                               " (the Keras callback profiles batch 2 by default). ")
                            + "Nothing in it looks atypical (no autotuning, no compilation), so it is judged on "
                            "its own; a few more steps would show how much steps vary.", STEP_WINDOW))
    elif n == 2:
        issues.append(Issue(Severity.WARNING, "Only 2 steps count",
                            "Only 2 steps count; averages over so few steps are noisy and a single slow step "
                            "dominates them.", STEP_WINDOW))
    if n > MAX_STEPS:
        issues.append(Issue(Severity.INFO, f"{n} steps captured",
                            f"{n} steps were profiled; more than about {MAX_STEPS} makes traces large enough to "
                            "exhaust memory when captured or viewed, with nothing gained.", STEP_WINDOW))
    return issues


def unreadable(errors: list[dict], others_read: bool = True) -> Issue:
    """Host files that could not be read: the findings speak for the other hosts only (OTHERS_READ),
    or for nothing at all."""
    return Issue(Severity.WARNING, f"{len(errors)} host file(s) unreadable",
                 ("Some host files could not be read: " if others_read else "No host file could be read: ")
                 + "; ".join(f"{e.get('host')}: {e.get('message')}" for e in errors)
                 + (". Findings cover the other hosts only." if others_read else "."))


def _issues(analysis: Analysis) -> list[Issue]:
    model = analysis.model
    issues: list[Issue] = []
    if model.errors:
        issues.append(unreadable(model.errors, others_read=bool(model.hosts or model.devices)))
    if not model.hosts and not model.devices:
        return issues           # nothing was read: no step, placement or coverage to judge
    issues += (_placement_issues(analysis) + _host_issues(analysis) + _coverage_issues(analysis)
               + _step_issues(analysis))
    dropped = sum(h.dropped_events for h in model.hosts)
    if dropped or model.warnings:
        text = f"The profiler dropped {dropped} events." if dropped else "The profiler reported problems."
        if model.warnings:
            text += " " + "; ".join(model.warnings[:3])
        issues.append(Issue(Severity.WARNING, "Profiler dropped events or warned",
                            text + " Time in the missing events is unknown.", FULL_DEVICE_TRACE))
    return issues


def with_unreadable(finding: Finding, errors: list[dict]) -> Finding:
    """FINDING of a many-host session some of whose host files (ERRORS) could not be read."""
    issue = unreadable(errors)
    worse = finding.severity.weight < issue.severity.weight
    return replace(finding, summary=f"{finding.summary} {issue.text}",
                   severity=issue.severity if worse else finding.severity,
                   title=issue.title if worse else finding.title)


@register(CHECK_ID, "Profile quality", __doc__,
          what_if=NoReplay("it judges the capture, not the training step"), aspect="capture",
          explains="one-time set-up",
          compared=Compared(timed=False), worst_host=True,
          # Counts of the capture add up over hosts.
          per_host=PerHostJoin(summed=("gpu_count", "active_gpu_count", "dropped_events"),
                               unreadable=with_unreadable),
          marks=NoMarks("it judges the capture, not the training step"))
def check(analysis: Analysis) -> Finding:
    model, trust = analysis.model, analysis.trust
    kind, what = capture_kind(analysis)
    issues = _issues(analysis)
    severity = max((i.severity for i in issues), key=lambda s: s.weight, default=Severity.OK)
    summary = f"This is {what}."
    if trust.candidates.source != "none":
        n, total = len(model.steps), len(trust.candidates)
        counted = f"{n} of them count" if n != total else ("it counts" if n == 1 else "all count")
        summary += (f" {total} step{' was' if total == 1 else 's were'} found "
                    f"({_SOURCES.get(trust.candidates.source, trust.candidates.source)}); {counted}.")
    summary += (" " + " ".join(i.text for i in issues)) if issues else " Nothing in it limits the analysis."
    worst = [i for i in issues if i.severity is severity or i.title in (NO_GPU, UNTRACED_DEVICE)]
    title = ("; ".join(i.title for i in worst) if issues and severity is not Severity.OK
             else "Capture is complete and usable")
    fix_list: list[Fix] = []
    for issue in sorted(issues, key=lambda i: -i.severity.weight):
        if issue.fix is not None and issue.fix not in fix_list:
            fix_list.append(issue.fix)
    return Finding(
        check=CHECK_ID, severity=severity, title=title, summary=summary,
        metrics={"capture_kind": kind, "model_ran_on": trust.placement.where, "steps_count": len(model.steps),
                 "candidate_steps": len(trust.candidates), "excluded_steps": len(trust.excluded),
                 "step_source": trust.candidates.source, "gpu_count": len(model.gpus),
                 "active_gpu_count": len(model.active_gpus), "partial_device_trace": trust.partial,
                 "profiler_export_excluded_ms": round(trust.export_excluded_ms, 3),
                 "steps_per_execution": model.steps.per_marker,
                 "dropped_events": sum(h.dropped_events for h in model.hosts),
                 **({"leads": True} if any(i.leads for i in issues) else {})},
        estimated_savings_ms_per_step=0.0,
        evidence=[e for i in issues for e in i.evidence],
        fixes=fix_list,
    )
