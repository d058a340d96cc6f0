"""The capture reader: planes decoded one at a time, every bad file a clear CaptureError."""

from __future__ import annotations

import os

import numpy as np
import pytest
from synth import build_training_session, garbage, truncated

from tb_gpuadvisor.input.xplane.decode import decode_plane
from tb_gpuadvisor.input.xplane.reader import CaptureFile, index_space
from tb_gpuadvisor.input.files import CaptureError
from tb_gpuadvisor.input.xplane.schema import XSpace


def _all(plane) -> tuple[str, ...]:
    return ()            # decode every plane's events, with no stats


def _decode_all(capture: CaptureFile) -> None:
    for span in capture.index.plane_spans:
        decode_plane(capture.read(span), _all)


def _space_bytes(**kw) -> bytes:
    return build_training_session(steps=3, **kw).space.SerializeToString()


def test_planes_round_trip_through_our_schema(tmp_path):
    data = _space_bytes(gpus=2)
    path = tmp_path / "h.xplane.pb"
    path.write_bytes(data)
    with CaptureFile(str(path)) as capture:
        names = [decode_plane(capture.read(span), _all).shell.name for span in capture.index.plane_spans]
    assert names == [plane.name for plane in XSpace.FromString(data).planes]
    assert "/host:CPU" in names and "/device:GPU:1" in names


def test_space_level_strings_are_read():
    space = XSpace(hostnames=["worker-0"], errors=["CUPTI error"], warnings=["dropped 12 events"])
    index = index_space(space.SerializeToString())
    assert (index.hostnames, index.errors, index.warnings) == (["worker-0"], ["CUPTI error"],
                                                               ["dropped 12 events"])


@pytest.mark.parametrize("keep", [0.3, 0.77, 0.999])
def test_truncated_capture_is_a_clear_error(tmp_path, keep):
    path = tmp_path / "h.xplane.pb"
    path.write_bytes(truncated(_space_bytes(), keep))
    with pytest.raises(CaptureError, match="truncated|corrupt"):
        with CaptureFile(str(path)) as capture:
            _decode_all(capture)


def test_zero_byte_file(tmp_path):
    path = tmp_path / "h.xplane.pb"
    path.write_bytes(b"")
    with pytest.raises(CaptureError, match="empty"):
        CaptureFile(str(path))


def test_garbage_bytes(tmp_path):
    path = tmp_path / "h.xplane.pb"
    path.write_bytes(garbage())
    with pytest.raises(CaptureError):
        with CaptureFile(str(path)) as capture:
            _decode_all(capture)


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(CaptureError, match="does not exist"):
        CaptureFile(str(tmp_path / "nope.xplane.pb"))
    if os.geteuid() == 0:
        pytest.skip("root reads files regardless of permissions")
    path = tmp_path / "h.xplane.pb"
    path.write_bytes(_space_bytes())
    path.chmod(0)
    with pytest.raises(CaptureError, match="permission"):
        CaptureFile(str(path))


def test_local_capture_is_indexed_from_headers_and_read_plane_by_plane(tmp_path, monkeypatch):
    """Opening reads only the top-level field headers (in blocks of _Headers.BLOCK bytes), and
    each plane is read, alone, when asked for: the file is never held whole."""
    from tb_gpuadvisor.input.xplane import reader
    data = _space_bytes(gpus=2)
    path = tmp_path / "h.xplane.pb"
    path.write_bytes(data)
    reads: list[tuple[int, int]] = []
    real_preadv = os.preadv

    def recording_preadv(fd, buffers, offset):
        n = real_preadv(fd, buffers, offset)
        reads.append((offset, offset + n))
        return n

    monkeypatch.setattr(os, "preadv", recording_preadv)
    monkeypatch.setattr(reader._Headers, "BLOCK", 64)
    with CaptureFile(str(path)) as capture:
        whole = index_space(data)
        assert capture.index == whole and len(whole.plane_spans) >= 3
        assert sum(b - a for a, b in reads) <= 64 * (len(whole.plane_spans) + 1) < len(data) // 4
        for span in whole.plane_spans:
            reads.clear()
            assert bytes(capture.read(span)) == data[span[0]:span[1]]
            assert reads[0][0] == span[0] and reads[-1][1] == span[1]


def test_planes_read_into_a_reused_buffer_when_it_fits(tmp_path):
    """A caller decoding plane after plane passes one buffer: a plane that fits is read into its
    front (the same memory each time, so its pages are touched once), a larger one into a fresh
    buffer; the bytes are the file's either way."""
    data = _space_bytes(gpus=2)
    path = tmp_path / "h.xplane.pb"
    path.write_bytes(data)
    with CaptureFile(str(path)) as capture:
        spans = capture.index.plane_spans
        largest = max(b - a for a, b in spans)
        buffer = np.zeros(largest, np.uint8)
        for span in spans:
            view = capture.read(span, buffer)
            assert bytes(view) == data[span[0]:span[1]]
            assert np.shares_memory(np.frombuffer(view, np.uint8), buffer)
        small = np.zeros(1, np.uint8)
        view = capture.read(spans[0], small)
        assert bytes(view) == data[spans[0][0]:spans[0][1]] and not np.shares_memory(np.frombuffer(view, np.uint8), small)
