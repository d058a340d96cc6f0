"""``AdvisorCallback``: profile a few settled steps of ``model.fit`` and print what to fix.

::

    from tb_gpuadvisor.keras import AdvisorCallback
    model.fit(data, epochs=3, callbacks=[AdvisorCallback(log_dir="logs/run1")])

The capture goes to ``<log_dir>/plugins/profile/<session>/`` (TensorBoard's layout,
so its Profile tab and the Advisor tab show the same capture); it is analysed in a
separate low-priority process while training goes on, and the advice is printed
when ``fit`` returns.

Importing this module loads neither Keras nor TensorFlow: ``AdvisorCallback`` is
built on first use, on the Keras that TensorFlow uses (Keras 3, or Keras 2 from
``tf_keras`` when ``TF_USE_LEGACY_KERAS`` is set).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from tb_gpuadvisor.inloop import (
    AdvisorFindingError, StepWindow, Tracer, Warmup, check_options, log,
)

__all__ = ["AdvisorCallback", "AdvisorFindingError", "is_chief"]

# Keras' TensorBoard callback writes to "logs" by default; so does this one.
DEFAULT_LOG_DIR = "logs"


def is_chief(task_type: str | None, task_id: int | None, cluster: dict | None) -> bool:
    """Whether this process is the one that reports, in a multi-worker job.

    The chief task is; without one, worker 0 is (TensorFlow's own convention);
    parameter servers and evaluators never are. A process outside any cluster is.
    """
    if not task_type or task_type == "chief":
        return True
    return task_type == "worker" and task_id == 0 and "chief" not in (cluster or {})


def _task(model: Any) -> tuple[str | None, int | None, dict | None]:
    """This process's task in the model's distribution strategy (all None when not distributed)."""
    strategy = getattr(model, "distribute_strategy", None)
    resolver = getattr(strategy, "cluster_resolver", None)
    task_type = getattr(resolver, "task_type", None)
    if resolver is None or not task_type:
        return None, None, None
    return task_type, resolver.task_id, resolver.cluster_spec().as_dict()


# Keras 3's own TensorBoard callback marks each profiled batch of model.fit with this name (and
# no _r=1, which marks a custom loop's step): the analysis then knows the steps are fit's, whose
# step already runs as a tf.function and whose loop over the data it does not own.
FIT_STEP_MARKER = "Profiled batch"


def _tf_tracer() -> Tracer:
    """TensorFlow's profiler, with each step marked the way model.fit marks it.

    TensorFlow is loaded here, on first use, never when this module is imported."""
    profiler = importlib.import_module("tensorflow").profiler.experimental
    return Tracer(start=lambda log_dir: profiler.start(log_dir), stop=profiler.stop,
                  step_marker=lambda step: profiler.Trace(FIT_STEP_MARKER, step_num=step))


class _AdvisorHooks:
    """The callback's behaviour; combined with the right Keras ``Callback`` base on first use."""

    def __init__(self, log_dir: str | None = None, warmup_steps: Warmup = "auto", steps: int = 5,
                 print_report: bool = True, fail_on: str | None = None,
                 profile_workers: bool = False) -> None:
        """See the class docstring; ``profile_workers`` also captures on non-chief workers."""
        super().__init__()
        check_options(steps, warmup_steps, fail_on)
        self.log_dir = log_dir or DEFAULT_LOG_DIR
        self.warmup_steps = warmup_steps
        self.steps = steps
        self.print_report = print_report
        self.fail_on = fail_on
        self.profile_workers = profile_workers
        self.window: StepWindow | None = None

    @property
    def report(self) -> dict | None:
        """The analysis report (the CLI's JSON) of the last ``fit``, once it has ended."""
        return self.window.report if self.window is not None else None

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.window = None
        backend = _keras_backend()
        if backend != "tensorflow":
            log.warning("tb_gpuadvisor: AdvisorCallback profiles the TensorFlow backend, not %r; "
                        "for JAX use tb_gpuadvisor.jax.profile_steps", backend)
            return
        chief = is_chief(*_task(self.model))
        if chief or self.profile_workers:
            self.window = StepWindow(self.log_dir, _tf_tracer(), self.steps, self.warmup_steps,
                                     self.print_report, self.fail_on, analyse=chief)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self.window is not None:
            total = (self.params or {}).get("steps")
            self.window.begin(batch, room=total - batch if total else None)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.window is not None:
            self.window.interrupt()

    def on_train_end(self, logs: dict | None = None) -> None:
        if self.window is not None:
            self.window.finish()


_CLASS_DOC = """Profiles ``steps`` settled training steps, analyses them in the background and
prints the top findings with their savings and fixes when ``fit`` ends.

Args:
    log_dir: TensorBoard log dir for the capture (default ``logs``).
    warmup_steps: ``"auto"`` waits until the last few step times agree (at most 50 steps);
        an int skips that many steps.
    steps: steps to profile, 1 to 10 (with ``steps_per_execution`` > 1, whole executions are
        profiled, one step marker each).
    print_report: print the advice when training ends (a one-line summary is logged anyway).
    fail_on: ``"warning"`` or ``"critical"``: raise ``AdvisorFindingError`` after training when a
        finding this severe (and not of low confidence) appears, e.g. in CI smoke tests.
    profile_workers: on non-chief workers of a multi-worker strategy, capture too (without
        analysing); by default they do nothing.
"""


def _keras_module() -> Any:
    """The Keras TensorFlow trains with: tf_keras under TF_USE_LEGACY_KERAS, else keras."""
    if os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true", "yes"):
        try:
            import tf_keras

            return tf_keras
        except ImportError:
            pass
    import keras

    return keras


def _keras_backend() -> str:
    backend = getattr(_keras_module().backend, "backend", None)
    return backend() if callable(backend) else "tensorflow"


def __getattr__(name: str) -> Any:
    """Builds ``AdvisorCallback`` when it is first asked for, so importing this module stays cheap."""
    if name != "AdvisorCallback":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    base = _keras_module().callbacks.Callback
    cls = type("AdvisorCallback", (_AdvisorHooks, base), {"__module__": __name__, "__doc__": _CLASS_DOC})
    globals()[name] = cls
    return cls
