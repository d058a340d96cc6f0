"""GPU truth: planted problems trained on a real GPU, profiled the way users profile, with fixed twins.

    python demo/gpu_truth.py --out /tmp/gt                  # the GPU run (under 4 minutes on an H100)
    python demo/gpu_truth.py --out /tmp/gt --cpu-smoke      # tiny sizes on the CPU (automatic without CUDA)
    python demo/gpu_truth.py --pack /tmp/gt "$OUT"          # at most 8 .tar.gz under $OUT, each < 16 MiB

Every scenario in SCENARIOS (written down before any run) plants one problem and names the
check the Advisor should put first and the saving its fix should bring; its fixed twin is the
same code with only the fix applied. PyTorch runs are profiled with ``torch.profiler`` and
``tensorboard_trace_handler`` (``schedule(wait=1, warmup=2, active=N)``, ``prof.step()`` each
step); JAX runs with ``tb_gpuadvisor.jax.profile_steps`` (in a child process, so the two
frameworks never share CUPTI). Each run writes its own logdir, ``<out>/<scenario>/`` and
``<out>/<scenario>_fixed/``, and ``<out>/manifest.json`` records per run what was planted, the
expected first finding, the versions, the device, and step times the script measured itself in
a timed loop outside the profiled steps (synchronising before and after it: per-step
synchronisation would remove the host/GPU overlap that the sync and healthy scenarios are
about; ``synced_step_ms`` is the median with a synchronisation around each step as well).
The whole run keeps to a time budget and skips (with a note) the scenarios it has no time for.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
MANIFEST = "manifest.json"
JAX_RUNS = "jax_runs.json"
FIXED_SUFFIX = "_fixed"
SAVING = "before.step_ms - fixed.step_ms"
GPU_BUDGET_S = 225.0           # the GPU run's budget: under the 4 minutes a device command gets
SMOKE_BUDGET_S = 600.0
PACK_ARCHIVES = 8
PACK_LIMIT = 15 * 2**20        # under the 16 MiB a returned file may have, with room for tar's headers
PACK_TOTAL = 60 * 2**20        # under the 64 MiB all returned files may have together


@dataclass(frozen=True)
class Scenario:
    """One planted problem, its fix and what the Advisor should say about it."""

    name: str
    framework: str                  # "pytorch" or "jax"
    planted: str
    fix: str | None                 # None: no twin (a healthy run)
    expected_check: str | None      # the first actionable finding; None: no critical finding at all
    saving: str | None = SAVING     # the measured saving the finding's estimate is held to
    needs_cuda: bool = False        # cannot run in the CPU smoke mode
    expected_check_gloo: str | None = None   # DDP only: the expectation when NCCL refuses two ranks


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("dataloader", "pytorch",
             "DataLoader(num_workers=0) whose __getitem__ spends CPU time building each sample",
             "DataLoader(num_workers=W, persistent_workers=True, prefetch_factor=4)", "input_bound"),
    Scenario("item_sync", "pytorch",
             "loss.item() every step, so the host's per-step Python work (batch bookkeeping) never "
             "overlaps the GPU's step", "the loss summed on the GPU, no .item() in the step", "host_overhead"),
    Scenario("launch_bound", "pytorch",
             "an ensemble of tiny MLPs run member by member in a Python loop (hundreds of us-sized kernels)",
             "the same ensemble batched into torch.baddbmm over stacked weights", "kernel_launch"),
    Scenario("fp32_matmul", "pytorch",
             "fp32 matmuls with TF32 off (torch.backends.cuda.matmul.allow_tf32 = False)",
             "torch.autocast('cuda', dtype=torch.bfloat16)", "precision", needs_cuda=True),
    Scenario("pageable_h2d", "pytorch",
             "large batches copied from pageable host memory with .to(device)",
             "batches in pinned memory, copied with .to(device, non_blocking=True)", "memcpy", needs_cuda=True),
    Scenario("train_mode_inference", "pytorch",
             "inference with model.train() (dropout, batch-norm batch statistics) and autograd on",
             "model.eval() under torch.inference_mode()", "eval_mode"),
    Scenario("healthy", "pytorch",
             "none: bf16 MLP, data on the GPU, no sync in the step, so the host runs ahead and the "
             "step is the GPU's", None, None, saving=None),
    Scenario("ddp", "pytorch",
             "two-rank DistributedDataParallel on the one GPU with tiny gradient buckets "
             "(bucket_cap_mb small: one all-reduce per layer)",
             "DDP's default 25 MB buckets", "collectives", expected_check_gloo="host_overhead"),
    Scenario("jax_input_stall", "jax",
             "a Python loader that reads each batch from slow storage in the step (time.sleep)",
             "the same reads run ahead on a thread pool (prefetch)", "host_overhead"),
    Scenario("jax_tiny_calls", "jax",
             "a Python loop of tiny jitted calls per step",
             "the same updates in one jitted jax.lax.fori_loop", "kernel_launch"),
    Scenario("jax_fp32", "jax",
             "fp32 matmuls at Precision.HIGHEST", "inputs and weights cast to bfloat16 for the matmuls",
             "precision"),
    Scenario("jax_healthy", "jax",
             "none: jitted bf16 MLP step on batches already on the device", None, None, saving=None),
)


@dataclass(frozen=True)
class Sizes:
    """How big each workload is: GPU sizes make the planted cost dominate, smoke sizes run in seconds."""

    warmup: int            # untimed steps first (allocator, cuBLAS, DataLoader workers, compilation)
    timed: int             # steps of the timed loop
    synced: int            # steps timed one by one with a sync after each
    active: int            # profiled steps
    batch: int             # the MLP scenarios
    width: int
    depth: int
    sample_ms: float       # dataloader: CPU time per sample in __getitem__
    sample_width: int
    loader_width: int
    loader_batch: int
    workers: int
    host_ms: float         # item_sync: the host's own work per step
    members: int           # launch_bound ensemble
    member_in: int
    member_hidden: int
    member_batch: int
    h2d_rows: int          # pageable_h2d batch: rows x width floats
    ddp_layers: int
    ddp_width: int
    ddp_batch: int
    ddp_small_bucket_mb: float
    read_ms: float         # jax_input_stall: one batch's read
    readers: int
    tiny_calls: int        # jax_tiny_calls: calls per step
    tiny_width: int


GPU_SIZES = Sizes(warmup=3, timed=10, synced=4, active=5, batch=8192, width=4096, depth=4,
                  sample_ms=0.05, sample_width=256, loader_width=8192, loader_batch=512,
                  workers=min(12, max(1, (os.cpu_count() or 2) - 3)),
                  host_ms=4.0, members=64, member_in=16, member_hidden=32, member_batch=64,
                  h2d_rows=32768, ddp_layers=32, ddp_width=512, ddp_batch=1024, ddp_small_bucket_mb=0.5,
                  read_ms=20.0, readers=16, tiny_calls=64, tiny_width=16)
SMOKE_SIZES = Sizes(warmup=1, timed=3, synced=2, active=3, batch=32, width=64, depth=2,
                    sample_ms=0.05, sample_width=16, loader_width=32, loader_batch=16, workers=2, host_ms=2.0,
                    members=8, member_in=8,
                    member_hidden=8, member_batch=8, h2d_rows=64, ddp_layers=4, ddp_width=32, ddp_batch=16,
                    ddp_small_bucket_mb=0.001, read_ms=5.0, readers=4, tiny_calls=8, tiny_width=8)
DDP_UP_S, DDP_RUN_S = 45.0, 120.0  # seconds for the ranks' first all-reduce, and for both runs
# Seconds expected on the GPU before anything is timed: the DDP pair (two spawned ranks, maybe
# twice: NCCL, then gloo) and the JAX process's start with its first pair.
DDP_EXPECTED_S, JAX_START_S = 45.0, 30.0
WAIT, PROFILER_WARMUP = 1, 2       # torch.profiler.schedule(wait=1, warmup=2, active=N)
JAX_WARMUP = 2                     # profile_steps(warmup_steps=...)


def by_name(name: str) -> Scenario:
    return next(s for s in SCENARIOS if s.name == name)


def run_name(scenario: str, fixed: bool) -> str:
    return scenario + (FIXED_SUFFIX if fixed else "")


def expected_check(scenario: Scenario, backend: str | None) -> str | None:
    """The first finding to expect; a DDP run that fell back to gloo has its own."""
    if backend == "gloo" and scenario.expected_check_gloo:
        return scenario.expected_check_gloo
    return scenario.expected_check


def spin(seconds: float) -> None:
    """CPU work of a fixed duration, holding the GIL as Python preprocessing does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@dataclass
