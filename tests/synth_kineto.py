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
OPTIMIZER_KERNELS = 20
_DEVICE_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}


def kineto_trace(steps: int = 4, kernels: int = 20, kernel_us: float = 400.0, launch_us: float = 10.0,
                 input_us: float = 0.0, old: bool = False, device: bool = True, hip: bool = False,
                 first_step: int = 5, copy_us: float = 0.0,
                 copy_name: str = "Memcpy HtoD (Pageable -> Device)", copy_bytes: int = 1 << 20,
                 sync_us: float = 0.0, collectives: tuple[tuple[str, str, int, float], ...] = (),
                 memory: tuple[int, ...] = (), ahead: bool = False, queued: int = 0, cpu_input_us: float = 0.0,
                 silent_us: float = 0.0, lazy_loads: int = 0, compile_us: float = 0.0,
                 final_sync_us: float = 0.0, sync_every: int = 0, lead: int = 0, autotune: int = 0,
                 kernel_names: tuple[str, ...] = (), op_chains: tuple[tuple[str, ...], ...] = (),
                 device_properties: dict | None = None, kernel_durations: tuple[float, ...] = (),
                 item_copy: bool = False, graph_us: float = 0.0, host: bool = True,
                 gpu_steps: bool = False, copy_staging_us: float = 0.0, preprocess_us: float = 0.0,
                 preprocess_name: str = "preprocess") -> dict:
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
    AHEAD: a step ends when its launches are made, not when the GPU ran them (no sync inside the
    step, as with torch.compile or large batches): the host runs ahead and the GPU's queue grows.
    QUEUED: that many more steps' launches follow the last marked one, with no ProfilerStep#N of
    their own (the host was a step ahead when the profiler stopped); LEAD: that many steps' launches
    come before the first marked one, with no marker (recorded before the first ProfilerStep#N).
    CPU_INPUT_US: each step first makes its input on the CPU (``aten::randn``, that long; then
    COPY_US gives the ``.to('cuda')``).  SILENT_US: each step's first kernel (``my_custom_kernel``)
    is launched after that much host work the profiler did not record.  LAZY_LOADS: the first
    step's first launches each load their kernel (a ``cuModuleLoadData`` driver call of 300 us
    inside the launch).  COMPILE_US: the first step starts with torch.compile's compilation
    (``_compile.compile_inner (dynamo_timed)``).  FINAL_SYNC_US: the last step ends in a
    ``cudaDeviceSynchronize`` that returns that long after the last kernel.  SYNC_EVERY: after every
    that many kernels the host reads a value back (``aten::item`` around a ``cudaStreamSynchronize``
    that waits for the GPU to finish), then goes on launching.  AUTOTUNE: the first step starts
    with one ``aten::cudnn_convolution`` call that times that many algorithms (cudnn.benchmark):
    as many 1 ms ``implicit_convolve_sgemm`` kernels, then a ``cudaEventSynchronize`` for them.
    KERNEL_NAMES: the kernels' names, in turn (default ``void gemm_kernel_{k % 3}<float>()``);
    OP_CHAINS: the cpu_ops around each kernel's launch, outermost first, in turn (default
    ``("aten::mm",)``), each nested one starting 0.1 us after and ending 0.1 us before its parent;
    DEVICE_PROPERTIES: fields that replace the GPU's deviceProperties (new spellings only).
    KERNEL_DURATIONS: the kernels' durations in us, in turn (default KERNEL_US for every kernel).
    ITEM_COPY: SYNC_US's ``loss.item()`` waits in a blocking ``cudaMemcpyAsync`` of its 4 bytes
    device-to-host (as ``_local_scalar_dense`` does), not in a ``cudaStreamSynchronize``.
    GRAPH_US: each step's kernels are one CUDA graph replay (``CompiledFunction`` around a single
    ``cudaGraphLaunch`` call that long, whose correlation id all of them carry), 6 us apart on the GPU.
    HOST: False leaves out every host event (a capture of ``ProfilerActivity.CUDA`` only), keeping
    the device's.  GPU_STEPS: each ``ProfilerStep#N`` is also written on the GPU
    (``gpu_user_annotation`` on the device's pid/tid) over the span of that step's device work.
    COPY_STAGING_US: COPY_US's call first stages the pageable batch on the host that long (the
    call lasts the staging and the copy, whose device event starts once it is staged).
    PREPROCESS_US: each step first prepares its input on the host inside
    ``record_function(PREPROCESS_NAME)`` (a ``user_annotation`` that long), as an inference loop
    calling an image processor does: Python frames (``with_stack=True``) of the processor's
    ``__call__``, PIL's resize taking 80% of it, then ``aten::stack`` of the images (CPU tensors,
    no launch) in its last 5%; nothing runs on the GPU meanwhile."""
    cat = ({"op": "Operator", "annotation": "Operator", "runtime": "Runtime", "kernel": "Kernel"} if old else
           {"op": "cpu_op", "annotation": "user_annotation", "runtime": "cuda_runtime", "kernel": "kernel"})
    launch = "hipLaunchKernel" if hip else "cudaLaunchKernel"
    base = EPOCH_US if old else 1000.0
    events: list[dict] = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "python"}}]
    t, corr = base, 1
    gpu_free = t
    for s in range(-lead, steps + queued):
        step_start = t
        step_events = []
        if input_us:
            step_events.append({"ph": "X", "cat": cat["annotation"], "name":
                                "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                                "pid": 1, "tid": 7, "ts": t, "dur": input_us})
            t += input_us
        if compile_us and s == 0:
            step_events.append({"ph": "X", "cat": "python_function", "name": "_compile.compile_inner (dynamo_timed)",
                                "pid": 1, "tid": 7, "ts": t, "dur": compile_us})
            t += compile_us
        if autotune and s == 0:
            op_start = t
            for _ in range(autotune):
                step_events.append({"ph": "X", "cat": cat["runtime"], "name": launch, "pid": 1, "tid": 7,
                                    "ts": t + 1, "dur": launch_us, "args": {"correlation": corr}})
                start = max(t + launch_us + 2, gpu_free)
                step_events.append({"ph": "X", "cat": cat["kernel"], "name": "implicit_convolve_sgemm", "pid": 0,
                                    "tid": 7, "ts": start, "dur": 1000.0,
                                    "args": {"device": 0, "stream": 7, "correlation": corr}})
                gpu_free = start + 1000.0
                t += launch_us + 3
                corr += 1
            step_events += [{"ph": "X", "cat": cat["runtime"], "name": "cudaEventSynchronize", "pid": 1, "tid": 7,
                             "ts": t, "dur": gpu_free - t},
                            {"ph": "X", "cat": cat["op"], "name": "aten::cudnn_convolution", "pid": 1, "tid": 7,
                             "ts": op_start, "dur": gpu_free + 1 - op_start}]
            t = gpu_free + 2
        if preprocess_us:
            frame = {"ph": "X", "cat": "python_function", "pid": 1, "tid": 7}
            step_events += [
                {"ph": "X", "cat": cat["annotation"], "name": preprocess_name, "pid": 1, "tid": 7, "ts": t,
                 "dur": preprocess_us},
                {**frame, "name": "transformers/image_processing_utils.py(41): __call__", "ts": t + 1,
                 "dur": preprocess_us - 2},
                {**frame, "name": "PIL/Image.py(2200): resize", "ts": t + 2, "dur": 0.8 * preprocess_us},
                {"ph": "X", "cat": cat["op"], "name": "aten::stack", "pid": 1, "tid": 7,
                 "ts": t + 0.95 * preprocess_us - 2, "dur": 0.05 * preprocess_us}]
            t += preprocess_us
        if cpu_input_us:
            step_events += [{"ph": "X", "cat": cat["op"], "name": "aten::randn", "pid": 1, "tid": 7, "ts": t,
                             "dur": cpu_input_us},
                            {"ph": "X", "cat": cat["op"], "name": "aten::normal_", "pid": 1, "tid": 7, "ts": t + 1,
                             "dur": cpu_input_us - 2}]
            t += cpu_input_us
        gpu_free = max(gpu_free, t)      # a GPU behind the host (AHEAD) still runs earlier steps' work
        if copy_us and device:
            call_us = copy_staging_us + copy_us + 1 if copy_staging_us else launch_us
            step_events.append({"ph": "X", "cat": cat["runtime"], "name": "cudaMemcpyAsync", "pid": 1, "tid": 7,
                                "ts": t + 1, "dur": call_us, "args": {"correlation": corr}})
            copy_at = t + 1 + copy_staging_us if copy_staging_us else t + launch_us + 2
            step_events.append({"ph": "X", "cat": "Memcpy" if old else "gpu_memcpy", "name": copy_name,
                                "pid": 0, "tid": 8, "ts": copy_at, "dur": copy_us,
                                "args": {"device": 0, "stream": 8, "correlation": corr, "bytes": copy_bytes}})
            gpu_free = copy_at + copy_us
            t += call_us + 3
            corr += 1
        if graph_us:
            step_events += [{"ph": "X", "cat": cat["op"], "name": "CompiledFunction", "pid": 1, "tid": 7, "ts": t,
                             "dur": graph_us + 2},
                            {"ph": "X", "cat": cat["runtime"], "name": "cudaGraphLaunch", "pid": 1, "tid": 7,
                             "ts": t + 1, "dur": graph_us, "args": {"correlation": corr}}]
            for k in range(kernels if device else 0):
                start = max(t + 3, gpu_free + 6) if k else max(t + 3, gpu_free)
                step_events.append({"ph": "X", "cat": cat["kernel"], "pid": 0, "tid": 7, "ts": start,
                                    "dur": kernel_us, "args": {"device": 0, "stream": 7, "correlation": corr},
                                    "name": kernel_names[k % len(kernel_names)] if kernel_names else "gemm"})
                gpu_free = start + kernel_us
            t += graph_us + 3
            corr += 1
        for k in range(0 if graph_us else kernels):
            t += silent_us if k == 0 else 0.0
            op_start = t
            load = 300.0 if s == 0 and k < lazy_loads else 0.0
            step_events.append({"ph": "X", "cat": cat["runtime"], "name": launch, "pid": 1, "tid": 7,
                                "ts": t + 1, "dur": launch_us + load, "args": {"correlation": corr}})
            if load:
                step_events.append({"ph": "X", "cat": "cuda_driver", "name": "cuModuleLoadData", "pid": 1,
                                    "tid": 7, "ts": t + 1.5, "dur": load - 1})
            if device:
                start = max(t + load + launch_us + 2, gpu_free)
                kernel = ("my_custom_kernel" if silent_us and k == 0 else
                          kernel_names[k % len(kernel_names)] if kernel_names else f"void gemm_kernel_{k % 3}<float>()")
                dur = kernel_durations[k % len(kernel_durations)] if kernel_durations else kernel_us
                step_events.append({"ph": "X", "cat": cat["kernel"], "name": kernel,
                                    "pid": 0, "tid": 7, "ts": start, "dur": dur,
                                    "args": {"device": 0, "stream": 7, "correlation": corr}})
                gpu_free = start + dur
            t += load + launch_us + 3
            if sync_every and device and (k + 1) % sync_every == 0:
                wait_end = max(t + 2, gpu_free)
                step_events += [{"ph": "X", "cat": cat["op"], "name": "aten::item", "pid": 1, "tid": 7, "ts": t,
                                 "dur": wait_end + 1 - t},
                                {"ph": "X", "cat": cat["runtime"], "name": "cudaStreamSynchronize", "pid": 1,
                                 "tid": 7, "ts": t + 0.5, "dur": wait_end - t}]
                t = wait_end + 2
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
            wait_end = max(t + 5, gpu_free + 3 if item_copy else gpu_free)
            frame = {"ph": "X", "cat": "python_function", "pid": 1, "tid": 7}
            if item_copy:
                step_events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)",
                                    "pid": 0, "tid": 7, "ts": wait_end - 3, "dur": 2,
                                    "args": {"device": 0, "stream": 7, "correlation": corr, "bytes": 4}})
                gpu_free = wait_end - 1
            step_events += [
                {**frame, "name": "train.py(42): train_step", "ts": t, "dur": wait_end + 3 - t},
                {**frame, "name": "torch/_tensor.py(100): __torch_function__", "ts": t + 0.5, "dur": wait_end + 2 - t},
                {"ph": "X", "cat": cat["op"], "name": "aten::item", "pid": 1, "tid": 7, "ts": t + 1,
                 "dur": wait_end + 1 - t},
                {"ph": "X", "cat": cat["op"], "name": "aten::_local_scalar_dense", "pid": 1, "tid": 7, "ts": t + 1.5,
                 "dur": wait_end + 0.5 - t},
                {"ph": "X", "cat": cat["runtime"], "name": "cudaMemcpyAsync" if item_copy else "cudaStreamSynchronize",
                 "pid": 1, "tid": 7, "ts": t + 2, "dur": wait_end - t - 2,
                 **({"args": {"correlation": corr}} if item_copy else {})},
                {**frame, "name": "train.py(50): log_metrics", "ts": wait_end + 4, "dur": sync_us}]
            t = wait_end + 4 + sync_us
            corr += 1 if item_copy else 0
        if final_sync_us and s == steps - 1:
            wait = max(t + 5, gpu_free) + final_sync_us - t
            step_events.append({"ph": "X", "cat": cat["runtime"], "name": "cudaDeviceSynchronize", "pid": 1,
                                "tid": 7, "ts": t + 1, "dur": wait})
            t += wait + 2
        t = (t if ahead else max(t, gpu_free)) + 5
        if 0 <= s < steps:
            events.append({"ph": "X", "cat": cat["annotation"], "name": f"ProfilerStep#{first_step + s}",
                           "pid": 1, "tid": 7, "ts": step_start, "dur": t - step_start})
            on_gpu = [e for e in step_events if e["cat"] in _DEVICE_CATS]
            if gpu_steps and on_gpu:
                gpu_start = min(e["ts"] for e in on_gpu)
                events.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{first_step + s}",
                               "pid": 0, "tid": 7, "ts": gpu_start,
                               "dur": max(e["ts"] + e["dur"] for e in on_gpu) - gpu_start,
                               "args": {"External id": first_step + s}})
        events += step_events
    if not host:
        events = [e for e in events if e["ph"] == "M" or e["cat"] in _DEVICE_CATS | {"gpu_user_annotation"}]
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


def kineto_ranks(ranks: int = 4, steps: int = 4, layers: int = 4, kernel_us: float = 500.0,
                 optimizer_us: float = 3000.0, slow_rank: int | None = None, slow_factor: float = 2.0,
                 gather_us: float = 300.0, scatter_us: float = 600.0, overlap: bool = False,
                 clock_offsets_us: tuple[float, ...] = (), launch_us: float = 10.0) -> list[dict]:
    """One trace dict per rank of an FSDP-like job, laid out together so the collectives agree.

    Each step on each rank: forward, per layer an all-gather then a compute kernel that needs it;
    backward, per layer a compute kernel and a reduce-scatter of its gradients; then the host's
    ``aten::item`` with ``cudaStreamSynchronize`` waiting for the GPU (the gradients' norm read), then
    the host's ``Optimizer.step#AdamW.step`` (OPTIMIZER_US of host time, SLOW_FACTOR times that on
    SLOW_RANK, launching OPTIMIZER_KERNELS kernels evenly, each 0.9 x OPTIMIZER_US / OPTIMIZER_KERNELS on
    every rank: the others' GPUs keep up, the slow rank's idles), so the next step's first all-gather
    waits for the slowest host.
    Every collective's kernel starts on its rank when launched and its stream is free, and ends on
    every rank at the same moment: the last rank's start plus the transfer (GATHER_US, SCATTER_US),
    so earlier ranks wait inside it. OVERLAP False: backward's reduce-scatters all run after the
    last backward kernel (the compute stream waits for each); True: each runs on its own stream
    beside the next layer's backward kernel (as DDP/FSDP hooks do), only the last one exposed.
    CLOCK_OFFSETS_US: added to every time of that rank (its host clock differs). Calls carry
    ``record_param_comms`` args (a group of RANKS named "0")."""
    host = [1000.0] * ranks          # each rank's host time
    compute = [0.0] * ranks          # when its compute stream is free
    comm = [0.0] * ranks             # when its NCCL stream is free
    corr = [1] * ranks
    events: list[list[dict]] = [[{"ph": "M", "name": "thread_name", "pid": 1, "tid": 7,
                                  "args": {"name": "python"}}] for _ in range(ranks)]
    group = {"Group size": ranks, "Process Group Name": "0", "Process Group Ranks": str(list(range(ranks)))}

    def launch(r: int, name: str, stream: int, start_gpu: float, dur: float) -> tuple[float, int]:
        """A launch call on rank R's host now; its kernel on STREAM at START_GPU or after the launch."""
        t = host[r]
        c = corr[r]
        corr[r] += 1
        events[r].append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 7,
                          "ts": t + 1, "dur": launch_us, "args": {"correlation": c}})
        start = max(t + launch_us + 2, start_gpu)
        if dur >= 0:
            events[r].append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": start,
                              "dur": dur, "args": {"device": 0, "stream": stream, "correlation": c}})
        host[r] = t + launch_us + 3
        return start, c

    def op(r: int, name: str, start: float, args: dict | None = None) -> None:
        events[r].append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 7, "ts": start,
                          "dur": host[r] - start, **({"args": args} if args else {})})

    def collective(name: str, kernel: str, transfer: float, after_compute: bool) -> None:
        """One call on every rank: launched now on each host; ends together on every rank."""
        starts = []
        for r in range(ranks):
            t0 = host[r]
            ready = max(comm[r], compute[r]) if after_compute else comm[r]
            starts.append(max(t0 + launch_us + 2, ready))
        end = max(starts) + transfer
        for r in range(ranks):
            t0 = host[r]
            c = corr[r]
            corr[r] += 1
            events[r] += [
                {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 7, "ts": t0,
                 "dur": launch_us + 4, "args": {"Collective name": name, "In msg nelems": 1 << 20,
                                                "Out msg nelems": 1 << 20, "dtype": "Float", **group}},
                {"ph": "X", "cat": "user_annotation", "name": f"nccl:{name}", "pid": 1, "tid": 7,
                 "ts": t0 + 0.5, "dur": launch_us + 3},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 7,
                 "ts": t0 + 1, "dur": launch_us, "args": {"correlation": c}},
                {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 9, "ts": starts[r],
                 "dur": end - starts[r], "args": {"device": 0, "stream": 9, "correlation": c}}]
            comm[r] = end
            host[r] = t0 + launch_us + 5

    gather = "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    scatter = "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    for s in range(steps):
        step_start = list(host)
        for layer in range(layers):         # forward: gather the layer's parameters, then compute
            collective("_allgather_base", gather, gather_us, after_compute=False)
            for r in range(ranks):
                t0 = host[r]
                start, _ = launch(r, f"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_fwd{layer}", 7, max(compute[r], comm[r]), kernel_us)
                compute[r] = start + kernel_us
                op(r, "aten::mm", t0)
        for layer in range(layers):         # backward: compute a layer's gradients, reduce-scatter them
            for r in range(ranks):
                t0 = host[r]
                start, _ = launch(r, f"sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x128x64_bwd{layer}", 7,
                                  compute[r] if overlap else max(compute[r], comm[r]), kernel_us)
                compute[r] = start + kernel_us
                op(r, "aten::mm", t0)
            if overlap:
                collective("_reduce_scatter_base", scatter, scatter_us, after_compute=True)
        if not overlap:
            for layer in range(layers):
                collective("_reduce_scatter_base", scatter, scatter_us, after_compute=True)
        for r in range(ranks):               # a sync (the gradients' norm read), then the optimizer step
            t1 = host[r]
            wait_end = max(t1 + 5, compute[r], comm[r])
            events[r] += [{"ph": "X", "cat": "cpu_op", "name": "aten::item", "pid": 1, "tid": 7, "ts": t1,
                           "dur": wait_end + 1 - t1},
                          {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1,
                           "tid": 7, "ts": t1 + 0.5, "dur": wait_end - t1 - 0.5}]
            host[r] = t0 = wait_end + 2
            pace = optimizer_us * (slow_factor if r == slow_rank else 1.0) / OPTIMIZER_KERNELS
            for _ in range(OPTIMIZER_KERNELS):      # one kernel per parameter, as a for-loop optimizer
                host[r] += pace - launch_us - 3
                start, _ = launch(r, "void multi_tensor_apply_kernel<AdamFunctor<float>>()", 7, compute[r],
                                  0.9 * optimizer_us / OPTIMIZER_KERNELS)
                compute[r] = start + 0.9 * optimizer_us / OPTIMIZER_KERNELS
            op(r, "Optimizer.step#AdamW.step", t0)
            events[r].append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{5 + s}", "pid": 1,
                              "tid": 7, "ts": step_start[r], "dur": host[r] - step_start[r]})
            host[r] += 5
    traces = []
    for r in range(ranks):
        shift = clock_offsets_us[r] if r < len(clock_offsets_us) else 0.0
        for e in events[r]:
            if "ts" in e:
                e["ts"] += shift
        traces.append({"schemaVersion": 1, "traceEvents": events[r], "baseTimeNanoseconds": 1_700_000_000_000_000_000,
                       "distributedInfo": {"backend": "nccl", "rank": r, "world_size": ranks},
                       "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85_000_000_000,
                                             "computeMajor": 9, "computeMinor": 0, "numSms": 132}]})
    return traces


