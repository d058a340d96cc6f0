"""The input stage: which files each capture format claims, how its files group into sessions
and name their hosts, and how one host's file is read into the format-neutral
``input.capture.HostCapture``.

``discovery`` asks this registry which files are captures and how they group; ``input.session``
asks it to read them.  A format claims files by their name's ending (``.pt.trace.json``) and may
also claim files of a looser ending (``.json``) whose first bytes it recognises (its sniffer).
Readers, groupers and sniffers are named "module:function" and imported on first use, so finding
files never loads a decoder.  A new format is one ``register`` call, its
package (``input/<format>/``: reader and grouping) and its vocabulary (``tb_gpuadvisor/vocab``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from tb_gpuadvisor.metadata import CHROME_TRACE_SUFFIXES, KINETO_SUFFIXES, XPLANE_SUFFIX
from tb_gpuadvisor.vocab import pytorch

if TYPE_CHECKING:
    from tb_gpuadvisor.input.capture import HostCapture
    from tb_gpuadvisor.input.files import Opener

# One folder's sessions of one format: [(session name, [(host, file name)])].
Sessions = list[tuple[str, list[tuple[str, str]]]]


@dataclass(frozen=True)
class Sniffed:
    """What a file's first bytes say of it: whether the format holds it (None: too little is
    written yet to tell, and it changed so recently that the profiler may still be writing it),
    and the rank and world size it names (grouping files of one distributed run)."""

    holds: bool | None
    rank: int | None = None
    world: int | None = None


def _ends(file_name: str, suffixes: tuple[str, ...]) -> bool:
    return any(file_name.endswith(s) and len(file_name) > len(s) for s in suffixes)


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
    # "module:function": (file names, {sniffed file name: Sniffed}) -> Sessions
    grouper: str = "tb_gpuadvisor.input:one_session"
    # Endings of files that hold this format only when SNIFFER, "module:function" reading
    # (path, opener) into a Sniffed from the file's first bytes, says they do (any .json).
    sniffed: tuple[str, ...] = ()
    sniffer: str | None = None
    # The framework that writes this format, when only one does: a session none of whose files could
    # be read is still that framework's (its report speaks its words), not "unknown".
    framework: str | None = None

    def claims(self, file_name: str) -> bool:
        return _ends(file_name, self.suffixes)

    def may_hold(self, file_name: str) -> bool:
        """Whether FILE_NAME, claimed by no format's own ending, is one this format sniffs."""
        return self.sniffer is not None and _ends(file_name, self.sniffed)

    def stem(self, file_name: str) -> str:
        suffix = max((s for s in self.suffixes + self.sniffed if file_name.endswith(s)), key=len)
        return file_name[: -len(suffix)]

    def sniff(self, path: str, opener: "Opener | None") -> Sniffed:
        return _function(self.sniffer)(path, opener)

    def sessions(self, names: list[str], sniffed: dict[str, Sniffed] | None = None) -> Sessions:
        """The sessions the files NAMES (of one folder, each claimed or sniffed by this format)
        make; SNIFFED holds what the sniffer found in the files it was asked about."""
        return _function(self.grouper)(names, sniffed or {})

    def read(self, path: str, host: str, opener: "Opener | None", budget: int | None) -> "HostCapture":
        return _function(self.reader)(path, host, opener, budget)


XPLANE = Adapter("xplane", (XPLANE_SUFFIX,), "tb_gpuadvisor.input.xplane.build:read_host", xprof=True,
                 profile_dir=True)
KINETO = Adapter("kineto", KINETO_SUFFIXES, "tb_gpuadvisor.input.kineto.build:read", xprof=False,
                 grouper="tb_gpuadvisor.input.kineto:sessions", sniffed=CHROME_TRACE_SUFFIXES,
                 sniffer="tb_gpuadvisor.input.kineto.sniff:sniff", framework=pytorch.FRAMEWORK)
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
    """The format that claims FILE_NAME by its ending, None when no format does."""
    return next((a for a in _ADAPTERS if a.claims(file_name)), None)


def sniffer_for(file_name: str) -> Adapter | None:
    """The format that sniffs FILE_NAME (claimed by no format's ending), None when none does."""
    if adapter_for(file_name) is not None:
        return None
    return next((a for a in _ADAPTERS if a.may_hold(file_name)), None)


def format_of(file_name: str) -> Adapter | None:
    """The format a capture file FILE_NAME (listed by discovery) is read as: the one claiming its
    ending, else the first that sniffs it."""
    return adapter_for(file_name) or sniffer_for(file_name)


def one_session(names: list[str], sniffed: dict[str, Sniffed]) -> Sessions:
    """The grouping of a format that says nothing of its own: one session of a folder's files,
    each file one host named by its stem."""
    hosts = [(format_of(n).stem(n), n) for n in sorted(names)]
    return [("trace", hosts)] if hosts else []


def opens_in_xprof(path: str) -> bool:
    """Whether evidence from the capture file at PATH can deep-link into an XProf tool."""
    adapter = format_of(path.replace("\\", "/").rsplit("/", 1)[-1])
    return adapter is None or adapter.xprof


def host_of(file_name: str) -> str:
    """The host (rank, worker) a capture file holds, for messages about a file that was not read."""
    adapter = format_of(file_name)
    if adapter is None:
        return file_name
    if adapter.profile_dir:
        return adapter.stem(file_name)
    return adapter.sessions([file_name])[0][1][0][0]
