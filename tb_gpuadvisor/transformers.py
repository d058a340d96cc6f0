"""``AdvisorCallback``: profile a few settled optimizer steps of a Hugging Face ``Trainer``.

::

    from tb_gpuadvisor.transformers import AdvisorCallback
    Trainer(model=model, args=args, train_dataset=data, callbacks=[AdvisorCallback()]).train()

A step runs from one ``on_step_begin`` to the next, so it holds the fetching of its batches.
The capture goes where the Trainer's TensorBoard scalars go: ``args.logging_dir`` (Transformers
4), else ``$TENSORBOARD_LOGGING_DIR``, else ``<output_dir>/runs`` (the folder above the run
folders Transformers 5 names by time and host), so ``tensorboard --logdir`` on it shows the
Advisor tab next to the scalars. It is analysed in a separate process while training goes on,
and the top findings are printed when ``train()`` ends. Under DDP every rank records and the
main process analyses all ranks' traces.

Importing this module loads neither Transformers nor PyTorch: ``AdvisorCallback`` is built on
first use, on ``transformers.TrainerCallback``.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
from typing import Any

from tb_gpuadvisor.inloop import AdvisorFindingError, StepWindow, Warmup, check_options
from tb_gpuadvisor.torch import torch_tracer

__all__ = ["AdvisorCallback", "AdvisorFindingError", "trainer_log_dir"]


def trainer_log_dir(args: Any) -> str:
    """Where the Trainer's TensorBoard callback writes, or the folder holding its run folders."""
    return (getattr(args, "logging_dir", None) or os.environ.get("TENSORBOARD_LOGGING_DIR")
            or os.path.join(args.output_dir, "runs"))


class _AdvisorHooks:
    """The callback's behaviour; combined with ``transformers.TrainerCallback`` on first use."""

    def __init__(self, log_dir: str | None = None, steps: int = 5, warmup_steps: Warmup = "auto",
                 print_report: bool = True, fail_on: str | None = None) -> None:
        check_options(steps, warmup_steps, fail_on)
        self.log_dir = log_dir
        self.steps = steps
        self.warmup_steps = warmup_steps
        self.print_report = print_report
        self.fail_on = fail_on
        self.window: StepWindow | None = None
        self._steps_begun = 0
        self._epoch_left: int | None = None     # optimizer steps the epoch has left, when known

    @property
    def report(self) -> dict | None:
        """The analysis report (the CLI's JSON) of the last ``train()``, once it has ended."""
        return self.window.report if self.window is not None else None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        tracer = torch_tracer(args.process_index, args.world_size)
        self.window = StepWindow(self.log_dir or trainer_log_dir(args), tracer, self.steps, self.warmup_steps,
                                 self.print_report, self.fail_on, analyse=state.is_world_process_zero)
        self._steps_begun = 0

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loader = kwargs.get("train_dataloader")
        try:
            self._epoch_left = math.ceil(len(loader) / args.gradient_accumulation_steps)
        except TypeError:       # no loader, or an iterable one without a length
            self._epoch_left = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.window is None:
            return
        rooms = [r for r in (self._epoch_left, state.max_steps - state.global_step if state.max_steps > 0 else None)
                 if r is not None]
        self.window.begin(self._steps_begun, room=min(rooms) if rooms else None)
        self._steps_begun += 1
        if self._epoch_left is not None:
            self._epoch_left -= 1

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.window is not None:
            self.window.interrupt()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.window is not None:
            self.window.finish()


_CLASS_DOC = """Profiles ``steps`` settled optimizer steps, analyses them in the background and
prints the top findings with their savings and fixes when ``train()`` ends.

Args:
    log_dir: TensorBoard log dir (run folder) for the capture; default: where the Trainer's
        TensorBoard scalars go (see the module docstring).
    steps: optimizer steps to profile, 1 to 10.
    warmup_steps: ``"auto"`` waits until the last few step times agree (at most 50 steps);
        an int skips that many steps.
    print_report: print the advice when training ends (a one-line summary is logged anyway).
    fail_on: ``"warning"`` or ``"critical"``: raise ``AdvisorFindingError`` after training when a
        finding this severe (and not of low confidence) appears, e.g. in CI smoke tests.
"""


def __getattr__(name: str) -> Any:
    """Builds ``AdvisorCallback`` when it is first asked for, so importing this module stays cheap."""
    if name != "AdvisorCallback":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if importlib.util.find_spec("transformers") is None:
        raise ImportError("tb_gpuadvisor.transformers.AdvisorCallback needs Transformers: pip install transformers")
    base = importlib.import_module("transformers").TrainerCallback
    cls = type("AdvisorCallback", (_AdvisorHooks, base), {"__module__": __name__, "__doc__": _CLASS_DOC})
    globals()[name] = cls
    return cls