def first_call_trace(cold: bool = True, context_ms: float = 150.0, library_ms: float = 12.0,
                     lazy_ms: tuple[float, ...] = (20.0, 8.0), kernel_us: tuple[float, ...] = (10.0, 2.0, 10.0, 3.0),
                     launch_us: float = 6.0, host_ms: float = 0.0, input_ms: float = 0.0) -> dict:
    """One window around a model's call, as the profiler recipe takes it: ``with profile(...):
    model(x)`` with no schedule and no ``prof.step()``, so no ProfilerStep#N.  The call moves the
    input to the GPU (``aten::to``: a 5 us host-to-device copy), runs ``aten::mm`` and the ops
    after it (one kernel of KERNEL_US each) and reads the result back (``aten::item``: a blocking
    device-to-host copy).  COLD: the first CUDA call of the process, so the window also holds its
    set-up: context creation (a ``cudaFree`` of CONTEXT_MS before the copy), PyTorch's stream pool
    (``cudaStreamCreateWithFlags``), cuBLAS initialisation inside the first ``aten::mm``
    (``cudaGetDeviceProperties``, ``cudaGetSymbolAddress``, ``cudaFuncGetAttributes``,
    ``cudaHostAlloc`` and untraced host work, LIBRARY_MS in all, before its launch) and lazily
    loaded kernels (the first launches last LAZY_MS, in turn).  Not COLD: the same call warmed up,
    every launch LAUNCH_US.  HOST_MS: before reading the result back the call runs that much Python
    (``model.py(30): postprocess``) that launches nothing.  INPUT_MS: the window opens with the loop
    waiting that long for its first batch (a DataLoader starting its workers)."""
    t, corr, gpu_free = 1000.0, 1, 0.0
    events: list[dict] = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "python"}}]

    def call(name: str, at: float, dur: float, cat: str = "cuda_runtime", **args) -> None:
        events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 7, "ts": at, "dur": dur,
                       **({"args": args} if args else {})})

    def device(name: str, cat: str, at: float, dur: float, **args) -> float:
        start = max(at, gpu_free)
        events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": start, "dur": dur,
                       "args": {"device": 0, "stream": 7, "correlation": corr, **args}})
        return start + dur

    if input_ms:
        call("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", t, input_ms * 1000, cat="user_annotation")
        t += input_ms * 1000 + 1
    # aten::to: (context creation, the stream pool,) the input's copy
    op = t
    t += 1
    if cold:
        call("cudaFree", t, context_ms * 1000)
        t += context_ms * 1000 + 1
        call("cudaStreamCreateWithFlags", t, 400.0)
        t += 401
    call("cudaMemcpyAsync", t, launch_us, correlation=corr)
    gpu_free = device("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", t + launch_us, 5.0, bytes=1 << 16)
    corr += 1
    t += launch_us + 1
    call("aten::to", op, t - op, cat="cpu_op")
    lazy = list(lazy_ms) if cold else []
    for k, kus in enumerate(kernel_us):
        op = t
        t += 1
        if cold and k == 0:
            # cuBLAS's handle: its queries and pinned workspace, between untraced host work
            for name, us in (("cudaGetDeviceProperties", 300.0), ("cudaGetSymbolAddress", 2000.0),
                             ("cudaFuncGetAttributes", 100.0), ("cudaHostAlloc", 1600.0)):
                call(name, t, us)
                t += us + 1
            t += library_ms * 1000 - 4000 - 4
        dur = lazy.pop(0) * 1000 if lazy else launch_us
        call("cudaLaunchKernel", t, dur, correlation=corr)
        name = "ampere_sgemm_64x32_sliced1x4_nn" if k % 2 == 0 else "vectorized_elementwise_kernel<relu>"
        gpu_free = device(name, "kernel", t + dur + 1, kus)
        corr += 1
        t += dur + 1
        call("aten::mm" if k % 2 == 0 else "aten::relu", op, t - op, cat="cpu_op")
    if host_ms:
        call("model.py(30): postprocess", t, host_ms * 1000, cat="python_function")
        t += host_ms * 1000 + 1
    op = t
    call("cudaMemcpyAsync", t + 1, max(gpu_free + 5 - t, launch_us), correlation=corr)
    device("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", max(gpu_free, t + 2), 2.0, bytes=4)
    t = max(gpu_free + 6, t + launch_us + 2)
    call("aten::item", op, t - op, cat="cpu_op")
    return {"schemaVersion": 1, "traceEvents": events, "baseTimeNanoseconds": 1_700_000_000_000_000_000,
            "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-40GB", "totalGlobalMem": 42_505_273_344,
                                  "computeMajor": 8, "computeMinor": 0, "numSms": 108}]}


