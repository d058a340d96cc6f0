"""Opening ``.xplane.pb`` files and finding their planes without decoding them.

The top level of an XSpace is just a list of length-delimited fields, so the
planes can be located here and decoded separately (``xspace.decode``): a huge
capture never needs the whole message tree in memory.  Every
way a file can be unusable (missing, unreadable, empty, truncated, not a
protobuf) becomes a :class:`CaptureError` with a message meant for the user.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from typing import IO, Callable

_PLANES, _ERRORS, _WARNINGS, _HOSTNAMES = 1, 2, 3, 4
_WIRE_VARINT, _WIRE_I64, _WIRE_LEN, _WIRE_I32 = 0, 1, 2, 5


class CaptureError(Exception):
    """A capture file that cannot be read; the message says why, for the user."""


@dataclass
class SpaceIndex:
    """Where each plane lies in the file, and the space's own messages."""

    plane_spans: list[tuple[int, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    hostnames: list[str] = field(default_factory=list)


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise CaptureError("the file ends in the middle of a field (truncated capture?)")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise CaptureError("not an XSpace protobuf (malformed varint)")


def index_space(buf) -> SpaceIndex:
    """Scan the top level of a serialized XSpace without decoding the planes."""
    end = len(buf)
    if end == 0:
        raise CaptureError("the file is empty (0 bytes)")
    index = SpaceIndex()
    strings = {_ERRORS: index.errors, _WARNINGS: index.warnings, _HOSTNAMES: index.hostnames}
    pos = 0
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise CaptureError("not an XSpace protobuf (field number 0)")
        if wire == _WIRE_LEN:
            length, pos = _varint(buf, pos, end)
            if pos + length > end:
                raise CaptureError(
                    f"the file is truncated: a field needs {length} bytes at offset {pos} "
                    f"but the file has {end} bytes")
            if number == _PLANES:
                index.plane_spans.append((pos, pos + length))
            elif number in strings:
                strings[number].append(bytes(buf[pos:pos + length]).decode("utf-8", "replace"))
            pos += length
        elif wire == _WIRE_VARINT:
            _, pos = _varint(buf, pos, end)
        elif wire == _WIRE_I64:
            pos += 8
        elif wire == _WIRE_I32:
            pos += 4
        else:
            raise CaptureError(f"not an XSpace protobuf (wire type {wire} at offset {pos})")
    if pos != end:
        raise CaptureError("the file is truncated in its last field")
    return index


Opener = Callable[[str], IO[bytes]]

# What each way of failing to open a file means to the user.
_OS_ERRORS = (
    (FileNotFoundError, "the file does not exist"),
    (PermissionError, "permission denied when reading the file"),
    (IsADirectoryError, "expected a file but found a directory"),
)


class CaptureFile:
    """An open capture: its bytes and the index of its planes (xspace.decode decodes them).

    Local files are memory-mapped; remote ones (through an fsspec opener) are
    read into memory once.  Use as a context manager.
    """

    def __init__(self, path: str, opener: Opener | None = None):
        self.path = path
        self.buffer: memoryview | None = None
        self._mmap: mmap.mmap | None = None
        self._file: IO[bytes] | None = None
        try:
            self._open(opener)
        except OSError as err:
            self.close()
            message = next((text for kind, text in _OS_ERRORS if isinstance(err, kind)),
                           f"cannot read the file: {err.strerror or err}")
            raise CaptureError(message) from None
        except CaptureError:
            self.close()
            raise

    def _open(self, opener: Opener | None) -> None:
        if opener is None:
            self._file = open(self.path, "rb")
            if os.fstat(self._file.fileno()).st_size == 0:
                raise CaptureError("the file is empty (0 bytes)")
            self._mmap = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
            self.buffer = memoryview(self._mmap)
        else:
            with opener(self.path) as handle:
                self.buffer = memoryview(handle.read())
        self.size = len(self.buffer)
        self.index = index_space(self.buffer)

    def close(self) -> None:
        if self.buffer is not None:
            self.buffer.release()
            self.buffer = None
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "CaptureFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
