"""Opening ``.xplane.pb`` files and finding their planes without decoding them.

The top level of an XSpace is just a list of length-delimited fields, so the
planes can be located here and decoded separately (``decode.py``): a huge
capture never needs the whole message tree in memory.  A file that is truncated
or not a protobuf becomes a :class:`CaptureError` with a message meant for the
user (the file's own failures are ``input.files``').

``fields`` walks one message level with the protobuf runtime's rules (tags of at
most 5 bytes, field number 1..2^29-1, groups skipped, 100 levels of nesting), so
that what it accepts is what ``XPlane.FromString`` accepts; the C decoder follows
the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from tb_gpuadvisor.input.files import CaptureError, LocalFile, Opener, read_bytes

_PLANES, _ERRORS, _WARNINGS, _HOSTNAMES = 1, 2, 3, 4
_WIRE_VARINT, _WIRE_I64, _WIRE_LEN, _WIRE_GROUP, _WIRE_END, _WIRE_I32 = 0, 1, 2, 3, 4, 5
# Nesting the protobuf runtime allows below the message being parsed (messages and groups).
MAX_DEPTH = 100
_U64 = (1 << 64) - 1


@dataclass
class SpaceIndex:
    """Where each plane lies in the file, and the space's own messages."""

    plane_spans: list[tuple[int, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    hostnames: list[str] = field(default_factory=list)


def _varint(buf, pos: int, end: int, max_bytes: int = 10) -> tuple[int, int]:
    result = shift = 0
    limit = min(end, pos + max_bytes)
    while True:
        if pos >= limit:
            if pos >= end:
                raise CaptureError("the file ends in the middle of a field (truncated capture?)")
            raise CaptureError("not an XSpace protobuf (malformed varint)")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result & _U64, pos
        shift += 7


def _tag(buf, pos: int, end: int) -> tuple[int, int, int]:
    """(field number, wire type, next position) of the tag at POS."""
    key, pos = _varint(buf, pos, end, max_bytes=5)
    if key >> 32 or key >> 3 == 0:
        raise CaptureError(f"not an XSpace protobuf (invalid field tag before offset {pos})")
    return key >> 3, key & 7, pos


def _skip(buf, pos: int, end: int, number: int, wire: int, depth: int) -> tuple[int, int, int]:
    """(payload start, payload end, next position) of a field whose tag ended at POS."""
    if wire == _WIRE_VARINT:
        _, stop = _varint(buf, pos, end)
        return pos, stop, stop
    if wire == _WIRE_I64 or wire == _WIRE_I32:
        stop = pos + (8 if wire == _WIRE_I64 else 4)
        if stop > end:
            raise CaptureError("the file ends in the middle of a field (truncated capture?)")
        return pos, stop, stop
    if wire == _WIRE_LEN:
        length, start = _varint(buf, pos, end)
        if length > end - start:
            raise CaptureError(
                f"truncated or corrupt: a field needs {length} bytes at offset {start} "
                f"but only {end - start} remain")
        return start, start + length, start + length
    if wire == _WIRE_GROUP:
        if depth <= 0:
            raise CaptureError("corrupt: fields nested too deeply")
        inner = pos
        while True:
            if inner >= end:
                raise CaptureError("corrupt: a group has no end")
            inner_number, inner_wire, after = _tag(buf, inner, end)
            if inner_wire == _WIRE_END:
                if inner_number != number:
                    raise CaptureError("corrupt: a group ends with the wrong field number")
                return pos, inner, after
            inner = _skip(buf, after, end, inner_number, inner_wire, depth - 1)[2]
    raise CaptureError(f"not an XSpace protobuf (wire type {wire} before offset {pos})")


def fields(buf, pos: int, end: int, depth: int = MAX_DEPTH) -> Iterator[tuple[int, int, int, int, int, int]]:
    """(number, wire, field start, payload start, payload end, field end) of each field of one message."""
    while pos < end:
        number, wire, after = _tag(buf, pos, end)
        if wire == _WIRE_END:
            raise CaptureError(f"corrupt: a group ends where none started (offset {pos})")
        start, stop, nxt = _skip(buf, after, end, number, wire, depth)
        yield number, wire, pos, start, stop, nxt
        pos = nxt


def index_space(buf) -> SpaceIndex:
    """Scan the top level of a serialized XSpace without decoding the planes."""
    if len(buf) == 0:
        raise CaptureError("the file is empty (0 bytes)")
    index = SpaceIndex()
    strings = {_ERRORS: index.errors, _WARNINGS: index.warnings, _HOSTNAMES: index.hostnames}
    for number, wire, _, start, stop, _ in fields(buf, 0, len(buf)):
        if wire != _WIRE_LEN:
            continue
        if number == _PLANES:
            index.plane_spans.append((start, stop))
        elif number in strings:
            strings[number].append(bytes(buf[start:stop]).decode("utf-8", "replace"))
    return index


class CaptureFile:
    """An open capture: the index of its planes, and each plane's bytes on request (``read``).

    A local file is never held whole: the top level is indexed from its field headers alone
    and each plane is read (pread) into its own buffer when it is decoded, so a caller that
    drops a plane once decoded holds one plane's bytes at a time, not the file (a LocalFile:
    never mapped, every read checked against the file as opened).  Remote files (OPENER, an fsspec
    filesystem) are read whole at open, in bounded ranges into a buffer of the size the store
    reported, and compared with the store's info after the read.  Use as a context manager.
    """

    def __init__(self, path: str, opener: Opener | None = None):
        self.path = path
        self._file: LocalFile | None = None
        self._whole: np.ndarray | None = None
        if opener is not None:
            self._whole = read_bytes(path, opener)
            self.size = len(self._whole)
            self.index = index_space(memoryview(self._whole))
            return
        self._file = LocalFile(path)
        self.size = self._file.size
        try:
            self.index = index_space(_Headers(self))
        except BaseException:
            self.close()
            raise

    def read(self, span: tuple[int, int], into: np.ndarray | None = None) -> memoryview:
        """The bytes of SPAN: for a local file, in the front of INTO (a uint8 buffer) when it
        is large enough, else in a fresh buffer (drop it to free them). A caller decoding plane
        after plane reuses one buffer: its pages are touched once, not once per plane."""
        start, stop = span
        if self._whole is not None:
            return memoryview(self._whole)[start:stop]
        if self._file is None:
            raise CaptureError("the capture was closed before it was read")
        if into is not None and into.size >= stop - start:
            view = memoryview(into)[:stop - start]
            self._file.read_into(start, view)
            return view
        return self._file.read(start, stop)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._whole = None

    def __enter__(self) -> "CaptureFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Headers:
    """A capture's bytes as ``fields`` reads them, fetched in small blocks as they are asked for:
    indexing the top level touches only each field's tag and length, never a plane's body."""

    BLOCK = 1 << 16

    def __init__(self, capture: CaptureFile):
        self.capture = capture
        self.first = 0
        self.block = b""

    def __len__(self) -> int:
        return self.capture.size

    def __getitem__(self, key):
        if isinstance(key, slice):
            return bytes(self.capture.read((key.start, key.stop)))
        if not self.first <= key < self.first + len(self.block):
            self.first = key
            self.block = bytes(self.capture.read((key, min(key + self.BLOCK, self.capture.size))))
        return self.block[key - self.first]