def untraced_device_trace(steps: int = 4, item_ms: float = 12.0, ops: int = 20, op_us: float = 40.0) -> dict:
    """A training loop whose device the profiler did not trace (Apple's MPS: Kineto records its host
    side only): each ``ProfilerStep#N`` dispatches OPS ops of OP_US (``aten::linear``, no launch call,
    no device event) and ends in ``loss.item()`` (``aten::item`` > ``aten::_local_scalar_dense``)
    lasting ITEM_MS while the host waits for the device. ITEM_MS of microseconds is a CPU run."""
    events: list[dict] = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "python"}}]
    t = 1000.0
    for s in range(steps):
        start = t
        for _ in range(ops):
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 7, "ts": t,
                           "dur": op_us})
            t += op_us + 2
        item_us = item_ms * 1000
        events += [{"ph": "X", "cat": "cpu_op", "name": "aten::item", "pid": 1, "tid": 7, "ts": t, "dur": item_us},
                   {"ph": "X", "cat": "cpu_op", "name": "aten::_local_scalar_dense", "pid": 1, "tid": 7,
                    "ts": t + 0.5, "dur": item_us - 1}]
        t += item_us + 5
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 1}", "pid": 1, "tid": 7,
                       "ts": start, "dur": t - start})
    return {"schemaVersion": 1, "traceEvents": events, "baseTimeNanoseconds": 1_700_000_000_000_000_000}


