"""Decoding a Kineto (PyTorch profiler) Chrome-trace JSON file into plain columns.

msgspec decodes straight into typed structs that keep only the fields the model reads (the
other args, shapes and stacks are skipped while parsing, never held); without msgspec the
trace is parsed into dicts by orjson or, last, the standard library.  All paths give the same
``Columns``, and read or refuse the same texts (benchmarks/fuzz.py).  The choice was measured
(benchmarks/README.md, "Kineto JSON decoders").  A trace is an object holding ``traceEvents``
or, as the Chrome trace format allows and older profilers wrote, a bare array of events.
``.gz`` files are inflated chunk by chunk into one buffer, never past the memory the caller
allows nor past MAX_INFLATION times their size.
"""

from __future__ import annotations

import codecs
import json
import math
import pickle
import re
import subprocess
import sys
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Iterator, Union

import numpy as np

from tb_gpuadvisor import cores
from tb_gpuadvisor.input.files import GZIP_MAGIC, CaptureError, LocalFile

try:
    import msgspec
except ImportError:             # pragma: no cover - msgspec is an install requirement
    msgspec = None
try:
    import orjson
except ImportError:             # pragma: no cover
    orjson = None
try:    # ISA-L's inflate: 1.7x zlib's on a 1 GB trace (benchmarks/README.md); zlib where it has no wheel
    from isal import isal_zlib as _gzip
except ImportError:             # pragma: no cover
    _gzip = zlib

_INFLATE_CHUNK = 16 << 20
_RUN = 32 << 20         # bytes of JSON events decoded at once by msgspec
_SEEK = 4 << 20         # how far past a run's end to look for the next event
_HEAD = 1 << 20         # where the traceEvents key must be for a trace to be cut into runs
_SNIFF = 4096           # where a bare array's "[" must be


class Truncated(CaptureError):
    """The text ends before the trace does (a gzip stream or JSON document cut short): a file
    the profiler may still be writing."""


# Kineto's JSON inflates 14-26x from gzip (the corpus); a stream that inflates more than this
# many times its size, once past INFLATION_FLOOR bytes, is a decompression bomb (deflate itself
# allows about 1030x), refused whatever memory the budget would allow.
MAX_INFLATION = 128
INFLATION_FLOOR = 256 << 20


def inflate(data: "bytearray | np.ndarray", limit: int | None = None,
            name: str = "this gzip file") -> "bytearray | np.ndarray":
    """DATA itself, or its gzip content inflated in bounded chunks (a truncated stream is a
    Truncated error).  DATA is any buffer of bytes (the reader hands over a numpy array of the
    file).  The text is never let past LIMIT bytes, nor past MAX_INFLATION times DATA: the
    inflation stops there, before the bytes are in memory, with a one-line refusal naming NAME."""
    if bytes(memoryview(data)[:2]) != GZIP_MAGIC:
        return data
    view = memoryview(data).cast("B")
    most = max(INFLATION_FLOOR, MAX_INFLATION * len(view))
    room = most if limit is None else min(limit, most)
    out = bytearray()
    inflater = _gzip.decompressobj(16 + zlib.MAX_WBITS)
    try:
        for start in range(0, len(view), _INFLATE_CHUNK):
            pending = view[start:start + _INFLATE_CHUNK]
            while pending and not inflater.eof:
                # At most one chunk out per call: one 16 MB chunk of a bomb inflates to 16 GB.
                out += inflater.decompress(pending, min(_INFLATE_CHUNK, room + 1 - len(out)))
                if len(out) > room:
                    raise CaptureError(_too_large(name, len(view), room, most, limit))
                pending = inflater.unconsumed_tail
            if inflater.eof:
                break
    except (zlib.error, _gzip.error) as err:
        raise CaptureError(f"the gzip stream is corrupt ({err})") from None
    finally:
        view.release()
    if not inflater.eof:
        raise Truncated("the gzip file is truncated (its stream ends early)")
    return out


def _too_large(name: str, size: int, room: int, most: int, limit: int | None) -> str:
    """Why NAME, a gzip stream of SIZE bytes, was refused once its text passed ROOM bytes."""
    if limit is None or most <= limit:
        return (f"refused: {name} ({size / 2**20:.1f} MiB) inflates to more than {room / 2**20:.0f} MiB, "
                f"{MAX_INFLATION}x its size where profiler traces inflate about 20x: a decompression "
                "bomb or not a trace; it was not inflated further")
    return (f"refused: {name} ({size / 2**20:.1f} MiB) inflates to more than {room / 2**20:.0f} MiB of "
            "JSON, the most the memory available for it allows (free memory or "
            "TB_GPUADVISOR_MEMORY_LIMIT_MB); it was not inflated further: profile fewer steps "
            "(torch.profiler.schedule(active=...)) or analyse it on a machine with more memory")