class Workload:
    """A training (or inference) step to time and profile, and how to wait for its device work."""

    step: Callable[[], Any]
    sync: Callable[[], None]
    close: Callable[[], None] = lambda: None
    meta: dict = field(default_factory=dict)


def timed_loop(work: Workload, sizes: Sizes) -> dict:
    """Step times this script measures itself, outside any profiled step: the timed loop's mean
    (sync before and after it) and the median of steps each followed by a sync."""
    work.sync()
    start = time.perf_counter()
    for _ in range(sizes.timed):
        work.step()
    work.sync()
    step_ms = (time.perf_counter() - start) * 1e3 / sizes.timed
    each = []
    for _ in range(sizes.synced):
        t0 = time.perf_counter()
        work.step()
        work.sync()
        each.append((time.perf_counter() - t0) * 1e3)
    return {"step_ms": round(step_ms, 4), "synced_step_ms": round(statistics.median(each), 4),
            "timed_steps": sizes.timed}


# --- PyTorch ---------------------------------------------------------------------------------------

def _torch_env(cuda: bool) -> dict:
    import torch

    return {"framework": "pytorch", "torch": torch.__version__, "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name(0) if cuda else (platform.processor() or platform.machine()),
            "device_kind": "gpu" if cuda else "cpu"}


def _autocast(device: str, enabled: bool = True):
    """bf16 autocast on a GPU (every scenario but the fp32 one, so precision never hides the
    planted problem); nothing on the CPU smoke run."""
    import torch

    return torch.autocast("cuda", dtype=torch.bfloat16) if enabled and device == "cuda" else nullcontext()


def _mlp(width: int, depth: int, out: int, norm: bool = False, features: int | None = None):
    import torch.nn as nn

    layers: list = []
    for i in range(depth):
        layers.append(nn.Linear((features or width) if i == 0 else width, width))
        layers += [nn.BatchNorm1d(width), nn.Dropout(0.1)] if norm else []
        layers.append(nn.ReLU())
    return nn.Sequential(*layers, nn.Linear(width, out))