def long_launch_trace(steps: int = 3, first_launch_ms: float = 200.0, copy_ms: float = 3.0,
                      graph_ms: float = 2.0, kernel_us: float = 100.0) -> dict:
    """Launch calls of a millisecond or more, of three causes.  ``ProfilerStep#0`` (when
    FIRST_LAUNCH_MS) is a first call: its one ``cudaLaunchKernel`` of ``gemm_a`` lasts
    FIRST_LAUNCH_MS (the kernel's module loaded lazily), then the kernel runs KERNEL_US.  Each of
    the STEPS steady steps after it launches ``gemm_a`` again (6 us), copies a batch with a
    blocking ``cudaMemcpy`` of COPY_MS (it waits for ``gemm_a``, then the 50 us host-to-device copy
    runs at its end), and replays a CUDA graph: one ``cudaGraphLaunch`` of GRAPH_MS whose two
    kernels (``graph_k0``, ``graph_k1``, KERNEL_US each) run right after it; the graph's kernels run
    for the first time in the trace in the first steady step, and their launch still loads nothing."""
    events: list[dict] = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "python"}}]
    t, corr, gpu_free = 1000.0, 1, 0.0

    def host(name: str, cat: str, at: float, dur: float, **args) -> None:
        events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 7, "ts": at, "dur": dur,
                       **({"args": args} if args else {})})

    def device(name: str, cat: str, at: float, dur: float) -> float:
        start = max(at, gpu_free)
        events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": start, "dur": dur,
                       "args": {"device": 0, "stream": 7, "correlation": corr}})
        return start + dur

    for s in range(0 if first_launch_ms else 1, steps + 1):
        step_start = t
        launch_us = first_launch_ms * 1000 if s == 0 else 6.0
        host("cudaLaunchKernel", "cuda_runtime", t + 1, launch_us, correlation=corr)
        gpu_free = device("gemm_a", "kernel", t + 2 + launch_us, kernel_us)
        host("aten::mm", "cpu_op", t, launch_us + 2)
        t += launch_us + 3
        corr += 1
        if s:
            host("cudaMemcpy", "cuda_runtime", t, copy_ms * 1000, correlation=corr)
            device("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", t + copy_ms * 1000 - 50, 50.0)
            gpu_free = t + copy_ms * 1000
            host("aten::copy_", "cpu_op", t - 0.5, copy_ms * 1000 + 1)
            t += copy_ms * 1000 + 2
            corr += 1
            host("cudaGraphLaunch", "cuda_runtime", t, graph_ms * 1000, correlation=corr)
            gpu_free = device("graph_k0", "kernel", t + graph_ms * 1000 + 1, kernel_us)
            gpu_free = device("graph_k1", "kernel", gpu_free + 1, kernel_us)
            t += graph_ms * 1000 + 2
            corr += 1
        t = max(t, gpu_free) + 5
        host(f"ProfilerStep#{s}", "user_annotation", step_start, t - step_start)
        t += 1
    return {"schemaVersion": 1, "traceEvents": events, "baseTimeNanoseconds": 1_700_000_000_000_000_000,
            "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-40GB", "totalGlobalMem": 42_505_273_344,
                                  "computeMajor": 8, "computeMinor": 0, "numSms": 108}]}
