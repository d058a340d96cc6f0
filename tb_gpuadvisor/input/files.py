"""Reading capture files, local or remote, for every format's adapter.

A local file is read a range at a time (``LocalFile``: never mapped, every read checked
against the file as opened); a remote one (OPENER, an fsspec filesystem) in bounded ranges,
compared with the store's info after the read.  Every way a file can be unusable (missing,
unreadable, empty, not a regular file, changed while read) becomes a :class:`CaptureError`
with a message meant for the user.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


class CaptureError(Exception):
    """A capture file that cannot be read; the message says why, for the user."""


class BeingWritten(CaptureError):
    """A capture file the profiler is still writing: not an error of the file, and read again
    once it is complete (the tab answers "being written" meanwhile)."""


class Opener(Protocol):
    """What remote files are read through: the part of an fsspec filesystem used here."""

    def info(self, path: str) -> dict[str, Any]: ...

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes: ...

    def invalidate_cache(self, path: str | None = None) -> None: ...


# The first bytes of a gzip stream.
GZIP_MAGIC = b"\x1f\x8b"
# Remote files are read in ranges of at most this many bytes (one request each), so a read
# never asks a store for more than the size it reported before reading began.
REMOTE_CHUNK_BYTES = 16 << 20
# Fields of fsspec's file info that change when a file is rewritten, across its implementations
# (local and sftp/arrow/gcsfs mtime, s3fs LastModified and ETag, adlfs last_modified and etag,
# gcsfs updated and generation, webhdfs modificationTime, ftp modify, memory created).
_VERSION_FIELDS = ("mtime", "LastModified", "last_modified", "updated", "modificationTime",
                   "modify", "created", "ETag", "etag", "generation")
_CHANGED = ("the file changed while it was read (is the profiler still writing it?); "
            "reload to analyse the new version")

# What each way of failing to open a file means to the user.
_OS_ERRORS = (
    (FileNotFoundError, "the file does not exist"),
    (PermissionError, "permission denied when reading the file"),
    (IsADirectoryError, "expected a file but found a directory"),
)


class LocalFile:
    """A local file read a range at a time (pread), never mapped and never held whole: files are
    rewritten while TensorBoard runs, and a mapped file that shrinks kills the process (SIGBUS)
    when a vanished page is touched. Every read is checked against the size and mtime seen at
    open, so a file that changes while it is read becomes a CaptureError. Only regular files are
    opened, without blocking (a FIFO named like a capture would hang the reader forever)."""

    def __init__(self, path: str):
        self._fd: int | None = None
        self._fd, self._stamp = _open_local(path)
        self.size, self.mtime_ns = self._stamp

    @classmethod
    def inherited(cls, fd: int, stamp: tuple[int, int]) -> "LocalFile":
        """The descriptor FD that another process opened (with its size and mtime STAMP seen
        there) and passed on: a helper process reads that same file, checked against the same
        stamp, without opening it by name again."""
        local = cls.__new__(cls)
        local._fd, local._stamp, local.size = fd, stamp, stamp[0]
        return local

    @property
    def descriptor(self) -> tuple[int, tuple[int, int]]:
        """The open descriptor and the (size, mtime) it was opened with, to pass to a helper."""
        if self._fd is None:
            raise CaptureError("the capture was closed before it was read")
        return self._fd, self._stamp

    def __len__(self) -> int:
        return self.size

    def read_into(self, start: int, view: memoryview) -> None:
        """Fill VIEW with the bytes from START on."""
        if self._fd is None:
            raise CaptureError("the capture was closed before it was read")
        try:
            got = 0
            while got < len(view):
                n = os.preadv(self._fd, [view[got:]], start + got)
                if n == 0:
                    break
                got += n
            after = os.fstat(self._fd)
        except OSError as err:
            raise CaptureError(f"cannot read the file: {err.strerror or err}") from None
        if got != len(view) or (after.st_size, after.st_mtime_ns) != self._stamp:
            raise BeingWritten(_CHANGED)

    def read(self, start: int, stop: int) -> memoryview:
        """The bytes of [START, STOP) in a fresh buffer (drop it to free them)."""
        data = np.empty(stop - start, np.uint8)
        view = memoryview(data)
        self.read_into(start, view)
        return view

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "LocalFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_bytes(path: str, opener: Opener | None = None) -> np.ndarray:
    """The bytes of a local (OPENER None) or remote capture file; any failure is a CaptureError
    saying why in the user's terms.  Every capture format reads its files through this."""
    try:
        return _read_local(path) if opener is None else _read_remote(path, opener)
    except OSError as err:
        raise _capture_error(err) from None
    except CaptureError:
        raise
    except Exception as err:    # each remote store raises its own kinds (HTTP, auth, timeouts)
        if opener is None:
            raise
        raise CaptureError(f"cannot read the file: {type(err).__name__}: {err}") from None