def _syncer(device: str) -> Callable[[], None]:
    import torch

    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def _train_step(model, optimizer, x, y, device: str, amp: bool = True):
    """One optimisation step; returns the loss as a tensor (no sync)."""
    import torch

    with _autocast(device, amp):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss


class SpinDataset:
    """Samples whose building costs SAMPLE_S of CPU time each (decoding and augmenting, in real life)."""

    def __init__(self, width: int, sample_s: float) -> None:
        self.width, self.sample_s = width, sample_s

    def __len__(self) -> int:
        return 10**7

    def __getitem__(self, index: int):
        import torch

        spin(self.sample_s)
        return torch.randn(self.width, generator=torch.Generator().manual_seed(index)), index % 10


def dataloader(sizes: Sizes, device: str, fixed: bool) -> Workload:
    import torch
    from torch.utils.data import DataLoader

    # A wide model on narrow samples: the GPU's step outlasts what the workers need per batch, so
    # the fixed twin is GPU-bound.
    model = _mlp(sizes.loader_width, sizes.depth, 10, features=sizes.sample_width).to(device)
    optimizer = torch.optim.Adam(model.parameters())
    data = SpinDataset(sizes.sample_width, sizes.sample_ms / 1e3)
    workers = {"num_workers": sizes.workers, "persistent_workers": True, "prefetch_factor": 4} if fixed else {}
    loader = DataLoader(data, batch_size=sizes.loader_batch, **workers)
    batches = iter(loader)

    def step():
        x, y = next(batches)
        return _train_step(model, optimizer, x.to(device), y.to(device), device)

    def close():
        nonlocal batches
        batches = None
    return Workload(step, _syncer(device), close, {"num_workers": sizes.workers if fixed else 0,
                                                   "sample_ms": sizes.sample_ms, "batch": sizes.loader_batch})


def item_sync(sizes: Sizes, device: str, fixed: bool) -> Workload:
    import torch

    model = _mlp(sizes.width, sizes.depth, 10).to(device)
    optimizer = torch.optim.Adam(model.parameters())
    x = torch.randn(sizes.batch, sizes.width, device=device)
    y = torch.randint(0, 10, (sizes.batch,), device=device)
    total = torch.zeros((), device=device)
    logged: list[float] = []

    def step():
        nonlocal total
        spin(sizes.host_ms / 1e3)         # the host's own work each step: bookkeeping, the next batch's indices
        loss = _train_step(model, optimizer, x, y, device)
        if fixed:
            total = total + loss.detach()  # read once, after training
        else:
            logged.append(loss.item())     # waits for the GPU to finish the step
        return loss
    return Workload(step, _syncer(device), meta={"host_ms": sizes.host_ms, "batch": sizes.batch})


