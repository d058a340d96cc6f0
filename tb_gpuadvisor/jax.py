"""``profile_steps``: profile a few settled steps of a JAX training loop and print what to fix.

As a context manager around the loop, marking each step::

    from tb_gpuadvisor.jax import profile_steps
    with profile_steps("logs/run1", steps=5) as advisor:
        for batch in batches:
            with advisor.step():
                state = train_step(state, batch)

or as a step hook that wraps the step function (and waits for its result while it is
being profiled, so each marked step holds its device work)::

    advisor = profile_steps("logs/run1")
    train_step = advisor.wrap(train_step)
    for batch in batches:
        state = train_step(state, batch)
    advisor.finish()

Steps are marked with ``jax.profiler.StepTraceAnnotation``; the capture goes to
``<log_dir>/plugins/profile/<session>/`` and is analysed in a separate process while
the loop goes on. Importing this module does not import JAX.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

from tb_gpuadvisor.inloop import AdvisorFindingError, Phase, StepWindow, Tracer, Warmup

__all__ = ["AdvisorFindingError", "ProfileSteps", "profile_steps"]

F = TypeVar("F", bound=Callable[..., Any])


def _jax_tracer() -> Tracer:
    import jax

    return Tracer(start=lambda log_dir: jax.profiler.start_trace(log_dir), stop=jax.profiler.stop_trace,
                  step_marker=lambda step: jax.profiler.StepTraceAnnotation("train", step_num=step))


class ProfileSteps:
    """Counts the steps of a JAX loop, profiles ``steps`` of them after warm-up and gives advice.

    The advice is printed (and ``fail_on`` checked) when the ``with`` block ends or
    :meth:`finish` is called.
    """

    def __init__(self, log_dir: str, steps: int = 5, warmup_steps: Warmup = "auto",
                 print_report: bool = True, fail_on: str | None = None) -> None:
        self.window = StepWindow(log_dir, _jax_tracer(), steps, warmup_steps, print_report, fail_on)
        self.step_count = 0

    @property
    def profiling(self) -> bool:
        return self.window.phase is Phase.PROFILING

    @property
    def report(self) -> dict | None:
        """The analysis report (the CLI's JSON) once :meth:`finish` has run."""
        return self.window.report

    def _begin(self) -> None:
        self.window.begin(self.step_count)
        self.step_count += 1

    @contextmanager
    def step(self) -> Iterator[None]:
        """Marks one training step: the body of the ``with`` block."""
        self._begin()
        try:
            yield
        finally:
            self.window.end()

    def wrap(self, step_fn: F) -> F:
        """STEP_FN as a step hook: each call starts a step that lasts until the next call (so the
        loop's own work, such as loading the next batch, belongs to a step); profiled calls wait
        for their result, so each profiled step holds its device work."""
        import jax

        @functools.wraps(step_fn)
        def step(*args: Any, **kwargs: Any) -> Any:
            self._begin()
            out = step_fn(*args, **kwargs)
            if self.profiling:
                jax.block_until_ready(out)
            return out

        return step  # type: ignore[return-value]

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
    """Profile ``steps`` steps of a JAX loop once step times settle (or after ``warmup_steps``).

    ``fail_on`` (``"warning"`` or ``"critical"``) raises ``AdvisorFindingError`` at the end when
    a finding that severe (and not of low confidence) appears.
    """
    return ProfileSteps(log_dir, steps, warmup_steps, print_report, fail_on)
