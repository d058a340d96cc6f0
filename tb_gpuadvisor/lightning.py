"""``AdvisorCallback``: profile a few settled ``training_step`` batches of a Lightning ``Trainer``.

::

    from tb_gpuadvisor.lightning import AdvisorCallback
    trainer = lightning.Trainer(max_epochs=3, callbacks=[AdvisorCallback()])

The capture goes beside the Trainer's logs (``trainer.log_dir``: its TensorBoard or CSV
logger's version folder, else ``default_root_dir``), so ``tensorboard --logdir lightning_logs``
shows the Advisor tab next to the losses. It is analysed in a separate process while training
goes on; when ``fit`` ends the top findings are printed and their numbers are logged through
the Trainer's logger (``gpuadvisor/step_ms``, ``gpuadvisor/findings``, ``gpuadvisor/top_saving_ms``).
Under DDP every rank records and global rank 0 analyses all ranks' traces.

Importing this module loads neither Lightning nor PyTorch: ``AdvisorCallback`` is built on
first use, on ``lightning.pytorch`` (or ``pytorch_lightning`` where only that is installed).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from tb_gpuadvisor.inloop import AdvisorFindingError, StepWindow, Warmup, check_options, summary_metrics
from tb_gpuadvisor.torch import torch_tracer

__all__ = ["AdvisorCallback", "AdvisorFindingError"]


class _AdvisorHooks:
    """The callback's behaviour; combined with Lightning's ``Callback`` base on first use."""

    def __init__(self, log_dir: str | None = None, steps: int = 5, warmup_steps: Warmup = "auto",
                 print_report: bool = True, fail_on: str | None = None) -> None:
        super().__init__()
        check_options(steps, warmup_steps, fail_on)
        self.log_dir = log_dir
        self.steps = steps
        self.warmup_steps = warmup_steps
        self.print_report = print_report
        self.fail_on = fail_on
        self.window: StepWindow | None = None
        self._batches = 0

    @property
    def report(self) -> dict | None:
        """The analysis report (the CLI's JSON) of the last ``fit``, once it has ended (rank 0)."""
        return self.window.report if self.window is not None else None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # trainer.log_dir is a collective (rank 0's folder, broadcast): every rank asks for it.
        log_dir = self.log_dir or trainer.log_dir or trainer.default_root_dir
        tracer = torch_tracer(trainer.global_rank, trainer.world_size, trainer.strategy.barrier)
        self.window = StepWindow(log_dir, tracer, self.steps, self.warmup_steps, self.print_report, self.fail_on,
                                 analyse=trainer.is_global_zero)
        self._batches = 0

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.window is None:
            return
        total = trainer.num_training_batches
        room = int(total) - batch_idx if total != float("inf") else None
        self.window.begin(self._batches, room=room)
        self._batches += 1

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.window is not None:
            self.window.interrupt()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.window is None:
            return
        try:
            self.window.finish()
        finally:    # logged before AdvisorFindingError leaves fit
            metrics = summary_metrics(self.window.report)
            if metrics and trainer.logger is not None:
                trainer.logger.log_metrics(metrics, step=trainer.global_step)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Training failed: a running capture stops, and no advice is given."""
        if self.window is not None:
            self.window.interrupt()


_CLASS_DOC = """Profiles ``steps`` settled training batches, analyses them in the background and
prints the top findings with their savings and fixes when ``fit`` ends.

Args:
    log_dir: TensorBoard log dir (run folder) for the capture; default ``trainer.log_dir``.
    steps: batches to profile, 1 to 10.
    warmup_steps: ``"auto"`` waits until the last few batch times agree (at most 50 batches);
        an int skips that many batches.
    print_report: print the advice when training ends (a one-line summary is logged anyway).
    fail_on: ``"warning"`` or ``"critical"``: raise ``AdvisorFindingError`` after training when a
        finding this severe (and not of low confidence) appears, e.g. in CI smoke tests.
"""


def _lightning_callback_base() -> type:
    """Lightning's Callback: the unified ``lightning`` package's, else ``pytorch_lightning``'s."""
    for package, module in (("lightning", "lightning.pytorch"), ("pytorch_lightning", "pytorch_lightning")):
        if importlib.util.find_spec(package) is not None:
            return importlib.import_module(module).Callback
    raise ImportError("tb_gpuadvisor.lightning.AdvisorCallback needs PyTorch Lightning: pip install lightning")


def __getattr__(name: str) -> Any:
    """Builds ``AdvisorCallback`` when it is first asked for, so importing this module stays cheap."""
    if name != "AdvisorCallback":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = type("AdvisorCallback", (_AdvisorHooks, _lightning_callback_base()),
               {"__module__": __name__, "__doc__": _CLASS_DOC})
    globals()[name] = cls
    return cls