@dataclass
class DeviceProperties:
    """One GPU of ``deviceProperties``."""

    id: int
    name: str | None = None
    total_memory: int | None = None
    major: int | None = None
    minor: int | None = None
    sms: int | None = None


@dataclass(frozen=True)
class CommArgs:
    """What a collective's event records of it (``record_param_comms`` ops and, in newer
    versions, the NCCL kernels themselves); None where the trace does not say."""

    collective: str | None = None       # "allreduce", "_allgather_base", ...
    in_nelems: int | None = None
    out_nelems: int | None = None
    dtype: str | None = None            # "Float", "BFloat16", ...
    group_size: int | None = None
    group_name: str | None = None       # the process group's name ("0", "3")
    group_ranks: str | None = None      # "[0, 1, 2, 3]"


_NO_FLOATS = np.empty(0, np.float64)
_NO_INTS = np.empty(0, np.int64)


@dataclass(eq=False)
class Columns:
    """The X (complete) events of a trace: strings as lists, numbers as arrays (-1 where an
    event has no such arg), plus what the header says."""

    name: list[str] = field(default_factory=list)
    cat: list[str] = field(default_factory=list)
    tid: list[Any] = field(default_factory=list)
    ts: np.ndarray = field(default_factory=lambda: _NO_FLOATS)
    dur: np.ndarray = field(default_factory=lambda: _NO_FLOATS)
    correlation: np.ndarray = field(default_factory=lambda: _NO_INTS)
    device: np.ndarray = field(default_factory=lambda: _NO_INTS)
    stream: np.ndarray = field(default_factory=lambda: _NO_INTS)
    nbytes: np.ndarray = field(default_factory=lambda: _NO_INTS)
    comms: dict[int, CommArgs] = field(default_factory=dict)            # X event row -> its collective's args
    # The allocator's ``[memory]`` instant events (profile_memory=True), in file order.
    mem_ts: np.ndarray = field(default_factory=lambda: _NO_FLOATS)
    mem_allocated: np.ndarray = field(default_factory=lambda: _NO_INTS)   # Total Allocated after the event
    mem_reserved: np.ndarray = field(default_factory=lambda: _NO_INTS)    # Total Reserved
    mem_bytes: np.ndarray = field(default_factory=lambda: _NO_INTS)       # Bytes: > 0 allocated, < 0 freed
    mem_device_type: np.ndarray = field(default_factory=lambda: _NO_INTS)  # c10 DeviceType (0 CPU, 1 CUDA)
    mem_device: np.ndarray = field(default_factory=lambda: _NO_INTS)      # Device Id (-1: the host)
    threads: dict[tuple[Any, Any], str] = field(default_factory=dict)    # (pid, tid) -> thread_name
    devices: list[DeviceProperties] = field(default_factory=list)
    base_ns: int = 0            # baseTimeNanoseconds: ts counts microseconds from it
    events: int = 0             # every event of the file, of any phase

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Columns):
            return NotImplemented
        return all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
                   for a, b in zip(vars(self).values(), vars(other).values()))


def _floats(values: list) -> np.ndarray:
    try:
        return np.array(values, np.float64)
    except (TypeError, ValueError, OverflowError):
        raise CaptureError("an event time or duration is not a number; the trace is corrupt") from None


def _ints(values: list) -> np.ndarray:
    """An int64 column from numbers (-1: absent, or not a number: some runtime calls write their
    byte count as text, and text is never parsed, whichever decoder read it); values beyond
    int64 are a corrupt trace.  So is int64's least value: a number below it is read by orjson
    as the double that rounds to it."""
    column = np.array(values)       # int64 for whole numbers, float64 with fractions, else text or objects
    kind = column.dtype.kind
    if kind in "ib" or (kind == "f" and np.isfinite(column).all() and np.abs(column).max(initial=0) < 2.0**63):
        column = column.astype(np.int64)
    else:
        kept = [v if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else -1 for v in values]
        try:
            column = np.array(kept, np.int64)
        except OverflowError:
            column = None
    if column is None or (column.size and column.min() == _INT64_MIN):
        raise CaptureError("an event's correlation, device, stream or size is out of range; "
                           "the trace is corrupt")
    return column


_INT64_MIN = np.iinfo(np.int64).min


