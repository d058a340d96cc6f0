"""The input stage: which files each capture format claims, how it names their hosts, and how
it reads one host's file into the shared host model (``model.build.HostCapture``).

Discovery asks this registry which files are captures; ``model.load_session`` asks it to read
them.  Readers are imported on first use, so finding files never loads a decoder.  A new
format is a new entry here, its reader module and its vocabulary (``tb_gpuadvisor/vocab``).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tb_gpuadvisor.metadata import KINETO_SUFFIXES, XPLANE_SUFFIX

if TYPE_CHECKING:
    from tb_gpuadvisor.model.build import HostCapture
    from tb_gpuadvisor.xspace.reader import Opener


@dataclass(frozen=True)
class Adapter:
    """One capture format."""

    name: str
    suffixes: tuple[str, ...]
    reader: str                 # "module:function" reading (path, host, opener, budget)
    xprof: bool                 # XProf's tools (trace viewer, input pipeline analyzer) open these files

    def claims(self, file_name: str) -> bool:
        return any(file_name.endswith(s) and len(file_name) > len(s) for s in self.suffixes)

    def stem(self, file_name: str) -> str:
        suffix = next(s for s in self.suffixes if file_name.endswith(s))
        return file_name[: -len(suffix)]

    def read(self, path: str, host: str, opener: "Opener | None", budget: int | None) -> "HostCapture":
        module, function = self.reader.split(":")
        return getattr(importlib.import_module(module), function)(path, host, opener, budget)


XPLANE = Adapter("xplane", (XPLANE_SUFFIX,), "tb_gpuadvisor.adapters.xplane:read", xprof=True)
KINETO = Adapter("kineto", KINETO_SUFFIXES, "tb_gpuadvisor.adapters.kineto:read", xprof=False)
ADAPTERS = (XPLANE, KINETO)


def adapter_for(file_name: str) -> Adapter | None:
    """The format that claims FILE_NAME, None when no format does."""
    return next((a for a in ADAPTERS if a.claims(file_name)), None)


# torch.profiler.tensorboard_trace_handler names files "<worker>.<epoch time>.pt.trace.json[.gz]":
# the time in ms (PyTorch 1.x, 13 digits) or in ns (PyTorch 2.x, 19 digits).
_WORKER_STAMP = re.compile(r"^(?P<worker>.+)\.(?P<stamp>\d{12,14}|\d{18,20})$")


def kineto_worker(file_name: str) -> tuple[str, int | None]:
    """(host name, epoch ms the profiling cycle was written, or None) of a Kineto trace file."""
    stem = KINETO.stem(file_name)
    match = _WORKER_STAMP.match(stem)
    if not match:
        return stem, None
    stamp = match.group("stamp")
    return match.group("worker"), int(stamp) // (1_000_000 if len(stamp) >= 18 else 1)


def opens_in_xprof(path: str) -> bool:
    """Whether evidence from the capture file at PATH can deep-link into an XProf tool."""
    adapter = adapter_for(path.replace("\\", "/").rsplit("/", 1)[-1])
    return adapter is None or adapter.xprof


def host_of(file_name: str) -> str:
    """The host (rank, worker) a capture file holds, for messages about a file that was not read."""
    adapter = adapter_for(file_name)
    if adapter is KINETO:
        return kineto_worker(file_name)[0]
    return adapter.stem(file_name) if adapter else file_name
