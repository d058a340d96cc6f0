"""Where the model ran: the first thing to know before any GPU advice.

Four situations look alike at first sight (a GPU plane with no kernels, or no GPU plane):
- ``cpu_only``: the machine has no accelerator; the host is the device.
- ``host_despite_gpu``: TensorFlow saw a GPU (the profiler wrote its plane) but the model's
  ops executed on host compute threads, milliseconds each, or for any time while nothing on the
  host drove the GPU (no launch call, no function input sent to it): a CPU-only TensorFlow build,
  CUDA/cuDNN libraries that do not match it, or ops pinned to the CPU.
- ``gpu_trace_lost``: the GPU ran the model but the profiler recorded no device events
  (CUPTI missing or not permitted): host op events are short dispatches and launch calls.
- ``gpu`` / ``tpu``: device events are present.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tb_gpuadvisor.arrays import kept_mask
from tb_gpuadvisor.model import intervals as iv
from tb_gpuadvisor.model.kernels import name_mask, named_events, op_type
from tb_gpuadvisor.timeline import (
    PS_PER_MS, PS_PER_US, DeviceActivity, HostActivity, SessionModel, Steps,
)
from tb_gpuadvisor.kinds import HostEventKind
from tb_gpuadvisor.vocab import jax, pytorch, tensorflow
from tb_gpuadvisor.stages import Memo

# What this stage derives from the tables and asks for again (see stages.Memo).
_MEMO = Memo()

# Host op time (as a share of the step) above which the model, not a stray op, ran on the host.
MODEL_ON_HOST_SHARE = 0.5
# A model op that computes on the host runs this long or longer; a GPU op's host dispatch takes
# microseconds. The model ran on the host when most host op time is in such ops.
HOST_COMPUTE_OP_PS = 100 * PS_PER_US
LONG_OP_SHARE = 0.5
TOP = 5
# GPU launch calls per step from which a capture without device events ran on a GPU whose trace
# is missing (a training step launches hundreds; a CPU run none).
LOST_TRACE_LAUNCHES = 10


def step_threads(activity: HostActivity) -> np.ndarray:
    """Per event: is it on a thread that runs the step (tf.data's producers run ahead of it)?
    Kept in trust's memo: trust, the breakdown and the checks all ask (read-only)."""
    mask = _MEMO.of(activity).get("step_threads")
    if mask is None:
        pipeline = name_mask(activity.threads, tensorflow.is_input_pipeline_thread)
        mask = ~pipeline[activity.thread] if activity.threads else np.ones(len(activity), bool)
        mask = _MEMO.of(activity)["step_threads"] = kept_mask(mask)
    return mask


def executor_work_mask(activity: HostActivity) -> np.ndarray:
    """The graph running on the CPU: every event on the runtime's own step threads, those that
    execute ops or the executor (``tf_Compute`` and Eigen's pools run ``ExecutorState::Process``,
    and under ``jit_compile`` XLA's executable and its HLO ops, which no op vocabulary names),
    allocator records aside.

    The threads that call into TensorFlow's runtime (they carry the step markers and function
    calls) only wait on it, so their executor events are dispatch, not compute; but where the
    tracer recorded no compute op on the runtime's threads, the graph calls themselves
    (``FunctionRun``, the dispatch of ``__inference_...``) count: the function runs for all of
    them, and whether the CPU sat idle inside one cannot be seen. JAX's program calls
    (``PjitFunction(f)``) always count: the calling thread itself prepares and dispatches each
    program onto the same CPU, which for an op-by-op loop is most of the step's work.
    """
    if not activity.threads:
        return np.zeros(len(activity), bool)
    calls = activity.mask(HostEventKind.STEP_MARKER, HostEventKind.FUNCTION)
    callers = np.zeros(len(activity.threads), bool)
    callers[np.unique(activity.thread[calls])] = True
    # The runtime's threads are the ones it executes on (other threads, say a Python helper's, are not).
    executes = np.zeros(len(activity.threads), bool)
    executes[np.unique(activity.thread[activity.mask(HostEventKind.EXECUTOR, HostEventKind.FRAMEWORK_OP)])] = True
    work = ~activity.mask(HostEventKind.MEMORY, HostEventKind.STEP_MARKER, HostEventKind.FUNCTION,
                          HostEventKind.INPUT_WAIT, HostEventKind.INPUT_STAGE)
    runtime = step_threads(activity) & (executes & ~callers)[activity.thread]
    mask = work & runtime
    if not np.any(compute_op_mask(activity) & runtime):
        mask = mask | named_events(activity, "graph_call", tensorflow.GRAPH_CALL.search)
    return mask | named_events(activity, "jax_call", jax.FUNCTION.match)


def compute_op_mask(activity: HostActivity) -> np.ndarray:
    """Framework op events on step threads that compute (not bookkeeping); kept in trust's
    memo (read-only), as ``step_threads``."""
    mask = _MEMO.of(activity).get("compute_ops")
    if mask is None:
        computes = name_mask(activity.names, lambda n: op_type(n) not in tensorflow.BOOKKEEPING_OPS)
        mask = (activity.kind == HostEventKind.FRAMEWORK_OP) & step_threads(activity) & computes[activity.name]
        mask = _MEMO.of(activity)["compute_ops"] = kept_mask(mask)
    return mask


def grouped_steps(steps: Steps) -> bool:
    """Whether the capture groups events by step (TensorFlow's group ids on the step markers)."""
    return bool(np.any(steps.group_id >= 0))


def host_op_mask(activity: HostActivity, gpus: list[DeviceActivity], steps: Steps) -> np.ndarray:
    """Framework op events of the step itself that executed on the host (dispatched no GPU work).

    tf.data runs its map functions' ops ahead of the step: on its own threads, or on the
    runtime's threads without the step's group id when the capture groups events by step
    (no group, or the group of the batch they prepare). Those are input work (input_bound's
    evidence), not misplaced model ops, wherever they run.
    """
    device_ops = {tensorflow.op_key(o) for dev in gpus for o in dev.ops}

    def runs_on_host(name: str) -> bool:
        return (tensorflow.is_graph_op(name) and op_type(name) not in tensorflow.BOOKKEEPING_OPS
                and tensorflow.op_key(name) not in device_ops)

    table = name_mask(activity.names, runs_on_host)
    return of_the_step(activity, compute_op_mask(activity) & (activity.step >= 0) & table[activity.name], steps)


def of_the_step(activity: HostActivity, mask: np.ndarray, steps: Steps, grouped_ops: bool = False) -> np.ndarray:
    """MASK (op events inside steps, a fresh array) less the ops tf.data's functions ran on the
    runtime's threads: when the capture groups events by step, those carry no group or another
    step's. GROUPED_OPS: also when only the ops are grouped (steps inferred from function runs
    carry no group id, but the runtime still gave the step's ops theirs)."""
    rows = np.flatnonzero(mask)
    group = activity.group_id[rows]
    if grouped_steps(steps):
        # Only the few ops picked so far are judged by group (inside a step, so its group is known).
        own = steps.group_id[activity.step[rows]]
        mask[rows[(group < 0) | ((own >= 0) & (group != own))]] = False
    elif grouped_ops and np.any(group >= 0):
        mask[rows[group < 0]] = False
    return mask


@dataclass
class Placement:
    """Where the model's work ran, with the host ops that say so."""

    where: str                      # gpu | tpu | cpu_only | host_despite_gpu | gpu_trace_lost | unknown
    host_op_percent: float = 0.0    # host compute-op time (union) as a share of step time
    host_op_ms_per_step: float = 0.0
    long_op_share: float = 0.0      # share of host op time in ops lasting HOST_COMPUTE_OP_PS or more
    ops: list[dict] = field(default_factory=list)   # heaviest host op types: type, ms_per_step, calls_per_step
    launch_calls: int = 0
    # False when the runtime ran the steps (executor activity) but the host tracer recorded none
    # of their ops: CPU compute is then known only as executor time, and idle time not at all.
    ops_traced: bool = True
    # cpu_only PyTorch captures: time per step the host waited in value read-backs lasting
    # milliseconds (``untraced_device_waits``): the model ran on a device the profiler does not trace.
    untraced_device_ms_per_step: float = 0.0

    def to_json(self) -> dict:
        out = {"where": self.where, "host_op_percent": round(self.host_op_percent, 2),
               "host_op_ms_per_step": round(self.host_op_ms_per_step, 3),
               "long_host_op_share": round(self.long_op_share, 3), "top_host_ops": self.ops}
        if not self.ops_traced:
            out["ops_traced"] = False
        if self.untraced_device_ms_per_step:
            out["untraced_device_wait_ms_per_step"] = round(self.untraced_device_ms_per_step, 3)
        return out


def _host_ops(model: SessionModel, steps: Steps) -> tuple[float, float, float, list[dict], int]:
    """(percent of step time, ms per step, share of op time in long ops, heaviest op types, launch
    calls) of host compute ops."""
    windows = iv.union(steps.start_ps, steps.end_ps) if len(steps) else iv.EMPTY
    step_ps = iv.total(windows)
    n = max(steps.training_steps, 1)
    covered, launches = 0, 0
    durations: list[np.ndarray] = []
    per_type: dict[str, list[float]] = {}
    for host in model.hosts:
        act = host.activity
        launches += int(np.count_nonzero(act.kind == HostEventKind.LAUNCH))
        pick = compute_op_mask(act)
        if len(steps):
            pick = pick & (steps.locate(act.start_ps) >= 0)
        idx = np.flatnonzero(pick)
        if not idx.size:
            continue
        ops = iv.union(act.start_ps[idx], act.end_ps[idx])
        covered += iv.overlap(ops, windows) if len(steps) else iv.total(ops)
        durations.append(act.dur_ps[idx])
        types = np.array([op_type(act.names[i]) for i in range(len(act.names))], dtype=object)
        uniq, inverse = np.unique(types[act.name[idx]].astype(str), return_inverse=True)
        time_ps = np.bincount(inverse, weights=act.dur_ps[idx])
        calls = np.bincount(inverse)
        for name, t, c in zip(uniq, time_ps, calls):
            entry = per_type.setdefault(str(name), [0.0, 0.0])
            entry[0] += float(t)
            entry[1] += float(c)
    total_ps = step_ps if len(steps) else max(covered, 1)
    percent = 100.0 * covered / total_ps if total_ps else 0.0
    all_durations = np.concatenate(durations) if durations else np.empty(0, np.int64)
    op_ps = float(all_durations.sum())
    long_share = float(all_durations[all_durations >= HOST_COMPUTE_OP_PS].sum()) / op_ps if op_ps else 0.0
    top = sorted(per_type.items(), key=lambda kv: -kv[1][0])[:TOP]
    ops = [{"op": name, "ms_per_step": round(t / PS_PER_MS / n, 3), "calls_per_step": round(c / n, 1)}
           for name, (t, c) in top]
    return percent, covered / PS_PER_MS / n, long_share, ops, launches


def where_it_ran(model: SessionModel, steps: Steps) -> Placement:
    """Decide where the model ran (see the module docstring); unknown when no host or device
    could be read at all (every file unreadable): nothing says whether it had a GPU."""
    if not model.hosts and not model.devices:
        return Placement("unknown")
    if model.active_gpus:
        return Placement("gpu")
    if any(d.device.kind == "tpu" and len(d) for d in model.devices):
        return Placement("tpu")
    percent, ms, long_share, ops, launches = _host_ops(model, steps)
    if not model.gpus and launches >= LOST_TRACE_LAUNCHES * max(steps.training_steps, 1):
        # The host launched GPU work step after step, yet no device event was recorded (PyTorch's
        # Kineto writes no device at all then): the device trace is missing, not the GPU.
        return Placement("gpu_trace_lost", percent, ms, long_share, ops, launches)
    if not model.gpus:
        ran = any(bool(np.any(executor_work_mask(h.activity) & (steps.locate(h.activity.start_ps) >= 0)))
                  for h in model.hosts) if len(steps) else False
        waits = untraced_device_waits(model, steps) if model.framework == pytorch.FRAMEWORK else 0.0
        return Placement("cpu_only", percent, ms, long_share, ops, launches, ops_traced=percent > 0 or not ran,
                         untraced_device_ms_per_step=waits)
    on_host = percent >= 100 * MODEL_ON_HOST_SHARE and long_share >= LONG_OP_SHARE
    if not on_host and not launches and percent > 0 and not _sends_to_gpu(model):
        # Nothing on the host drove a GPU: no launch call, and none of the copies TensorFlow makes
        # of a GPU function's inputs (its own events, recorded without CUPTI), while the step's
        # model ops ran on host threads: a small model's ops are short on the CPU too.
        on_host = True
    return Placement("host_despite_gpu" if on_host else "gpu_trace_lost", percent, ms, long_share, ops, launches)


def untraced_device_waits(model: SessionModel, steps: Steps) -> float:
    """Ms per step the host spent in value read-backs (``.item()``) whose median call lasts
    ``vocab.pytorch.UNTRACED_DEVICE_WAIT_PS`` or more, in a capture with no device: reading a CPU
    tensor takes microseconds, so these waited for a device the profiler does not trace."""
    durations = []
    for host in model.hosts:
        act = host.activity
        reads = named_events(act, "read_back", pytorch.is_read_back)
        if len(steps):
            reads = reads & (steps.locate(act.start_ps) >= 0)
        durations.append(act.dur_ps[reads])
    found = np.concatenate(durations) if durations else np.empty(0, np.int64)
    if not found.size or np.median(found) < pytorch.UNTRACED_DEVICE_WAIT_PS:
        return 0.0
    return float(found.sum()) / PS_PER_MS / max(len(steps), 1)


def _sends_to_gpu(model: SessionModel) -> bool:
    """Whether a host sent a function's inputs to a GPU (``IteratorGetNext/_1:_Send``, ``_Send input
    0 from ...CPU:0 to ...GPU:0``): what TensorFlow does when the model's ops are placed on one."""
    return any(tensorflow.INPUT_SEND.search(name) for host in model.hosts for name in host.activity.names)