def _count(value) -> int | None:
    """A whole non-negative count, or None (absent, text, or out of range)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1 << 62:
        return None
    return int(value)


def _text(value) -> str | None:
    return None if value is None or isinstance(value, (dict, list)) else str(_plain(value))


def _comm(collective, in_nelems, out_nelems, dtype, group_size, group_name, group_ranks) -> CommArgs:
    """One event's collective args, each coerced the same way whichever decoder read them."""
    return CommArgs(_text(collective), _count(in_nelems), _count(out_nelems), _text(dtype), _count(group_size),
                    _text(group_name), _text(group_ranks) if not isinstance(group_ranks, list) else
                    str(group_ranks))


def _comm_rows(in_nelems: list) -> np.ndarray:
    """The events that carry a collective's args, from their "In msg nelems" (-1 where absent),
    whichever decoder read them: PyTorch writes the message size with the collective's name,
    dtype and group (record_param_comms; the NCCL kernels in newer versions), so the one numeric
    column finds them at C speed."""
    return np.flatnonzero(_ints(in_nelems) != -1)


_MEMORY_EVENT = "[memory]"
_COMM_ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size",
              "Process Group Name", "Process Group Ranks")
_MEMORY_ARGS = ("Total Allocated", "Total Reserved", "Bytes", "Device Type", "Device Id")
_MEMORY_FIELDS = ("allocated", "reserved", "mem_bytes", "device_type", "device_id")     # their _Args names


if msgspec is not None:
    # An id beyond 64 bits is read by the generic path (see _plain), as orjson reads it.
    _Id = Union[Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)], str, None]
    _Num = Union[int, float, None]
    _Arg = Union[int, float, str]   # an explicit null is another shape: the generic path reads it

    class _Args(msgspec.Struct, gc=False):
        correlation: _Arg = -1
        device: _Arg = -1
        stream: _Arg = -1
        bytes: _Arg = -1
        name: Union[str, None] = None          # thread_name / process_name metadata
        # A collective's args (record_param_comms, NCCL kernels): only events that have them pay.
        collective: Union[str, None] = msgspec.field(default=None, name="Collective name")
        in_nelems: _Arg = msgspec.field(default=-1, name="In msg nelems")
        out_nelems: _Arg = msgspec.field(default=-1, name="Out msg nelems")
        dtype: Union[str, None] = None
        group_size: _Arg = msgspec.field(default=-1, name="Group size")
        group_name: Union[_Arg, None] = msgspec.field(default=None, name="Process Group Name")
        group_ranks: Union[str, list[int], None] = msgspec.field(default=None, name="Process Group Ranks")
        # The allocator's [memory] events.
        allocated: _Arg = msgspec.field(default=-1, name="Total Allocated")
        reserved: _Arg = msgspec.field(default=-1, name="Total Reserved")
        mem_bytes: _Arg = msgspec.field(default=0, name="Bytes")
        device_type: _Arg = msgspec.field(default=-1, name="Device Type")
        device_id: _Arg = msgspec.field(default=-1, name="Device Id")

    class _Event(msgspec.Struct, gc=False):
        ph: str = ""
        name: str = ""
        cat: Union[str, None] = None
        pid: _Id = None
        tid: _Id = None
        ts: _Num = None
        dur: _Num = None
        args: Union[_Args, None] = None

    class _Props(msgspec.Struct, gc=False):
        id: _Num = None
        name: Union[str, None] = None
        totalGlobalMem: _Num = None
        computeMajor: _Num = None
        computeMinor: _Num = None
        numSms: _Num = None

    class _Trace(msgspec.Struct, gc=False):
        traceEvents: list[_Event] = []
        deviceProperties: Union[list[_Props], None] = None
        baseTimeNanoseconds: Union[int, str, None] = None

    _DECODER = msgspec.json.Decoder(_Trace)
    _EVENTS = msgspec.json.Decoder(list[_Event])


def _int(value) -> int | None:
    return None if value is None or isinstance(value, bool) else int(value)


def _base_ns(value) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _bare(text: "LocalFile | _Buffer") -> bool:
    """Whether TEXT is a bare JSON array of events (the Chrome trace format allows it; PyTorch's
    profiler wrote it until 2021) rather than an object holding ``traceEvents``."""
    return bytes(text.read(0, min(_SNIFF, len(text)))).lstrip()[:1] == b"["


