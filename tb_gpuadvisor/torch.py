"""``profile_steps``: profile a few settled steps of a PyTorch training loop and print what to fix.

::

    from tb_gpuadvisor.torch import profile_steps
    with profile_steps("logs/run1", steps=5) as advisor:
        for x, y in loader:
            train_step(x, y)
            advisor.step()

``advisor.step()`` ends one step and starts the next, as ``torch.profiler.profile.step()`` does,
so the time the loop spends getting the next batch belongs to a step. Steps are marked
``ProfilerStep#N``; the capture is ``torch.profiler.tensorboard_trace_handler``'s
``<log_dir>/<worker>.<time>.pt.trace.json`` (the log dir is the run folder TensorBoard lists),
analysed in a separate process while the loop goes on. In a job of several processes
(DDP, ``torchrun``), every rank records and rank 0 analyses the session of all ranks once
every rank has stopped its capture, when the block ends.

The Lightning and Hugging Face callbacks (``tb_gpuadvisor.lightning``,
``tb_gpuadvisor.transformers``) record through the same profiler. Importing this module does
not import PyTorch: the package's own modules import the real ``torch`` by its absolute name.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Callable

from tb_gpuadvisor.inloop import AdvisorFindingError, Phase, StepWindow, Tracer, Warmup, check_options
from tb_gpuadvisor.metadata import KINETO_SUFFIXES
from tb_gpuadvisor.vocab.pytorch import STEP_ANNOTATION

__all__ = ["AdvisorFindingError", "ProfileSteps", "profile_steps", "torch_tracer"]


def trace_files(log_dir: str) -> list[str]:
    """The PyTorch traces in the run folder LOG_DIR (not in the folders below it)."""
    try:
        names = os.listdir(log_dir)
    except OSError:
        return []
    return [os.path.join(log_dir, name) for name in names if name.endswith(KINETO_SUFFIXES)]


def worker_name(rank: int, world_size: int) -> str:
    """The trace's host name: the machine and the rank in a job of several processes (the
    session's hosts are then its ranks), else the machine and the process, as PyTorch names it."""
    host = socket.gethostname()
    return f"{host}_rank{rank}" if world_size > 1 else f"{host}_{os.getpid()}"


class _TorchProfiler:
    """``torch.profiler.profile`` started and stopped by the step window (no schedule: the window
    decides when), with CPU activity and CUDA activity where a GPU is present (ROCm's too, which
    PyTorch reports as CUDA)."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self._profile: Any = None

    def start(self, log_dir: str) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._profile = profile(activities=activities,
                                on_trace_ready=tensorboard_trace_handler(log_dir, worker_name=self.worker))
        self._profile.start()

    def stop(self) -> None:
        """Stops recording; the trace handler writes the trace file before this returns."""
        running, self._profile = self._profile, None
        running.stop()

    def marker(self, step: int) -> Any:
        from torch.profiler import record_function

        return record_function(f"{STEP_ANNOTATION}{step}")


def torch_tracer(rank: int = 0, world_size: int = 1, peers: Callable[[], None] | None = None) -> Tracer:
    """The PyTorch profiler as the step window's tracer, for process RANK of WORLD_SIZE; in a job of
    several, PEERS waits for the others (default: torch.distributed's barrier)."""
    profiler = _TorchProfiler(worker_name(rank, world_size))
    return Tracer(profiler.start, profiler.stop, profiler.marker, captures=trace_files,
                  peers=(peers or _barrier) if world_size > 1 else None)


def _process_group() -> tuple[int, int]:
    """(rank, world size) of torch.distributed's default group, (0, 1) without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


class ProfileSteps:
    """Counts the steps of a PyTorch loop, profiles ``steps`` of them after warm-up and gives advice.

    The advice is printed (and ``fail_on`` checked) when the ``with`` block ends or
    :meth:`finish` is called: in a job of several processes every rank must reach it (rank 0
    waits there for the others' captures), and only rank 0 prints and raises.
    """

    def __init__(self, log_dir: str, steps: int = 5, warmup_steps: Warmup = "auto",
                 print_report: bool = True, fail_on: str | None = None) -> None:
        check_options(steps, warmup_steps, fail_on)
        self.rank, self.world_size = _process_group()
        self.window = StepWindow(log_dir, torch_tracer(self.rank, self.world_size), steps,
                                 warmup_steps, print_report, fail_on, analyse=self.rank == 0)
        self.step_count = 0

    @property
    def profiling(self) -> bool:
        return self.window.phase is Phase.PROFILING

    @property
    def report(self) -> dict | None:
        """The analysis report (the CLI's JSON) once :meth:`finish` has run (rank 0 only)."""
        return self.window.report

    def step(self) -> None:
        """One step ended and the next starts (call it after each training step)."""
        self.window.begin(self.step_count)
        self.step_count += 1

    def finish(self) -> None:
        """Stops a running capture, waits for the analysis, prints it; may raise AdvisorFindingError."""
        self.window.finish()

    def __enter__(self) -> "ProfileSteps":
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: Any) -> None:
        if exc_type is None:
            self.finish()
        else:   # the loop failed: stop profiling and let its error through, without advice
            self.window.interrupt()


def profile_steps(log_dir: str, steps: int = 5, warmup_steps: Warmup = "auto", *,
                  print_report: bool = True, fail_on: str | None = None) -> ProfileSteps:
    """Profile ``steps`` steps of a PyTorch loop once step times settle (or after ``warmup_steps``).

    ``fail_on`` (``"warning"`` or ``"critical"``) raises ``AdvisorFindingError`` at the end when
    a finding that severe (and not of low confidence) appears.
    """
    return ProfileSteps(log_dir, steps, warmup_steps, print_report, fail_on)
