"""tb-gpuadvisor: ranked GPU performance fixes from TensorFlow, JAX and PyTorch profiles.

Importing the package is cheap on purpose (TensorBoard imports every plugin
at start-up); the heavy modules load when an analysis runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tb_gpuadvisor.notebook import Advice

__version__ = "0.1.0"


def advise(source: Any) -> Advice:
    """The advice on a finished ``torch.profiler.profile``, a trace file or a logdir: prints as the
    CLI's text, shows as a table in Jupyter (see ``tb_gpuadvisor.notebook``)."""
    from tb_gpuadvisor.notebook import advise as advise_now

    return advise_now(source)
