"""``advise(x)``: the advice on a capture at hand, in a notebook or a script.

X is a finished ``torch.profiler.profile`` object, a trace file, a session or run folder,
or a logdir. The result prints as the CLI's text and shows in Jupyter as a table of the
ranked findings; ``.report`` is the CLI's JSON. Nothing here imports PyTorch: a profile
object is asked to export its trace, which is then read like any other.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.multihost import build_report
from tb_gpuadvisor.render import render_html, render_text
from tb_gpuadvisor.torch import worker_name


@dataclass(frozen=True)
class Advice:
    """The report of the sessions found in ``path``."""

    report: dict
    path: str

    @property
    def findings(self) -> list[dict]:
        """Every finding of every session, each session's in rank order."""
        return [f for session in self.report["sessions"] for f in session["findings"]]

    def __str__(self) -> str:
        return render_text(self.report)

    def _repr_html_(self) -> str:
        return render_html(self.report)


def _export(profile: Any) -> str:
    """A run folder of its own holding PROFILE's trace, named as tensorboard_trace_handler names it."""
    folder = tempfile.mkdtemp(prefix="tb_gpuadvisor_")
    path = os.path.join(folder, f"{worker_name(0, 1)}.{time.time_ns()}.pt.trace.json")
    try:
        profile.export_chrome_trace(path)
    except (RuntimeError, AssertionError, AttributeError) as err:
        os.rmdir(folder)
        raise ValueError("the profiler holds no finished trace: call advise() after its `with` block "
                         f"or prof.stop() ({type(err).__name__}: {err})") from None
    return folder


def advise(source: Any) -> Advice:
    """The advice on SOURCE: a finished ``torch.profiler.profile``, or a path the CLI reads.

    Raises ValueError for a profile without a finished trace or a path without captures, and
    DiscoveryError for a path that does not exist.
    """
    if hasattr(source, "export_chrome_trace"):
        path = _export(source)
    elif isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
    else:
        raise ValueError(f"advise() takes a torch.profiler.profile or a path, not {type(source).__name__}")
    refs = find_sessions(path)
    if not refs:
        raise ValueError(f"{path}: no profile sessions found")
    return Advice(build_report(refs), path)