def _msgspec(text: "LocalFile | _Buffer") -> Columns:
    """Columns through msgspec: a large trace a run of events at a time, else (or when a cut
    was not between two events) in one go."""
    bare = _bare(text)
    if len(text) >= 2 * _RUN:
        try:
            cols = _helped(text, bare)
            return cols if cols is not None else _typed(_documents(text, bare))
        except msgspec.MsgspecError:
            pass
    whole = text.read(0, len(text))
    try:
        return _typed(iter([("events" if bare else "trace", whole)]))
    except msgspec.ValidationError:
        # Valid JSON of another shape (a field of an unexpected type): the generic
        # path says precisely what is wrong, or reads it.
        return _from_dicts(msgspec.json.decode(whole))


# Pieces (of about _RUN bytes) each process decodes at least: below that, starting a helper
# (an interpreter with numpy and msgspec: about 0.15 s) costs more than it saves.
HELPER_PIECES = 4
# Pieces the first process decodes beyond its share: a helper starts (about 0.4 s on a busy
# 2-core machine) and packs its part while this process decodes about two pieces.
_HELPER_LAG = 2
# A helper imports this very package: its folder goes first on the helper's path unless the path
# already holds it (an installed package's site-packages must not be put before the standard library).
_HELPER = (f"import sys; root = {str(Path(__file__).resolve().parents[3])!r}\n"
           "if root not in sys.path: sys.path.insert(0, root)\n"
           "from tb_gpuadvisor.input.kineto.decode import _help; _help()")


