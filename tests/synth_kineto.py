"""Synthetic PyTorch profiler (Kineto) traces, shaped like the corpus's for what it lacks.

``kineto_trace`` lays out steps of a training loop on one GPU: a ``ProfilerStep#N`` annotation,
an optional DataLoader wait at its start, then kernels, each launched by a ``cudaLaunchKernel``
call of the same correlation id and run on the GPU right after it.  ``old`` writes the PyTorch
1.8 spellings (``Operator``/``Runtime``/``Kernel``, integer microseconds), otherwise the newer
ones (``cpu_op``/``user_annotation``/``cuda_runtime``/``kernel``, floats counted from
``baseTimeNanoseconds``).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

EPOCH_US = 1_700_000_000_000_000


def kineto_trace(steps: int = 4, kernels: int = 20, kernel_us: float = 400.0, launch_us: float = 10.0,
                 input_us: float = 0.0, old: bool = False, device: bool = True, hip: bool = False,
                 first_step: int = 5, copy_us: float = 0.0,
                 copy_name: str = "Memcpy HtoD (Pageable -> Device)", copy_bytes: int = 1 << 20,
                 sync_us: float = 0.0, collectives: tuple[tuple[str, str, int, float], ...] = (),
                 memory: tuple[int, ...] = (), kernel_names: tuple[str, ...] = (),
                 op_chains: tuple[tuple[str, ...], ...] = (), device_properties: dict | None = None) -> dict:
    """A trace dict; every time in microseconds.  COPY_US: each step starts with a host-to-device
    copy of that length (COPY_NAME, COPY_BYTES) issued by cudaMemcpyAsync, before its kernels.
    SYNC_US: each step ends with ``loss.item()`` called from ``train.py(42): train_step`` (with
    Python frames, as ``with_stack=True`` records them), which waits for the GPU, then SYNC_US of
    Python in ``train.py(50): log_metrics`` while the GPU has nothing to do.
    COLLECTIVES: after its kernels each step issues these (collective name as c10d writes it,
    NCCL kernel, elements, kernel us), each as ProcessGroupNCCL does: a ``record_param_comms`` op
    holding its args (float32, a group of 8 ranks named "0") around a ``nccl:<collective>``
    annotation around the launch; the kernel runs on its own stream with nothing alongside.
    MEMORY: the GPU allocator's ``[memory]`` events of each step, one per value of Total Allocated
    (bytes, reserved = the running maximum), plus a host (CPU) one that must be ignored.
    KERNEL_NAMES: the kernels' names, in turn (default ``void gemm_kernel_{k % 3}<float>()``);
    OP_CHAINS: the cpu_ops around each kernel's launch, outermost first, in turn (default
    ``("aten::mm",)``), each nested one starting 0.1 us after and ending 0.1 us before its parent;
    DEVICE_PROPERTIES: fields that replace the GPU's deviceProperties (new spellings only)."""
    cat = ({"op": "Operator", "annotation": "Operator", "runtime": "Runtime", "kernel": "Kernel"} if old else
           {"op": "cpu_op", "annotation": "user_annotation", "runtime": "cuda_runtime", "kernel": "kernel"})
    launch = "hipLaunchKernel" if hip else "cudaLaunchKernel"
    base = EPOCH_US if old else 1000.0
    events: list[dict] = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "python"}}]
    t, corr = base, 1
    for s in range(steps):
        step_start = t
        step_events = []
        if input_us:
            step_events.append({"ph": "X", "cat": cat["annotation"], "name":
                                "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                                "pid": 1, "tid": 7, "ts": t, "dur": input_us})
            t += input_us
        gpu_free = t
        if copy_us and device:
            step_events.append({"ph": "X", "cat": cat["runtime"], "name": "cudaMemcpyAsync", "pid": 1, "tid": 7,
                                "ts": t + 1, "dur": launch_us, "args": {"correlation": corr}})
            step_events.append({"ph": "X", "cat": "Memcpy" if old else "gpu_memcpy", "name": copy_name,
                                "pid": 0, "tid": 8, "ts": t + launch_us + 2, "dur": copy_us,
                                "args": {"device": 0, "stream": 8, "correlation": corr, "bytes": copy_bytes}})
            gpu_free = t + launch_us + 2 + copy_us
            t += launch_us + 3
            corr += 1
        for k in range(kernels):
            op_start = t
            step_events.append({"ph": "X", "cat": cat["runtime"], "name": launch, "pid": 1, "tid": 7,
                                "ts": t + 1, "dur": launch_us, "args": {"correlation": corr}})
            if device:
                start = max(t + launch_us + 2, gpu_free)
                kernel = kernel_names[k % len(kernel_names)] if kernel_names else f"void gemm_kernel_{k % 3}<float>()"
                step_events.append({"ph": "X", "cat": cat["kernel"], "name": kernel,
                                    "pid": 0, "tid": 7, "ts": start, "dur": kernel_us,
                                    "args": {"device": 0, "stream": 7, "correlation": corr}})
                gpu_free = start + kernel_us
            t += launch_us + 3
            chain = op_chains[k % len(op_chains)] if op_chains else ("aten::mm",)
            step_events += [{"ph": "X", "cat": cat["op"], "name": op, "pid": 1, "tid": 7, "ts": op_start + 0.1 * depth,
                             "dur": t - op_start - 0.2 * depth} for depth, op in enumerate(chain)]
            corr += 1
        for collective, kernel, elements, us in collectives:
            comm = {"Collective name": collective, "In msg nelems": elements, "Out msg nelems": elements,
                    "dtype": "Float", "Group size": 8, "Process Group Name": "0",
                    "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]"}
            step_events += [
                {"ph": "X", "cat": cat["op"], "name": "record_param_comms", "pid": 1, "tid": 7, "ts": t,
                 "dur": launch_us + 4, "args": comm},
                {"ph": "X", "cat": cat["annotation"], "name": f"nccl:{collective}", "pid": 1, "tid": 7,
                 "ts": t + 0.5, "dur": launch_us + 3},
                {"ph": "X", "cat": cat["runtime"], "name": launch, "pid": 1, "tid": 7, "ts": t + 1,
                 "dur": launch_us, "args": {"correlation": corr}}]
            if device:
                start = max(t + launch_us + 2, gpu_free)
                step_events.append({"ph": "X", "cat": cat["kernel"], "name": kernel, "pid": 0, "tid": 9,
                                    "ts": start, "dur": us, "args": {"device": 0, "stream": 9, "correlation": corr}})
                gpu_free = start + us
            t += launch_us + 5
            corr += 1
        reserved = 0
        for k, allocated in enumerate(memory):
            reserved = max(reserved, allocated)
            step_events += [{"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1,
                             "tid": 7, "ts": step_start + k,
                             "args": {"Total Allocated": allocated, "Total Reserved": reserved, "Bytes": 512,
                                      "Device Type": 1, "Device Id": 0, "Addr": 1 << 40}},
                            {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1,
                             "tid": 7, "ts": step_start + k + 0.5,
                             "args": {"Total Allocated": 1 << 50, "Total Reserved": 0, "Bytes": 8,
                                      "Device Type": 0, "Device Id": -1, "Addr": 1 << 41}}]
        if sync_us and device:
            wait_end = max(t + 5, gpu_free)
            frame = {"ph": "X", "cat": "python_function", "pid": 1, "tid": 7}
            step_events += [
                {**frame, "name": "train.py(42): train_step", "ts": t, "dur": wait_end + 3 - t},
                {**frame, "name": "torch/_tensor.py(100): __torch_function__", "ts": t + 0.5, "dur": wait_end + 2 - t},
                {"ph": "X", "cat": cat["op"], "name": "aten::item", "pid": 1, "tid": 7, "ts": t + 1,
                 "dur": wait_end + 1 - t},
                {"ph": "X", "cat": cat["op"], "name": "aten::_local_scalar_dense", "pid": 1, "tid": 7, "ts": t + 1.5,
                 "dur": wait_end + 0.5 - t},
                {"ph": "X", "cat": cat["runtime"], "name": "cudaStreamSynchronize", "pid": 1, "tid": 7,
                 "ts": t + 2, "dur": wait_end - t - 2},
                {**frame, "name": "train.py(50): log_metrics", "ts": wait_end + 4, "dur": sync_us}]
            t = wait_end + 4 + sync_us
        t = max(t, gpu_free) + 5
        events.append({"ph": "X", "cat": cat["annotation"], "name": f"ProfilerStep#{first_step + s}",
                       "pid": 1, "tid": 7, "ts": step_start, "dur": t - step_start})
        events += step_events
    if old:
        for e in events:
            if "ts" in e:
                e["ts"], e["dur"] = int(round(e["ts"])), int(round(e["dur"]))
    trace = {"schemaVersion": 1, "traceEvents": events}
    if not old:
        trace["baseTimeNanoseconds"] = 1_700_000_000_000_000_000
        trace["deviceProperties"] = [{"id": 0, "name": "AMD Instinct MI300X" if hip else "NVIDIA A100-SXM4-40GB",
                                      "totalGlobalMem": 42_505_273_344, "computeMajor": 9 if hip else 8,
                                      "computeMinor": 4 if hip else 0, "numSms": 304 if hip else 108,
                                      **(device_properties or {})}]
    return trace


def write_trace(path: Path, trace: dict) -> Path:
    """TRACE as JSON at PATH (gzip when PATH ends in .gz)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(trace).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path