def launch_bound(sizes: Sizes, device: str, fixed: bool) -> Workload:
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    members = nn.ModuleList(nn.Sequential(nn.Linear(sizes.member_in, sizes.member_hidden), nn.ReLU(),
                                          nn.Linear(sizes.member_hidden, 1)) for _ in range(sizes.members))
    x = torch.randn(sizes.member_batch, sizes.member_in, device=device)
    y = torch.randn(sizes.member_batch, sizes.members, device=device)
    if fixed:
        # The same weights, stacked: one baddbmm per layer for every member at once.
        stack = [nn.Parameter(torch.stack([m[i].weight.detach().t() for m in members]).to(device)) for i in (0, 2)]
        bias = [nn.Parameter(torch.stack([m[i].bias.detach()[None] for m in members]).to(device)) for i in (0, 2)]
        params = stack + bias

        def forward():
            xs = x.expand(sizes.members, -1, -1)
            hidden = torch.relu(torch.baddbmm(bias[0], xs, stack[0]))
            return torch.baddbmm(bias[1], hidden, stack[1]).squeeze(-1).t()
    else:
        members.to(device)
        params = list(members.parameters())

        def forward():
            return torch.cat([member(x) for member in members], dim=1)
    optimizer = torch.optim.Adam(params)

    def step():
        with _autocast(device):
            loss = torch.nn.functional.mse_loss(forward(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss
    return Workload(step, _syncer(device), meta={"members": sizes.members, "batch": sizes.member_batch})


def fp32_matmul(sizes: Sizes, device: str, fixed: bool) -> Workload:
    import torch

    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False     # both runs: the planted fp32, and no TF32 to hide it
    model = _mlp(sizes.width, sizes.depth, 10).to(device)
    optimizer = torch.optim.Adam(model.parameters())
    x = torch.randn(sizes.batch // 2, sizes.width, device=device)
    y = torch.randint(0, 10, (sizes.batch // 2,), device=device)

    def close():
        torch.backends.cuda.matmul.allow_tf32 = before
    return Workload(lambda: _train_step(model, optimizer, x, y, device, amp=fixed), _syncer(device), close,
                    {"allow_tf32": False, "autocast": "bf16" if fixed else None})


def pageable_h2d(sizes: Sizes, device: str, fixed: bool) -> Workload:
    import torch

    model = _mlp(sizes.width // 4, 1, 10).to(device)
    optimizer = torch.optim.Adam(model.parameters())
    host = [torch.randn(sizes.h2d_rows, sizes.width // 4) for _ in range(2)]
    labels = [torch.randint(0, 10, (sizes.h2d_rows,)) for _ in range(2)]
    if fixed:
        host, labels = [t.pin_memory() for t in host], [t.pin_memory() for t in labels]
    count = 0

    def step():
        nonlocal count
        count += 1
        x = host[count % 2].to(device, non_blocking=fixed)
        y = labels[count % 2].to(device, non_blocking=fixed)
        return _train_step(model, optimizer, x, y, device)
    return Workload(step, _syncer(device), meta={"mb_per_step": round(host[0].numel() * 4 / 1e6, 1),
                                                 "pinned": fixed})


def train_mode_inference(sizes: Sizes, device: str, fixed: bool) -> Workload:
    import torch

    model = _mlp(sizes.width, sizes.depth, 10, norm=True).to(device)
    x = torch.randn(sizes.batch, sizes.width, device=device)
    model.train(not fixed)
    mode = torch.inference_mode if fixed else nullcontext

    def step():
        with mode(), _autocast(device):
            return model(x).argmax(dim=1)
    return Workload(step, _syncer(device), meta={"model.training": not fixed, "inference_mode": fixed})


def healthy(sizes: Sizes, device: str, fixed: bool) -> Workload:
    import torch

    model = _mlp(sizes.width, sizes.depth, 10).to(device)
    optimizer = torch.optim.Adam(model.parameters())
    x = torch.randn(sizes.batch, sizes.width, device=device)
    y = torch.randint(0, 10, (sizes.batch,), device=device)
    return Workload(lambda: _train_step(model, optimizer, x, y, device), _syncer(device))


TORCH_RUNNERS: dict[str, Callable[[Sizes, str, bool], Workload]] = {
    f.__name__: f for f in (dataloader, item_sync, launch_bound, fp32_matmul, pageable_h2d, train_mode_inference,
                            healthy)}


def profile_torch(work: Workload, logdir: Path, worker: str, device: str, sizes: Sizes) -> None:
    """Profile the way the README shows: schedule skips the warm-up, prof.step() each step."""
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities, schedule=schedule(wait=WAIT, warmup=PROFILER_WARMUP, active=sizes.active,
                                                          repeat=1),
                 on_trace_ready=tensorboard_trace_handler(str(logdir), worker_name=worker)) as prof:
        total = WAIT + PROFILER_WARMUP + sizes.active
        for i in range(total):
            work.step()
            if i == total - 1:
                work.sync()      # the capture stops at this prof.step(): let it hold the last step's GPU work
            prof.step()


def run_torch(scenario: Scenario, fixed: bool, out: Path, sizes: Sizes, device: str) -> dict:
    """One PyTorch run: warm up, time, profile; its manifest entry."""
    import torch

    torch.manual_seed(0)
    work = TORCH_RUNNERS[scenario.name](sizes, device, fixed)
    try:
        for _ in range(sizes.warmup):
            work.step()
        timing = timed_loop(work, sizes)
        profile_torch(work, out / run_name(scenario.name, fixed), "rank0", device, sizes)
    finally:
        work.close()
    if device == "cuda":
        torch.cuda.empty_cache()
    return {**timing, "meta": work.meta}


# --- DDP: two processes on the one GPU ------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_rank(rank: int, backend: str, port: int, out: str, sizes: Sizes, device: str, result: str) -> None:
    """One rank of the DDP pair: the planted run, then its fixed twin in the same process group;
    writes both timings (or the error) to RESULT."""
    import datetime

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if device == "cpu":
        torch.set_num_threads(1)        # two ranks on shared cores
    try:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=DDP_RUN_S))
        if device == "cuda":
            torch.cuda.set_device(0)
        probe = torch.ones(1, device=device)
        dist.all_reduce(probe)                      # NCCL refuses two ranks on one GPU here
        Path(result + ".up").touch()
        timings = {}
        for fixed in (False, True):
            torch.manual_seed(0)
            model = _mlp(sizes.ddp_width, sizes.ddp_layers, 10).to(device)
            bucket = {} if fixed else {"bucket_cap_mb": sizes.ddp_small_bucket_mb}
            ddp = DistributedDataParallel(model, device_ids=[0] if device == "cuda" else None, **bucket)
            optimizer = torch.optim.Adam(ddp.parameters())
            x = torch.randn(sizes.ddp_batch, sizes.ddp_width, device=device)
            y = torch.randint(0, 10, (sizes.ddp_batch,), device=device)
            work = Workload(lambda: _train_step(ddp, optimizer, x, y, device), _syncer(device))
            started = time.time()
            for _ in range(sizes.warmup):
                work.step()
            timing = timed_loop(work, sizes)
            profile_torch(work, Path(out) / run_name("ddp", fixed), f"rank{rank}", device, sizes)
            dist.barrier()
            timings["fixed" if fixed else "planted"] = {**timing, "wall_s": round(time.time() - started, 2)}
        Path(result).write_text(json.dumps(timings))
    except Exception as err:       # the parent reads why and may fall back to gloo
        Path(result).write_text(json.dumps({"error": f"{type(err).__name__}: {err}".splitlines()[0][:400]}))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _wait(procs: list, paths: list[str], seconds: float) -> bool:
    """Whether every path appears within SECONDS (False at once when a rank exits without it)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(os.path.exists(p) for p in paths):
            return True
        if any(not p.is_alive() for p in procs):
            return all(os.path.exists(p) for p in paths)
        time.sleep(0.05)
    return False


def run_ddp_once(backend: str, out: Path, sizes: Sizes, device: str) -> tuple[list[dict], str | None]:
    """Both ranks' results, or why the pair failed."""
    import torch.multiprocessing as mp

    # A CUDA parent must spawn its ranks; on the CPU, fork spares them importing torch again.
    ctx = mp.get_context("spawn" if device == "cuda" else "fork")
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        results = [os.path.join(tmp, f"rank{r}.json") for r in range(2)]
        procs = [ctx.Process(target=ddp_rank, args=(r, backend, port, str(out), sizes, device, results[r]))
                 for r in range(2)]
        for p in procs:
            p.start()
        # A backend that neither works nor fails (an NCCL hang) must not eat the budget: both
        # ranks say when their first all-reduce is through, and a rank done but not exiting
        # (a stuck destroy) is stopped once its result is written.
        up = _wait(procs, [r + ".up" for r in results], DDP_UP_S)
        done = up and _wait(procs, results, DDP_RUN_S)
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
        if not done and not all(os.path.exists(r) for r in results):
            return [], f"{backend}: the ranks did not {'finish (a timeout or a crash)' if up else 'start in time'}"
        ranks = [json.loads(Path(r).read_text()) if os.path.exists(r) else {"error": "no result"} for r in results]
    errors = [r["error"] for r in ranks if "error" in r]
    if errors:
        for fixed in (False, True):
            shutil.rmtree(out / run_name("ddp", fixed), ignore_errors=True)
        return [], f"{backend}: {errors[0]}"
    return ranks, None


def run_ddp(out: Path, sizes: Sizes, device: str) -> dict[bool, dict]:
    """The DDP pair (planted, fixed) from one pair of processes: NCCL when it allows two ranks on
    the one GPU, else gloo; the manifest says which, and why."""
    refused = []
    for backend in (["nccl", "gloo"] if device == "cuda" else ["gloo"]):
        ranks, error = run_ddp_once(backend, out, sizes, device)
        if not error:
            meta = {"backend": backend, "world_size": 2, "refused": refused,
                    "note": "both runs from one pair of rank processes; wall_s is each run's own"}
            return {fixed: {**ranks[0][variant], "ranks": [r[variant] for r in ranks],
                            "meta": {**meta, "bucket_cap_mb": 25.0 if fixed else sizes.ddp_small_bucket_mb}}
                    for fixed, variant in ((False, "planted"), (True, "fixed"))}
        refused.append(error)
    raise RuntimeError("; ".join(refused))


# --- JAX (a child process) ------------------------------------------------------------------------

def _jax_env() -> dict:
    import jax

    dev = jax.devices()[0]
    return {"framework": "jax", "jax": jax.__version__, "device": getattr(dev, "device_kind", str(dev)),
            "device_kind": dev.platform}


def _jax_mlp(sizes: Sizes, key, width: int | None = None):
    import jax
    import jax.numpy as jnp

    width = width or sizes.width
    keys = jax.random.split(key, sizes.depth + 1)
    return [(jax.random.normal(k, (width, width), jnp.float32) / width**0.5, jnp.zeros(width, jnp.float32))
            for k in keys]


def _jax_train_step(bf16: bool, highest: bool = False):
    """A jitted SGD step of the MLP; bf16: matmul inputs cast to bfloat16 (weights stay fp32)."""
    import jax
    import jax.numpy as jnp

    precision = jax.lax.Precision.HIGHEST if highest else None

    def dense(h, w, b):
        if bf16:
            return (h.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16)).astype(jnp.float32) + b
        return jnp.dot(h, w, precision=precision) + b

    def loss(params, x, y):
        h = x
        for w, b in params[:-1]:
            h = jax.nn.relu(dense(h, w, b))
        return jnp.mean((dense(h, *params[-1]) - y) ** 2)

    @jax.jit
    def step(params, x, y):
        grads = jax.grad(loss)(params, x, y)
        return jax.tree_util.tree_map(lambda p, g: p - 1e-3 * g, params, grads)
    return step


class JaxWork:
    """A JAX workload: ``step()`` advances ``self.params`` and returns them (so the step hook waits on them)."""

    def __init__(self, params, step: Callable[[Any], Any], meta: dict | None = None,
                 close: Callable[[], None] = lambda: None) -> None:
        self.params, self._step, self.meta, self.close = params, step, meta or {}, close

    def step(self):
        self.params = self._step(self.params)
        return self.params

    def sync(self) -> None:
        import jax

        jax.block_until_ready(self.params)


def jax_input_stall(sizes: Sizes, fixed: bool) -> JaxWork:
    import jax
    import numpy as np

    train = _jax_train_step(bf16=True)
    width = sizes.width // 2
    # Four times the layers on a quarter of the batch: the GPU's step outlasts a batch's read
    # spread over the readers, so the fixed twin is GPU-bound.
    params = _jax_mlp(replace(sizes, depth=4 * sizes.depth), jax.random.PRNGKey(0), width)
    rng = np.random.default_rng(0)
    stored = [(rng.standard_normal((sizes.batch // 4, width), np.float32),
               rng.standard_normal((sizes.batch // 4, width), np.float32)) for _ in range(2)]

    def read(index: int):
        time.sleep(sizes.read_ms / 1e3)           # slow storage: the wait, not the bytes, is the cost
        return stored[index % 2]

    count = iter(range(10**9))
    if fixed:
        # The fix: reads (and the copy to the device) run ahead of the step on a thread pool.
        pool = ThreadPoolExecutor(sizes.readers)
        fetch = lambda i: jax.device_put(read(i))  # noqa: E731
        ahead = deque(pool.submit(fetch, next(count)) for _ in range(2 * sizes.readers))

        def next_batch():
            ahead.append(pool.submit(fetch, next(count)))
            return ahead.popleft().result()
        close = lambda: pool.shutdown(wait=False, cancel_futures=True)  # noqa: E731
    else:
        def next_batch():
            return read(next(count))
        close = lambda: None  # noqa: E731
    return JaxWork(params, lambda p: train(p, *next_batch()),
                   {"read_ms": sizes.read_ms, "readers": sizes.readers if fixed else 1}, close)


def jax_tiny_calls(sizes: Sizes, fixed: bool) -> JaxWork:
    import jax
    import jax.numpy as jnp

    n = sizes.tiny_width
    x = jnp.ones((n, n), jnp.float32) / n

    def update(p):
        return p - 1e-3 * jnp.tanh(p @ x)

    tiny = jax.jit(update)
    looped = jax.jit(lambda p: jax.lax.fori_loop(0, sizes.tiny_calls, lambda _, q: update(q), p))

    def python_loop(p):
        for _ in range(sizes.tiny_calls):
            p = tiny(p)
        return p
    return JaxWork(jnp.eye(n, dtype=jnp.float32), looped if fixed else python_loop,
                   {"calls_per_step": sizes.tiny_calls})


def _device_batches(sizes: Sizes):
    import jax

    keys = jax.random.split(jax.random.PRNGKey(1), 4)
    shape = (sizes.batch, sizes.width)
    return [(jax.random.normal(keys[i], shape), jax.random.normal(keys[i + 2], shape)) for i in range(2)]


def jax_fp32(sizes: Sizes, fixed: bool) -> JaxWork:
    import jax

    train = _jax_train_step(bf16=fixed, highest=not fixed)
    batches = _device_batches(replace(sizes, batch=sizes.batch // 2))
    count = iter(range(10**9))
    return JaxWork(_jax_mlp(sizes, jax.random.PRNGKey(0)), lambda p: train(p, *batches[next(count) % 2]),
                   {"matmul": "bf16" if fixed else "fp32 Precision.HIGHEST"})


def jax_healthy(sizes: Sizes, fixed: bool) -> JaxWork:
    import jax

    train = _jax_train_step(bf16=True)
    batches = _device_batches(sizes)
    count = iter(range(10**9))
    return JaxWork(_jax_mlp(sizes, jax.random.PRNGKey(0)), lambda p: train(p, *batches[next(count) % 2]))


JAX_RUNNERS: dict[str, Callable[[Sizes, bool], JaxWork]] = {
    f.__name__: f for f in (jax_input_stall, jax_tiny_calls, jax_fp32, jax_healthy)}


def run_jax(scenario: Scenario, fixed: bool, out: Path, sizes: Sizes) -> dict:
    """One JAX run: warm up, time, then profile with the project's step hook."""
    from tb_gpuadvisor.jax import profile_steps

    work = JAX_RUNNERS[scenario.name](sizes, fixed)
    try:
        for _ in range(sizes.warmup):
            work.step()
        timing = timed_loop(work, sizes)    # type: ignore[arg-type]
        advisor = profile_steps(str(out / run_name(scenario.name, fixed)), steps=sizes.active,
                                warmup_steps=JAX_WARMUP, print_report=False)
        step = advisor.wrap(work.step)
        for _ in range(JAX_WARMUP + sizes.active + 2):    # warm-up, the lead-in step, the profiled ones, the stop
            step()
        work.sync()
        advisor.finish()
    finally:
        work.close()
    session = (advisor.report or {}).get("sessions", [{}])[0]
    return {**timing, "meta": work.meta, "inloop_first_check": (session.get("first_fix") or {}).get("check"),
            "inloop_problem": advisor.window.problem}


# --- the run ----------------------------------------------------------------------------------------

@dataclass
class Budget:
    """Skips what would not finish in time: a pair starts only when the slowest pair so far fits."""

    deadline: float
    longest: float = 0.0

    def allows(self, at_least: float = 0.0) -> bool:
        """Whether a pair expected to take AT_LEAST seconds (or the slowest so far) still fits."""
        return time.time() + max(1.2 * self.longest, at_least) < self.deadline

    def took(self, seconds: float) -> None:
        self.longest = max(self.longest, seconds)


def run_scenarios(names: list[Scenario], out: Path, sizes: Sizes, budget: Budget,
                  run: Callable[[Scenario, bool], dict], env: dict,
                  at_least: float = 0.0) -> tuple[list[dict], list[dict]]:
    """Each scenario, then its fixed twin; manifest entries and skips. AT_LEAST: seconds a pair
    is expected to take before one has been timed."""
    runs, skipped = [], []
    for scenario in names:
        if not budget.allows(at_least):
            skipped.append({"scenario": scenario.name, "reason": "time budget spent"})
            continue
        t0 = time.time()
        pair = []
        for fixed in ([False, True] if scenario.fix else [False]):
            started = time.time()
            try:
                result = run(scenario, fixed)
            except Exception as err:   # one broken scenario never costs the others their device time
                skipped.append({"scenario": run_name(scenario.name, fixed), "reason": f"failed: {err!r}"[:500]})
                break
            backend = result.get("meta", {}).get("backend")
            pair.append({"scenario": scenario.name, "run": run_name(scenario.name, fixed),
                         "logdir": run_name(scenario.name, fixed), "variant": "fixed" if fixed else "planted",
                         **env, "planted": None if fixed else scenario.planted, "fix": scenario.fix if fixed else None,
                         "expected_first_check": None if fixed else expected_check(scenario, backend),
                         # With gloo the all-reduce still goes through the host after the fix: the
                         # twin is held to the saving only.
                         "absent_check": expected_check(scenario, backend) if fixed and backend != "gloo" else None,
                         "expected_saving": scenario.saving, "wall_s": round(time.time() - started, 2), **result})
            print(f"{pair[-1]['run']:28s} {result['step_ms']:9.3f} ms/step  ({pair[-1]['wall_s']:.1f} s)", flush=True)
        if len(pair) == 2:
            before, after = (argparse.Namespace(**p) for p in pair)
            pair[0]["measured_saving_ms"] = round(eval(scenario.saving, {"__builtins__": {}},  # noqa: S307
                                                       {"before": before, "fixed": after}), 4)
        runs += pair
        budget.took(time.time() - t0)
    return runs, skipped


def jax_child(out: Path, smoke: bool, deadline: float, only: list[str]) -> None:
    """The JAX scenarios, in their own process; writes JAX_RUNS."""
    sizes = SMOKE_SIZES if smoke else GPU_SIZES
    env = _jax_env()
    budget = Budget(deadline)
    names = [by_name(name) for name in only]
    runs, skipped = run_scenarios(names, out, sizes, budget, lambda s, fixed: run_jax(s, fixed, out, sizes), env)
    (out / JAX_RUNS).write_text(json.dumps({"runs": runs, "skipped": skipped}))


def run_all(out: Path, smoke: bool, budget_s: float, only: list[str] | None) -> dict:
    import torch

    started = time.time()
    budget = Budget(started + budget_s)
    cuda = torch.cuda.is_available() and not smoke
    device = "cuda" if cuda else "cpu"
    sizes = GPU_SIZES if cuda else SMOKE_SIZES
    if not cuda:
        torch.set_num_threads(1)        # tiny ops: idle worker threads only slow a shared machine down
    chosen = [s for s in SCENARIOS if only is None or s.name in only]
    skipped = [{"scenario": s.name, "reason": "needs CUDA"} for s in chosen if s.needs_cuda and not cuda]
    chosen = [s for s in chosen if cuda or not s.needs_cuda]
    out.mkdir(parents=True, exist_ok=True)
    env = _torch_env(cuda)
    torch_names = [s for s in chosen if s.framework == "pytorch" and s.name != "ddp"]
    runs, skip = run_scenarios(torch_names, out, sizes, budget,
                               lambda s, fixed: run_torch(s, fixed, out, sizes, device), env)
    skipped += skip
    if cuda:
        torch.cuda.empty_cache()
    if any(s.framework == "jax" for s in chosen):
        runs_j, skip_j = _jax_group(out, [s.name for s in chosen if s.framework == "jax"], not cuda, budget)
        runs += runs_j
        skipped += skip_j
    if any(s.name == "ddp" for s in chosen):
        pair: dict[bool, dict] = {}

        def ddp(scenario: Scenario, fixed: bool) -> dict:
            if not pair:
                pair.update(run_ddp(out, sizes, device))
            return pair[fixed]
        runs_d, skip_d = run_scenarios([by_name("ddp")], out, sizes, budget, ddp, env, DDP_EXPECTED_S if cuda else 0.0)
        runs += runs_d
        skipped += skip_d
    return {"mode": "gpu" if cuda else "cpu-smoke", "host": platform.node(), "python": platform.python_version(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "budget_s": budget_s,
            "elapsed_s": round(time.time() - started, 1), "sizes": asdict(sizes),
            "profile": {"torch_schedule": {"wait": WAIT, "warmup": PROFILER_WARMUP, "active": sizes.active},
                        "jax_profile_steps": {"warmup_steps": JAX_WARMUP, "steps": sizes.active}},
            "scenarios": [asdict(s) for s in SCENARIOS], "runs": runs, "skipped": skipped}


def _jax_group(out: Path, names: list[str], smoke: bool, budget: Budget) -> tuple[list[dict], list[dict]]:
    """Run the JAX scenarios in a child process (JAX must not share the process, or CUPTI, with torch)."""
    if not budget.allows(JAX_START_S if not smoke else 0.0):
        return [], [{"scenario": n, "reason": "time budget spent"} for n in names]
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    if smoke:
        env["JAX_PLATFORMS"] = "cpu"
    (out / JAX_RUNS).unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--jax-child", str(out), "--deadline", str(budget.deadline),
           "--only", *names] + (["--cpu-smoke"] if smoke else [])
    child = subprocess.run(cmd, env=env, timeout=max(30.0, budget.deadline - time.time() + 60))
    if not (out / JAX_RUNS).exists():
        return [], [{"scenario": n, "reason": f"the JAX process failed (exit {child.returncode})"} for n in names]
    result = json.loads((out / JAX_RUNS).read_text())
    (out / JAX_RUNS).unlink()
    return result["runs"], result["skipped"]


# --- packing ---------------------------------------------------------------------------------------

DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}


def _trim_kineto(path: Path, keep: int) -> None:
    """Keep the first KEEP ProfilerStep windows of a Kineto trace: the host events that start before
    the next step, the device work they launched (by correlation id, however late it ran), and the
    events without a time (metadata)."""
    data = json.loads(path.read_text())
    events = data.get("traceEvents", [])
    starts = sorted(float(e["ts"]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#") and "ts" in e)
    if len(starts) <= keep:
        return
    cut = starts[keep]

    def device(e: dict) -> bool:
        return e.get("cat") in DEVICE_CATEGORIES

    host = [e for e in events if "ts" in e and not device(e) and float(e["ts"]) < cut]
    launched = {e.get("args", {}).get("correlation") for e in host} - {None}
    data["traceEvents"] = [e for e in events if "ts" not in e or (not device(e) and float(e["ts"]) < cut)
                           or (device(e) and (e.get("args", {}).get("correlation") in launched
                                              or ("correlation" not in e.get("args", {}) and float(e["ts"]) < cut)))]
    path.write_text(json.dumps(data))


def _gz_size(path: Path) -> int:
    """Bytes PATH (a file or a folder) takes gzipped, with a tar header per file."""
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    return sum(len(gzip.compress(f.read_bytes(), 6)) + 512 for f in files)


def pack(out: Path, dest: Path) -> list[Path]:
    """Tar OUT's runs and manifest into at most PACK_ARCHIVES .tar.gz under DEST, each under PACK_LIMIT
    and all under PACK_TOTAL, trimming Kineto runs' profile windows (biggest first) until they fit."""
    manifest = json.loads((out / MANIFEST).read_text())
    runs = [out / r["logdir"] for r in manifest["runs"] if (out / r["logdir"]).is_dir()]
    kept = {run: manifest["profile"]["torch_schedule"]["active"] for run in runs}
    sizes = {run: _gz_size(run) for run in runs}
    try:
        while any(size > PACK_LIMIT for size in sizes.values()) or sum(sizes.values()) > PACK_TOTAL:
            trimmable = [r for r in runs if kept[r] > 1 and any(r.glob("*.pt.trace.json"))]
            candidates = [r for r in trimmable if sizes[r] > PACK_LIMIT] or trimmable
            if not candidates:
                raise SystemExit(f"the captures take {sum(sizes.values()) / 2**20:.1f} MiB compressed even trimmed")
            run = max(candidates, key=lambda r: sizes[r])
            kept[run] -= 1
            for trace in run.glob("*.pt.trace.json"):
                _trim_kineto(trace, kept[run])
            sizes[run] = _gz_size(run)
            manifest.setdefault("trimmed_to_steps", {})[run.name] = kept[run]
    finally:   # the manifest says which runs were trimmed, even when they still do not fit
        (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    bins: list[list[Path]] = [[] for _ in range(PACK_ARCHIVES)]
    loads = [_gz_size(out / MANIFEST)] + [0] * (PACK_ARCHIVES - 1)
    for run in sorted(runs, key=lambda r: -sizes[r]):
        best = min(range(PACK_ARCHIVES), key=lambda i: loads[i])
        if loads[best] + sizes[run] > PACK_LIMIT:
            raise SystemExit(f"{run.name}: {sizes[run] / 2**20:.1f} MiB compressed does not fit the archives")
        bins[best].append(run)
        loads[best] += sizes[run]
    dest.mkdir(parents=True, exist_ok=True)
    archives = []
    for i, members in enumerate(bins):
        if not members and i:
            continue
        path = dest / f"gpu_truth_{i + 1}.tar.gz"
        with tarfile.open(path, "w:gz") as tar:
            if i == 0:
                tar.add(out / MANIFEST, arcname=MANIFEST)
            for run in members:
                tar.add(run, arcname=run.name)
        archives.append(path)
        print(f"{path}: {path.stat().st_size / 2**20:.2f} MiB ({', '.join(r.name for r in members) or MANIFEST})")
    return archives


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for the runs' logdirs and manifest.json")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU (automatic without CUDA)")
    parser.add_argument("--budget", type=float, help="seconds the whole run may take")
    parser.add_argument("--only", nargs="+", metavar="SCENARIO", help="run only these scenarios")
    parser.add_argument("--pack", nargs=2, type=Path, metavar=("OUT", "DEST"), help="archive OUT's captures into DEST")
    parser.add_argument("--jax-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.only and (unknown := set(args.only) - {s.name for s in SCENARIOS}):
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    if args.jax_child:
        jax_child(args.jax_child, args.cpu_smoke, args.deadline, args.only)
        return 0
    if args.pack:
        if not (args.pack[0] / MANIFEST).is_file():
            parser.error(f"{args.pack[0]}: no {MANIFEST} (write the runs with --out first)")
        pack(*args.pack)
        return 0
    if not args.out:
        parser.error("--out or --pack is required")
    smoke = args.cpu_smoke
    budget = args.budget or (SMOKE_BUDGET_S if smoke else GPU_BUDGET_S)
    manifest = run_all(args.out, smoke, budget, args.only)
    (args.out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    for skip in manifest["skipped"]:
        print(f"skipped {skip['scenario']}: {skip['reason']}")
    print(f"{len(manifest['runs'])} runs in {manifest['elapsed_s']} s ({manifest['mode']}); {args.out / MANIFEST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