def _open_local(path: str) -> tuple[int, tuple[int, int]]:
    """An open descriptor of the regular, non-empty file PATH and its (size, mtime); a file that
    cannot be opened is a CaptureError saying why."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise _capture_error(err) from None
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise CaptureError("not a regular file (a FIFO, socket or device named like a capture); skipped")
        if before.st_size == 0:
            raise CaptureError("the file is empty (0 bytes)")
    except BaseException:
        os.close(fd)
        raise
    return fd, (before.st_size, before.st_mtime_ns)


def _capture_error(err: OSError) -> CaptureError:
    return CaptureError(next((text for kind, text in _OS_ERRORS if isinstance(err, kind)),
                             f"cannot read the file: {err.strerror or err}"))


def _read_local(path: str) -> np.ndarray:
    """The whole local file, read and checked through a LocalFile. Not zero-filled: the read
    writes every byte, and the first touch of each page is then the read's own."""
    with LocalFile(path) as file:
        data = np.empty(len(file), np.uint8)
        file.read_into(0, memoryview(data))
    return data


def remote_stamp(info: dict[str, Any]) -> tuple[int | None, tuple[tuple[str, str], ...]]:
    """(size or None, the fields that change on a rewrite) from a remote file's fsspec info."""
    size = info.get("size")
    version = tuple((name, str(info[name])) for name in _VERSION_FIELDS if info.get(name) is not None)
    return (int(size) if size is not None else None), version


def _fresh_stamp(fs: Opener, path: str) -> tuple[int | None, tuple[tuple[str, str], ...]]:
    """remote_stamp asked of the store itself, not of a listing the filesystem cached."""
    fs.invalidate_cache(path)
    info = fs.info(path)
    if info.get("type") == "directory":
        raise IsADirectoryError(path)
    return remote_stamp(info)


def _read_remote(path: str, fs: Opener) -> np.ndarray:
    before = _fresh_stamp(fs, path)
    size = before[0]
    if size is None:
        raise CaptureError("the store does not report the file's size, so it cannot be read safely")
    if size == 0:
        raise CaptureError("the file is empty (0 bytes)")
    data = np.empty(size, np.uint8)
    got = 0
    while got < size:
        end = min(got + REMOTE_CHUNK_BYTES, size)
        chunk = fs.cat_file(path, got, end)
        if not chunk or len(chunk) > end - got:
            break
        data[got:got + len(chunk)] = np.frombuffer(chunk, np.uint8)
        got += len(chunk)
    if got != size or _fresh_stamp(fs, path) != before:
        raise BeingWritten(_CHANGED)
    return data


@dataclass(frozen=True)
class Head:
    """The first bytes of a file: DATA, whether they are all of it, and how long ago the file last
    changed (None where a store does not say)."""

    data: bytes
    complete: bool
    age_s: float | None


def read_head(path: str, opener: Opener | None, size: int) -> Head:
    """At most SIZE bytes from the start of the file at PATH, in one read (a format's sniffer
    decides from these whether a file of a loose name is one of its captures).  An empty file is
    a Head of no bytes; a file that cannot be read is a CaptureError."""
    try:
        if opener is not None:
            total = int(opener.info(path).get("size") or 0)
            data = bytes(opener.cat_file(path, 0, min(size, total))) if total else b""
            return Head(data, len(data) >= total, None)
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode) and st.st_size == 0:
            return Head(b"", True, _age_s(st.st_mtime_ns))
        with LocalFile(path) as file:
            data = bytes(file.read(0, min(size, len(file))))
            return Head(data, len(data) == len(file), _age_s(file.mtime_ns))
    except OSError as err:
        raise _capture_error(err) from None
    except CaptureError:
        raise
    except Exception as err:    # each remote store raises its own kinds
        if opener is None:
            raise
        raise CaptureError(f"cannot read the file: {type(err).__name__}: {err}") from None


def _age_s(mtime_ns: int) -> float:
    return max(time.time() - mtime_ns / 1e9, 0.0)