def _helped(text: "LocalFile | _Buffer", bare: bool) -> Columns | None:
    """Columns of a large trace decoded on every core of this process's share (msgspec holds
    the GIL while it decodes, so threads would not overlap): this process decodes the first
    pieces while helper processes decode the later ones, from the same open file (a local plain
    trace) or from a pipe this process streams them into (inflated text), and send their parts
    back.  Helpers are fresh interpreters, never forks (a TensorBoard server's threads and locks
    must not be copied).  None when the trace is too small for helpers, or a helper failed: the
    caller then decodes it here alone (which reads it, or says why not)."""
    cuts = _cuts(text, bare)
    pieces = len(cuts) + 1
    ways = min(cores.threads(pieces // HELPER_PIECES), pieces // HELPER_PIECES)
    if ways < 2 or not sys.executable:
        return None
    bounds = [0] + [_HELPER_LAG + (pieces - _HELPER_LAG) * k // ways for k in range(1, ways + 1)]
    fd, stamp = text.descriptor if isinstance(text, LocalFile) else (None, None)
    helpers = []
    try:
        for first, stop in zip(bounds[1:], bounds[2:]):
            proc = subprocess.Popen([sys.executable, "-c", _HELPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, pass_fds=() if fd is None else (fd,))
            got: list[tuple] = []
            reader = threading.Thread(target=_receive, args=(proc, got), daemon=True)
            reader.start()
            helpers.append((proc, reader, got))
            # The helper's cuts, counted from its first piece (see _pieces), then its text.
            sub = cuts[first - 1:stop]
            job = pickle.dumps((fd, stamp, bare, sub, stop == pieces, len(text)))
            proc.stdin.write(len(job).to_bytes(8, "little") + job)
            if fd is None:
                end = len(text) if stop == pieces else sub[-1][0]
                threading.Thread(target=_send, args=(proc.stdin, text.read(sub[0][1], end)), daemon=True).start()
            else:
                proc.stdin.close()
        same: dict = {}
        parts = [_part(_pieces(text, bare, cuts, 0, bounds[1]), same)]
        for proc, reader, got in helpers:
            reader.join()
            if proc.wait() != 0 or not got:
                return None
            parts.append(_unpacked(*got.pop(), same))
    except OSError:         # no helper could be started (no process slots, no interpreter)
        return None
    finally:
        for proc, _, _ in helpers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
    return _join(parts)


def _send(pipe, text: memoryview) -> None:
    """TEXT into a helper's PIPE, then closed (a helper that died has stopped reading: it sends
    nothing back, and that is what the caller looks at)."""
    try:
        pipe.write(text)
        pipe.close()
    except OSError:
        pass


def _help() -> None:
    """A helper process (see _helped): decode the pieces its job on stdin names, from the
    descriptor it inherited or from the text that follows the job, and write the part, its
    strings coded, to stdout."""
    stdin = sys.stdin.buffer
    fd, stamp, bare, cuts, tail, size = pickle.loads(stdin.read(int.from_bytes(stdin.read(8), "little")))
    text = LocalFile.inherited(fd, stamp) if fd is not None else _Stream(stdin, cuts[0][1], size)
    part = _part(_pieces(text, bare, cuts, 1, len(cuts) + (1 if tail else 0)), {})
    coded = [_coded(values) for values in (part.name, part.cat, part.tid)]
    part.name, part.cat, part.tid = [], [], []
    pickle.dump((part, coded), sys.stdout.buffer, protocol=pickle.HIGHEST_PROTOCOL)
    sys.stdout.flush()


def _receive(proc: subprocess.Popen, got: list) -> None:
    """What helper PROC sends, unpickled as it comes, into GOT (left empty when the helper
    sent nothing whole: it failed, and the caller decodes alone)."""
    try:
        got.append(pickle.load(proc.stdout))
    except Exception:       # noqa: BLE001 - any truncated or garbled stream: the helper failed
        pass


def _coded(values: list) -> tuple[list, np.ndarray]:
    """VALUES as their distinct values and an index into them per value: a few hundred strings
    and an int32 array cross a pipe far faster than millions of pickled references."""
    index: dict = {}
    codes = np.fromiter((index.setdefault(v, len(index)) for v in values), np.int32, len(values))
    return list(index), codes


def _unpacked(part: _Part, coded: list[tuple[list, np.ndarray]], same: dict) -> _Part:
    """A helper's PART with its CODED strings made lists again (one object per distinct value:
    SAME)."""
    lists = []
    for distinct, codes in coded:
        objects = np.empty(len(distinct), object)
        objects[:] = [same.setdefault(v, v) for v in distinct]
        lists.append(objects[codes].tolist())
    part.name, part.cat, part.tid = lists
    return part


def _typed(documents: Iterator[tuple[str, Any]]) -> Columns:
    """Columns of DOCUMENTS decoded one after another: the Python objects of one are dropped
    before the next is decoded, so a large trace never holds them all at once."""
    return _join([_part(documents, {})])


@dataclass(eq=False)
class _Part:
    """What a range of a trace's documents decodes to, before the ranges are joined in file
    order (rows of ``comms`` count from the range's first X event)."""

    name: list = field(default_factory=list)
    cat: list = field(default_factory=list)
    tid: list = field(default_factory=list)
    # Per run: (ts, dur, correlation, device, stream, bytes), and _set_memory's columns; joined
    # once, with the other parts' runs (each concatenation faults in fresh pages).
    numbers: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    memory: list[list[np.ndarray]] = field(default_factory=list)
    comms: dict[int, CommArgs] = field(default_factory=dict)
    threads: dict[tuple[Any, Any], str] = field(default_factory=dict)
    base: Any = None            # the first baseTimeNanoseconds its headers give
    props: Any = None           # the first deviceProperties its headers give
    events: int = 0


def _part(documents: Iterator[tuple[str, Any]], same: dict) -> _Part:
    """DOCUMENTS decoded one after another into a _Part; SAME keeps one object per distinct
    string or id."""
    part = _Part()
    name, cat, tid, numbers, memory = part.name, part.cat, part.tid, part.numbers, part.memory
    allocations = []
    for kind, document in documents:
        _check_utf8(document)
        if kind == "trace":
            trace = _DECODER.decode(document)
            if part.base is None:
                part.base = trace.baseTimeNanoseconds
            if part.props is None:
                part.props = trace.deviceProperties
            events = trace.traceEvents
        else:
            events = _EVENTS.decode(document)
        del document
        part.events += len(events)
        complete = []
        for event in events:
            if event.ph == "X" and event.ts is not None:
                complete.append(event)
            elif event.ph == "M" and event.name == "thread_name" and event.args is not None and event.args.name:
                part.threads[(event.pid, event.tid)] = event.args.name
            elif event.ph == "i" and event.name == _MEMORY_EVENT and event.ts is not None and event.args is not None:
                allocations.append(event)
        del events[:]
        if allocations:     # turned into columns run by run: their objects go with the run's
            held = [e.args for e in allocations]
            memory.append(_memory_part([e.ts for e in allocations],
                                       [[getattr(a, f) for a in held] for f in _MEMORY_FIELDS]))
            del held
        allocations.clear()
        empty = _Args()
        args = [e.args or empty for e in complete]
        for i in _comm_rows([a.in_nelems for a in args]).tolist():
            a = args[i]
            part.comms[len(name) + i] = _comm(a.collective, a.in_nelems, a.out_nelems, a.dtype, a.group_size,
                                              a.group_name, a.group_ranks)
        # One string (or id) object per distinct value: the per-event copies the decoder made
        # are freed with their events, so the next run's events are packed into whole freed
        # memory instead of the gaps between survivors (a third of the time on 1 GB).
        name += [same.setdefault(v, v) for v in [e.name for e in complete]]
        cat += [same.setdefault(v, v) for v in [e.cat or "" for e in complete]]
        tid += [same.setdefault(v, v) for v in [e.tid for e in complete]]
        numbers.append((_floats([e.ts for e in complete]), _floats([e.dur or 0 for e in complete]),
                        _ints([a.correlation for a in args]), _ints([a.device for a in args]),
                        _ints([a.stream for a in args]), _ints([a.bytes for a in args])))
        del complete, args
    return part


def _join(parts: list[_Part]) -> Columns:
    """The Columns of a trace from its parts, in file order."""
    cols = Columns()
    first = parts[0]
    cols.name, cols.cat, cols.tid, cols.comms = first.name, first.cat, first.tid, first.comms
    for part in parts[1:]:
        cols.comms.update((len(cols.name) + row, args) for row, args in part.comms.items())
        cols.name += part.name
        cols.cat += part.cat
        cols.tid += part.tid
    for part in parts:
        cols.threads.update(part.threads)
        cols.events += part.events
    numbers = [run for part in parts for run in part.numbers]
    if numbers:
        cols.ts, cols.dur, cols.correlation, cols.device, cols.stream, cols.nbytes = (
            np.concatenate(column) for column in zip(*numbers))
    memory = [run for part in parts for run in part.memory]
    if memory:
        _set_memory(cols, [np.concatenate(column) for column in zip(*memory)])
    base = next((part.base for part in parts if part.base is not None), None)
    props = next((part.props for part in parts if part.props is not None), None)
    cols.base_ns = _base_ns(base)
    cols.devices = [DeviceProperties(int(p.id or 0), p.name, _int(p.totalGlobalMem), _int(p.computeMajor),
                                     _int(p.computeMinor), _int(p.numSms))
                    for p in props or []]
    return cols


def _check_utf8(document) -> None:
    """msgspec reads the strings it keeps as UTF-8 but steps over the others unchecked, where the
    other decoders refuse a text that is not UTF-8 anywhere: so must it.  Traces are nearly all
    ASCII, which a look at the highest byte settles."""
    view = np.frombuffer(document, np.uint8)
    if view.size and view.max() >= 0x80:
        check = codecs.getincrementaldecoder("utf-8")()     # a chunk's text at a time, never the whole
        for start in range(0, view.size, _INFLATE_CHUNK):
            check.decode(view[start:start + _INFLATE_CHUNK].data)  # UnicodeDecodeError: a ValueError
        check.decode(b"", final=True)


def _memory_part(times: list, fields: list[list]) -> list[np.ndarray]:
    """[memory] events' times and their _MEMORY_ARGS, one list per field, as columns."""
    return [_floats(times), *(_ints(values) for values in fields)]


def _set_memory(cols: Columns, columns: list[np.ndarray]) -> None:
    (cols.mem_ts, cols.mem_allocated, cols.mem_reserved, cols.mem_bytes, cols.mem_device_type,
     cols.mem_device) = columns


# Between two elements of the traceEvents array: the end of one object and the start of the next.
_BETWEEN = re.compile(rb"\}\s*,\s*\{")


class _Stream:
    """The text of a trace from byte AT on, as another process writes it to a pipe, read like a
    LocalFile by _pieces (each range after the one before; the bytes between are skipped)."""

    def __init__(self, pipe, at: int, size: int) -> None:
        self.pipe, self.at, self.size = pipe, at, size

    def __len__(self) -> int:
        return self.size

    def read(self, start: int, stop: int) -> memoryview:
        view = memoryview(bytearray(stop - start))
        self.read_into(start, view)
        return view

    def read_into(self, start: int, view: memoryview) -> None:
        if start < self.at or len(self.pipe.read(start - self.at)) != start - self.at:
            raise CaptureError("a helper's text ended early")
        got = 0
        while got < len(view):
            n = self.pipe.readinto(view[got:])
            if not n:
                raise CaptureError("a helper's text ended early")
            got += n
        self.at = start + len(view)


class _Buffer:
    """Text already in memory, read like a LocalFile (``read``, ``read_into``)."""

    def __init__(self, data) -> None:
        self.view = memoryview(data).cast("B")

    def __len__(self) -> int:
        return len(self.view)

    def read(self, start: int, stop: int) -> memoryview:
        return self.view[start:stop]

    def read_into(self, start: int, view: memoryview) -> None:
        view[:] = self.view[start:start + len(view)]


def _documents(data: "LocalFile | _Buffer", bare: bool = False) -> Iterator[tuple[str, Any]]:
    """DATA as JSON documents to decode one after another: the trace up to a first cut (closed
    after it), runs of about _RUN bytes of whole events, and the rest (reopened before it); the
    whole trace when no cut is found.  Each is copied only when its turn comes.  A BARE array of
    events is cut the same way, each piece an array of events.

    A cut is only a guess at where one event ends and the next begins (``}, {``); each piece is
    then decoded whole.  A guess that falls inside a string or inside a nested object leaves its
    piece unterminated or unbalanced, which fails to decode, and the caller then decodes the
    file in one go: a wrong cut costs time, never a wrong column."""
    cuts = _cuts(data, bare)
    if not cuts:
        yield ("events" if bare else "trace"), data.read(0, len(data))
        return
    yield from _pieces(data, bare, cuts, 0, len(cuts) + 1)


def _cuts(data: "LocalFile | _Buffer", bare: bool) -> list[tuple[int, int]]:
    """Where DATA is cut into pieces (see _documents): (end of an event + 1, start of the next)
    about every _RUN bytes; none when the events' array is not found near the start."""
    size = len(data)
    key = bytes(data.read(0, min(_HEAD, size))).find(b"[" if bare else b'"traceEvents"')
    cuts = []
    at = key + _RUN
    while key >= 0 and at + _RUN < size:
        found = _BETWEEN.search(bytes(data.read(at, min(at + _SEEK, size))))
        if found is None:
            at += _SEEK - 16                        # a long event: look further on
            continue
        cuts.append((at + found.start() + 1, at + found.end() - 1))
        at += found.end() + _RUN
    return cuts


def _pieces(data: "LocalFile | _Buffer", bare: bool, cuts: list[tuple[int, int]], first: int,
            stop: int) -> Iterator[tuple[str, Any]]:
    """Pieces FIRST .. STOP - 1 of DATA cut at CUTS, as documents: piece 0 is the trace up to
    the first cut (closed), piece len(CUTS) the rest (reopened), the others runs of events."""
    whole, head, tail = ("events", b"]", b"[") if bare else ("trace", b"]}", b'{"traceEvents":[')
    if first == 0:
        yield whole, b"".join((data.read(0, cuts[0][0]), head))
    runs = [(start, end) for (_, start), (end, _) in zip(cuts, cuts[1:])][max(first - 1, 0):stop - 1]
    # The runs are copied, bracketed, into one reused buffer: a fresh one per run would fault
    # in 32 MB of new pages each time.
    buffer = bytearray(2 + max((end - start for start, end in runs), default=0))
    into = memoryview(buffer)
    for start, end in runs:
        n = end - start
        into[0], into[n + 1] = ord("["), ord("]")
        data.read_into(start, into[1:n + 1])
        yield "events", into[:n + 2]
    if stop == len(cuts) + 1:
        yield whole, b"".join((tail, data.read(cuts[-1][1], len(data))))


def _plain(value):
    """VALUE, with a whole number beyond 64 bits as the double it rounds to: orjson reads such
    numbers as doubles, msgspec and the standard library as exact integers, and every decoder
    must give the same columns."""
    if isinstance(value, int) and not -(1 << 63) <= value < 1 << 64:
        return float(value)
    return value


def _from_dicts(trace) -> Columns:
    """Columns from a trace parsed into dicts (orjson or the standard library): an object holding
    ``traceEvents``, or a bare array of events."""
    if isinstance(trace, list):
        trace = {"traceEvents": trace}
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents", []), list):
        raise CaptureError("this JSON is not a Chrome trace (no traceEvents list)")
    events = trace.get("traceEvents", [])
    cols = Columns(base_ns=_base_ns(trace.get("baseTimeNanoseconds")), events=len(events))
    complete, memory = [], []
    for event in events:
        if not isinstance(event, dict):
            raise CaptureError("a traceEvents entry is not an object; this is not a Chrome trace")
        ph = event.get("ph")
        if ph == "X" and isinstance(event.get("ts"), (int, float)):
            complete.append(event)
        elif (ph == "i" and event.get("name") == _MEMORY_EVENT and isinstance(event.get("ts"), (int, float))
              and isinstance(event.get("args"), dict)):
            memory.append(event)
        elif ph == "M" and event.get("name") == "thread_name" and isinstance(event.get("args"), dict):
            if event["args"].get("name"):
                cols.threads[(_plain(event.get("pid")), _plain(event.get("tid")))] = str(_plain(event["args"]["name"]))
    args = [e.get("args") if isinstance(e.get("args"), dict) else {} for e in complete]
    cols.name = [str(_plain(e.get("name", ""))) for e in complete]
    cols.cat = [str(_plain(e.get("cat") or "")) for e in complete]
    ident = lambda v: v if v is None or isinstance(v, (int, str)) else str(v)  # noqa: E731 - hashable ids
    cols.tid = [ident(_plain(e.get("tid"))) for e in complete]
    number = lambda a, key: _plain(a.get(key)) if isinstance(a.get(key), (int, float)) else None  # noqa: E731
    cols.ts = _floats([e["ts"] for e in complete])
    cols.dur = _floats([number(e, "dur") or 0 for e in complete])
    for column in ("correlation", "device", "stream", "bytes"):
        values = _ints([-1 if number(a, column) is None else number(a, column) for a in args])
        setattr(cols, "nbytes" if column == "bytes" else column, values)
    comm_rows = _comm_rows([a.get("In msg nelems", -1) for a in args])
    cols.comms = {i: _comm(*(args[i].get(key) for key in _COMM_ARGS)) for i in comm_rows.tolist()}
    if memory:
        defaults = (-1, -1, 0, -1, -1)
        _set_memory(cols, _memory_part([e["ts"] for e in memory],
                                       [[e["args"].get(key, default) for e in memory]
                                        for key, default in zip(_MEMORY_ARGS, defaults)]))
    props = trace.get("deviceProperties")
    for p in props if isinstance(props, list) else []:
        if isinstance(p, dict):
            cols.devices.append(DeviceProperties(
                int(number(p, "id") or 0), p.get("name") if isinstance(p.get("name"), str) else None,
                _int(number(p, "totalGlobalMem")), _int(number(p, "computeMajor")),
                _int(number(p, "computeMinor")), _int(number(p, "numSms"))))
    return cols


def decode(data: "bytearray | np.ndarray | LocalFile", backend: str | None = None) -> Columns:
    """The columns of a Kineto trace: its bytes (raw or gzip), or a LocalFile of plain JSON read
    a run at a time (never held whole).  BACKEND forces "msgspec", "orjson" or "json"
    (benchmarks compare them); by default the fastest one installed.

    Raises CaptureError, with one line saying what is wrong, for anything that is not a trace.
    """
    text = data if isinstance(data, LocalFile) else _Buffer(inflate(data))
    backend = backend or ("msgspec" if msgspec is not None else "orjson" if orjson is not None else "json")
    try:
        if backend == "msgspec":
            try:
                return _msgspec(text)
            except RecursionError:
                if orjson is None:
                    raise
                # Nesting deeper than Python's recursion limit allows msgspec: orjson's own limit
                # (1024 levels) decides, so that both read or both refuse the same texts.
                backend = "orjson"
        whole = text.read(0, len(text))
        if backend == "orjson":
            return _from_dicts(orjson.loads(whole))
        return _from_dicts(_json(whole))
    except CaptureError:
        raise
    except (ValueError, TypeError, RecursionError) as err:      # every decoder's parse errors
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        if _ends_early(err, text):
            raise Truncated(f"the trace JSON ends early ({first[:200]}): the file is truncated, or the "
                            "profiler is still writing it") from None
        raise CaptureError(f"this is not valid trace JSON ({first[:200]}); the file is corrupt") from None


def _json(whole) -> Any:
    """WHOLE parsed by the standard library as the other decoders parse it: strictly UTF-8 (it
    would let encoded surrogates through), no NaN or Infinity, no number beyond a double, and no
    string holding half of a surrogate pair (which msgspec and orjson refuse)."""
    text = bytes(whole).decode("utf-8")
    trace = json.loads(text, parse_constant=_not_json, parse_float=_finite)
    if _SURROGATE_ESCAPE.search(text):
        json.dumps(trace, ensure_ascii=False).encode("utf-8")      # raises on a lone surrogate
    return trace


# A JSON escape of a surrogate (a lone one is refused by msgspec and orjson).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _not_json(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number out of range ({text[:40]})")
    return value


def _ends_early(err: Exception, text: "LocalFile | _Buffer") -> bool:
    """Whether a decoder's parse error ERR says that TEXT ended before its JSON did."""
    message = str(err)
    if "truncated" in message or "end of data" in message or message.startswith("Unterminated string"):
        return True
    at = getattr(err, "pos", None)      # json's and orjson's JSONDecodeError: where it stopped
    if at is None:
        return False
    end = len(text)
    last = bytes(text.read(max(end - _SNIFF, 0), end))
    return at >= end - (len(last) - len(last.rstrip()))     # at the end, or in the blanks after it
