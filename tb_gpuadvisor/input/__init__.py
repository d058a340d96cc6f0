"""The input stage: which files each capture format claims, how its files group into sessions
and name their hosts, and how one host's file is read into the format-neutral
``input.capture.HostCapture``.

``discovery`` asks this registry which files are captures and how they group; ``input.session``
asks it to read them.  Readers and groupers are named "module:function" and imported on first
use, so finding files never loads a decoder.  A new format is one ``register`` call, its
package (``input/<format>/``: reader and grouping) and its vocabulary (``tb_gpuadvisor/vocab``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from tb_gpuadvisor.metadata import KINETO_SUFFIXES, XPLANE_SUFFIX
from tb_gpuadvisor.vocab import pytorch

if TYPE_CHECKING:
    from tb_gpuadvisor.input.capture import HostCapture
    from tb_gpuadvisor.input.files import Opener

# One folder's sessions of one format: [(session name, [(host, file name)])].
Sessions = list[tuple[str, list[tuple[str, str]]]]


def _function(spec: str) -> Callable:
    module, function = spec.split(":")
    return getattr(importlib.import_module(module), function)


@dataclass(frozen=True)
class Adapter:
    """One capture format."""

    name: str
    suffixes: tuple[str, ...]
    reader: str                 # "module:function" reading (path, host, opener, budget) into a HostCapture
    xprof: bool                 # XProf's tools (trace viewer, input pipeline analyzer) open these files
    # Where the files lie: True for TensorBoard's profile folders (<run>/plugins/profile/<session>/
    # <host><suffix>); False for files anywhere in a run's folder, grouped into sessions by GROUPER.
    profile_dir: bool = False
    grouper: str = "tb_gpuadvisor.input:one_session"    # "module:function": (file names) -> Sessions
    # The framework that writes this format, when only one does: a session none of whose files could
    # be read is still that framework's (its report speaks its words), not "unknown".
    framework: str | None = None

    def claims(self, file_name: str) -> bool:
        return any(file_name.endswith(s) and len(file_name) > len(s) for s in self.suffixes)

    def stem(self, file_name: str) -> str:
        suffix = next(s for s in self.suffixes if file_name.endswith(s))
        return file_name[: -len(suffix)]

    def sessions(self, names: list[str]) -> Sessions:
        """The sessions the files NAMES (of one folder, each claimed by this format) make."""
        return _function(self.grouper)(names)

    def read(self, path: str, host: str, opener: "Opener | None", budget: int | None) -> "HostCapture":
        return _function(self.reader)(path, host, opener, budget)


XPLANE = Adapter("xplane", (XPLANE_SUFFIX,), "tb_gpuadvisor.input.xplane.build:read_host", xprof=True,
                 profile_dir=True)
KINETO = Adapter("kineto", KINETO_SUFFIXES, "tb_gpuadvisor.input.kineto.build:read", xprof=False,
                 grouper="tb_gpuadvisor.input.kineto:cycles", framework=pytorch.FRAMEWORK)
_ADAPTERS: list[Adapter] = [XPLANE, KINETO]


def register(adapter: Adapter) -> None:
    """Make ADAPTER's files captures in this process: discovery lists them and the session reader
    reads them (the worker processes of a many-host analysis start afresh: register there too)."""
    if any(a.name == adapter.name for a in _ADAPTERS):
        raise ValueError(f"a capture format named {adapter.name!r} is already registered")
    _ADAPTERS.append(adapter)


def unregister(name: str) -> None:
    """Forget the format NAME (one ``register`` made)."""
    _ADAPTERS[:] = [a for a in _ADAPTERS if a.name != name]


def adapters() -> tuple[Adapter, ...]:
    return tuple(_ADAPTERS)


def adapter_for(file_name: str) -> Adapter | None:
    """The format that claims FILE_NAME, None when no format does."""
    return next((a for a in _ADAPTERS if a.claims(file_name)), None)


def one_session(names: list[str]) -> Sessions:
    """The grouping of a format that says nothing of its own: one session of a folder's files,
    each file one host named by its stem."""
    hosts = [(adapter_for(n).stem(n), n) for n in sorted(names)]
    return [("trace", hosts)] if hosts else []


def opens_in_xprof(path: str) -> bool:
    """Whether evidence from the capture file at PATH can deep-link into an XProf tool."""
    adapter = adapter_for(path.replace("\\", "/").rsplit("/", 1)[-1])
    return adapter is None or adapter.xprof


def host_of(file_name: str) -> str:
    """The host (rank, worker) a capture file holds, for messages about a file that was not read."""
    adapter = adapter_for(file_name)
    if adapter is None:
        return file_name
    if adapter.profile_dir:
        return adapter.stem(file_name)
    return adapter.sessions([file_name])[0][1][0][0]
