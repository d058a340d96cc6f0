"""The C event decoder and the protobuf-object decoder give identical columns."""

from __future__ import annotations

import numpy as np
import pytest
from synth import build_training_session, truncated

from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.input.xplane import build
from tb_gpuadvisor.multihost import analyze_session
from tb_gpuadvisor.input.xplane import decode
from tb_gpuadvisor.input.xplane.reader import CaptureFile
from tb_gpuadvisor.input.files import CaptureError

WANTED = ("correlation_id", "group_id", "level 0", "memcpy_details", "kernel_details", "step_num", "_r",
          "fragmentation", "allocator_name", "bytes_allocated")

pytestmark = pytest.mark.skipif(not decode.has_fast_decoder(), reason="C decoder not built")


def _assert_planes_equal(fast: decode.DecodedPlane, slow: decode.DecodedPlane) -> None:
    assert fast.shell == slow.shell and fast.lines == slow.lines
    for column in ("metadata_id", "offset_ps", "duration_ps"):
        assert np.array_equal(getattr(fast, column), getattr(slow, column))
    assert fast.strings == slow.strings
    for name in WANTED:
        a, b = fast.stats[name], slow.stats[name]
        assert np.array_equal(a.event, b.event) and np.array_equal(a.kind, b.kind), name
        assert np.array_equal(a.value, b.value), name


def _assert_same(path: str) -> None:
    with CaptureFile(path) as capture:
        for span in capture.index.plane_spans:
            data = capture.read(span)
            fast = decode.decode_plane(data, lambda plane: WANTED)
            _assert_planes_equal(fast, decode.decode_plane(data, lambda plane: WANTED, fast=False))
            # Lines cut into runs decoded on threads (a cut inside a line when a run is shorter).
            for parts in (2, 3, 7):
                _assert_planes_equal(decode.decode_plane(data, lambda plane: WANTED, parts=parts), fast)
            # A scratch buffer handed back as it is decoded (every page here) gives the same
            # plane: the strings and line names behind the released pages were copied first.
            scratch = np.frombuffer(bytes(data), np.uint8).copy()
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(decode, "RELEASE_STEP", 1)
                _assert_planes_equal(decode.decode_plane(scratch, lambda plane: WANTED, release=True), fast)
                scratch = np.frombuffer(bytes(data), np.uint8).copy()
                _assert_planes_equal(decode.decode_plane(scratch, lambda plane: WANTED, release=True, parts=3), fast)


def test_synthetic_captures_decode_identically(tmp_path):
    for i, kwargs in enumerate([dict(gpus=2, memcpy_frac=0.1), dict(marker="r", cupti_plane=True,
                                launch_api="cuLaunchKernel"), dict(framework="jax", marker="none")]):
        folder = build_training_session(steps=3, **kwargs).write(tmp_path / str(i))
        _assert_same(str(next(folder.glob("*.xplane.pb"))))


def test_real_captures_decode_identically(corpus):
    for path in sorted(corpus.rglob("*.xplane.pb")):
        _assert_same(str(path))


@pytest.mark.skipif(not hasattr(__import__("os"), "posix_fadvise"), reason="pages are handed back on Linux")
def test_a_released_buffer_is_handed_back_as_it_is_decoded(tmp_path, monkeypatch):
    """The pages of a scratch buffer behind the decoded events go back to the system during the
    decode (they read as zeros after it), not when the caller drops the buffer; a read-only
    buffer (a capture held in memory) is never touched."""
    folder = build_training_session(steps=40, gpus=1).write(tmp_path)
    with CaptureFile(str(next(folder.glob("*.xplane.pb")))) as capture:
        span = max(capture.index.plane_spans, key=lambda s: s[1] - s[0])
        data = bytes(capture.read(span))
    assert len(data) > 16 * 4096
    monkeypatch.setattr(decode, "RELEASE_STEP", 4096)
    scratch = np.frombuffer(data, np.uint8).copy()
    decode.decode_plane(scratch, lambda plane: WANTED, release=True)
    assert np.count_nonzero(scratch) < len(data) // 2
    decode.decode_plane(data, lambda plane: WANTED, release=True)      # read-only: left as it is
    kept = np.frombuffer(bytes(data), np.uint8).copy()
    decode.decode_plane(kept, lambda plane: WANTED)                     # not asked to release
    assert kept.tobytes() == data


def test_skipped_planes_are_not_decoded(tmp_path):
    folder = build_training_session(steps=2, gpus=1).write(tmp_path)
    with CaptureFile(str(next(folder.glob("*.xplane.pb")))) as capture:
        seen = []
        for span in capture.index.plane_spans:
            assert decode.decode_plane(capture.read(span), lambda plane: seen.append(plane.name)) is None
        assert "/host:CPU" in seen and "/device:GPU:0" in seen


def test_corrupt_plane_is_a_capture_error():
    plane = build_training_session(steps=2).space.planes[0].SerializeToString()
    inner = truncated(plane, 0.5)           # a plane whose own bytes end mid-field
    for fast in (True, False):
        with pytest.raises(CaptureError, match="a plane at bytes 7-"):
            decode.decode_plane(inner, lambda p: WANTED, fast=fast, at=7)


def test_whole_model_is_the_same_without_the_c_decoder(tmp_path, monkeypatch):
    build_training_session(steps=4, gpus=2, input_wait_frac=0.2, memcpy_frac=0.05).write(tmp_path)
    (ref,) = find_sessions(str(tmp_path))
    fast = analyze_session(ref)
    monkeypatch.setattr(decode, "_wire", None)
    assert not decode.has_fast_decoder()
    assert analyze_session(ref) == fast


def _assert_tables_equal(a, b) -> None:
    for name, value in vars(a).items():
        other = getattr(b, name)
        if isinstance(value, np.ndarray):
            assert np.array_equal(value, other), name
        elif name not in ("derived", "key"):    # what the table caches, and its identity for stage memos
            assert value == other, name


def test_tables_built_from_planes_in_parts_are_the_same(tmp_path, monkeypatch):
    """read_host with every plane cut into 3 parts (the decode of a plane larger than a thread's
    share) builds the tables one part per plane builds."""
    folder = build_training_session(steps=4, gpus=2, marker="r", memcpy_frac=0.1).write(tmp_path)
    path = str(next(folder.glob("*.xplane.pb")))
    whole = build.read_host(path, "h")
    monkeypatch.setattr(build, "_decode_parts", lambda spans, threads: [3] * len(spans))
    parts = build.read_host(path, "h")
    for a, b in zip([whole.activity, whole.memory, *whole.devices], [parts.activity, parts.memory, *parts.devices],
                    strict=True):
        _assert_tables_equal(a, b)
    assert (whole.origin_ns, whole.warnings) == (parts.origin_ns, parts.warnings)
