"""The Kineto JSON decoder reads a large trace a run of events at a time: the runs must give the
very columns the whole-file decode gives, whatever the text around the cuts looks like."""

from __future__ import annotations

import dataclasses
import gzip
import json

import msgspec
import pytest

from tb_gpuadvisor.input.kineto import decode as kineto_json
from tb_gpuadvisor.input.kineto.decode import decode, inflate
from tb_gpuadvisor.input.files import read_bytes


def _whole(data) -> kineto_json.Columns:
    return kineto_json._typed(iter([("trace", data)]))


def _runs(data) -> kineto_json.Columns:
    return kineto_json._typed(kineto_json._documents(kineto_json._Buffer(data)))


@pytest.fixture
def small_runs(monkeypatch):
    """Runs of 4 KiB, so that a trace of a few hundred KiB is cut many times."""
    monkeypatch.setattr(kineto_json, "_RUN", 4096)
    monkeypatch.setattr(kineto_json, "_SEEK", 4096)


def _trace(events: list[dict], **head) -> bytes:
    return json.dumps({"schemaVersion": 1, **head, "traceEvents": events,
                       "baseTimeNanoseconds": 1700000000000000000}, indent=1).encode()


def _kernel(k: int, name: str = "void gemm_kernel<float>()", **args) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 1000.0 + k, "dur": 0.5,
            "args": {"correlation": k, "device": 0, "stream": 7, **args}}


def test_runs_give_the_whole_decode_columns_on_every_corpus_trace(corpus, small_runs):
    """Every PyTorch trace of the corpus, cut every few KiB (hundreds of cuts each, at Kineto's
    own ``},\\n  {`` layout), decodes to columns equal to the one-go decode, and the cuts held."""
    paths = sorted(corpus.glob("pytorch-*/**/*.pt.trace.json*"))
    assert paths
    for path in paths:
        data = inflate(read_bytes(str(path)))
        assert sum(1 for _ in kineto_json._documents(kineto_json._Buffer(data))) > 100
        assert _runs(data) == _whole(data), path


def test_a_cut_inside_a_string_or_a_nested_object_falls_back_to_one_go(small_runs):
    """Names holding the text of an event boundary and args holding arrays of objects put ``}, {``
    inside strings and nested objects; wherever the cuts land, decode() returns the true columns."""
    events = []
    for k in range(3000):
        pad = "x" * (k * 7919 % 211)            # uneven sizes, so the cuts land anywhere
        if k % 3 == 0:
            events.append(_kernel(k, name=f'tricky }}, {{"ph": "X", "ts": 1}} {pad}'))
        elif k % 3 == 1:
            events.append(_kernel(k, pad=pad, shapes=[{"a": 1}, {"b": 2}, {"c": [{"d": 3}, {"e": 4}]}]))
        else:
            events.append(_kernel(k, pad=pad))
    data = bytearray(_trace(events, deviceProperties=[{"id": 0, "name": "GPU", "computeMajor": 9}]))
    got = decode(data)
    assert got == _whole(data)
    assert got.events == 3000 and got.name[0].startswith("tricky")
    assert list(got.correlation[:4]) == [0, 1, 2, 3] and got.devices[0].major == 9
    with pytest.raises(msgspec.MsgspecError):        # the runs themselves did not hold here
        _runs(data)


def test_header_after_the_events_is_read_from_the_last_run(small_runs):
    """deviceProperties and baseTimeNanoseconds written after traceEvents (keys in any order)."""
    events = [_kernel(k) for k in range(2000)]
    text = json.dumps({"traceEvents": events, "deviceProperties": [{"id": 0, "computeMajor": 8,
                       "totalGlobalMem": 42}], "baseTimeNanoseconds": 5}).encode()
    got = _runs(bytearray(text))
    assert got == _whole(bytearray(text))
    assert got.base_ns == 5 and got.devices[0].total_memory == 42 and got.events == 2000


def test_a_truncated_large_trace_is_still_one_clear_error(small_runs):
    events = [_kernel(k) for k in range(2000)]
    data = bytearray(_trace(events)[:-5000])
    with pytest.raises(Exception, match="truncated"):
        decode(data)


def test_a_trace_larger_than_the_memory_budget_is_refused_in_one_line(tmp_path):
    """A 2.5 MB trace with 4 MB of memory to spare (2 bytes per JSON byte needed) is refused
    before it is decoded, in one line that says how to make it fit; with 6 MB it is read."""
    from synth_kineto import kineto_trace, write_trace
    from tb_gpuadvisor.input.kineto.build import read
    from tb_gpuadvisor.input.files import CaptureError

    path = write_trace(tmp_path / "w.pt.trace.json", kineto_trace(steps=60, kernels=100))
    size = path.stat().st_size
    assert 2_000_000 < size < 3_000_000
    with pytest.raises(CaptureError, match=r"^refused: this \d+ MiB trace needs about .*schedule\(active") as err:
        read(str(path), "w", budget=4_000_000)
    assert "\n" not in str(err.value)
    assert read(str(path), "w", budget=6_000_000).activity.start_ps.size


@pytest.mark.parametrize("backend", ["msgspec", "orjson", "json"])
def test_every_decoder_reads_a_plain_file_by_ranges(tmp_path, backend):
    """A plain (not gzip) local trace is decoded from the file a range at a time (LocalFile);
    the orjson and json fallbacks must read it too (json.loads takes no buffer but bytes)."""
    from synth_kineto import kineto_trace, write_trace
    from tb_gpuadvisor.input.files import LocalFile

    path = write_trace(tmp_path / "w.pt.trace.json", kineto_trace())
    with LocalFile(str(path)) as local:
        assert decode(local, backend) == decode(bytearray(path.read_bytes()), "json")


def test_a_plain_trace_truncated_while_read_is_one_clear_error(tmp_path, small_runs):
    """The file is read by ranges, never mapped: one truncated under the reader (rewritten while
    TensorBoard reads it) is a CaptureError, not a SIGBUS that takes the server down."""
    import os

    from synth_kineto import kineto_trace, write_trace
    from tb_gpuadvisor.input.files import CaptureError, LocalFile

    path = write_trace(tmp_path / "w.pt.trace.json", kineto_trace(steps=20, kernels=100))
    with LocalFile(str(path)) as local:
        os.truncate(path, 4096)
        with pytest.raises(CaptureError, match="changed while it was read"):
            decode(local)


@pytest.mark.parametrize("backend", ["msgspec", "orjson", "json"])
def test_every_decoder_finds_collective_args_by_their_message_size(backend):
    """An event carries a collective's args when it gives "In msg nelems" as a number (PyTorch writes
    it with the collective's name): a name alone, or a size of -1 or of words, is no collective's args."""
    comm = {"Collective name": "allreduce", "dtype": "Float", "Group size": 8}
    events = [_kernel(0, **comm, **{"In msg nelems": 16}), _kernel(1, **comm), _kernel(2, **{"In msg nelems": 4}),
              _kernel(3, **comm, **{"In msg nelems": -1}), _kernel(4, **comm, **{"In msg nelems": "n/a"})]
    comms = decode(bytearray(_trace(events)), backend).comms
    assert sorted(comms) == [0, 2]
    assert comms[0] == kineto_json.CommArgs("allreduce", 16, None, "Float", 8)


# -- issue 38.5: the bare-array form; issue 34: bounded inflation, traces that end early ----------


def _gzip_of_spaces(mib: int, head: bytes = b'{"traceEvents":[', level: int = 9) -> bytes:
    """A valid trace (HEAD, MIB MiB of spaces, one event, the end) gzipped chunk by chunk: the
    text is never held, only its compressed form (about 1 KiB per MiB)."""
    import zlib

    packer, block = zlib.compressobj(level, zlib.DEFLATED, 31), b" " * (1 << 20)
    parts = [packer.compress(head)]
    parts += [packer.compress(block) for _ in range(mib)]
    end = b"]" if head.startswith(b"[") else b"]}"
    parts += [packer.compress(json.dumps(_kernel(0)).encode() + end), packer.flush()]
    return b"".join(parts)


@pytest.mark.parametrize("backend", ["msgspec", "orjson", "json"])
def test_a_bare_array_of_events_is_read_on_every_decoder(backend, small_runs):
    """The Chrome trace format allows a bare JSON array of events, which torch.profiler wrote in
    2020 (torch-tb-profiler's DataLoader samples): the columns are those of the same events in an
    object's traceEvents, whole and (msgspec) cut into runs."""
    events = [_kernel(k, name=f"void k{k % 7}<float>()") for k in range(3000)]
    whole = decode(bytearray(_trace(events)), backend)
    bare = bytearray(b"\n " + json.dumps(events, indent=1).encode())
    assert decode(bare, backend) == dataclasses.replace(whole, base_ns=0)
    assert whole.events == 3000 and whole.correlation[-1] == 2999
    if backend == "msgspec":
        assert sum(1 for _ in kineto_json._documents(kineto_json._Buffer(bare), bare=True)) > 10
        assert _runs_bare(bare) == decode(bare, backend)


def _runs_bare(data) -> kineto_json.Columns:
    return kineto_json._typed(kineto_json._documents(kineto_json._Buffer(data), bare=True))


@pytest.mark.parametrize("backend", ["msgspec", "orjson", "json"])
def test_a_bare_array_that_is_not_events_is_one_clear_error(backend):
    with pytest.raises(kineto_json.CaptureError, match="not a Chrome trace") as err:
        decode(bytearray(b'[1, 2, {"ph": "X"}]'), backend)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("backend", ["msgspec", "orjson", "json"])
@pytest.mark.parametrize("cut", [1, 7, 40, 200])
def test_json_that_ends_early_is_truncated_and_corrupt_json_is_not(backend, cut):
    """Text cut anywhere (the profiler still writing it) is a Truncated error on every decoder;
    text that is broken inside is an ordinary CaptureError, whatever the decoder."""
    text = _trace([_kernel(k) for k in range(20)])
    with pytest.raises(kineto_json.Truncated):
        decode(bytearray(text[:-cut]), backend)
    between = text[:-cut].rfind(b"},") + 2      # cut between two events, blanks after the cut
    with pytest.raises(kineto_json.Truncated):
        decode(bytearray(text[:between] + b"\n  \n"), backend)
    broken = text.replace(b'"ph": "X"', b'"ph": X', 1)
    with pytest.raises(kineto_json.CaptureError) as err:
        decode(bytearray(broken), backend)
    assert not isinstance(err.value, kineto_json.Truncated)


def test_a_cut_gzip_stream_is_truncated():
    data = gzip.compress(_trace([_kernel(k) for k in range(200)]))
    with pytest.raises(kineto_json.Truncated, match="gzip file is truncated"):
        inflate(bytearray(data[: len(data) // 2]))


def test_inflation_stops_at_the_limit_before_the_text_is_in_memory(monkeypatch):
    """64 MiB of JSON in a gzip of 64 KiB, inflated with a limit of 8 MiB: refused in one line
    naming the file and the limit, having produced no more than the limit plus one chunk."""
    data = bytearray(_gzip_of_spaces(64))
    assert len(data) < 100_000
    produced = []
    real = kineto_json._gzip.decompressobj

    class Counting:
        def __init__(self, *args):
            self.inner = real(*args)

        def decompress(self, *args):
            out = self.inner.decompress(*args)
            produced.append(len(out))
            return out

        def __getattr__(self, name):
            return getattr(self.inner, name)

    monkeypatch.setattr(kineto_json._gzip, "decompressobj", Counting)
    with pytest.raises(kineto_json.CaptureError, match=r"^refused: w\.pt\.trace\.json\.gz \(0\.1 MiB\) inflates to "
                                                       r"more than 8 MiB of JSON.*TB_GPUADVISOR_MEMORY_LIMIT_MB") as err:
        inflate(data, 8 << 20, "w.pt.trace.json.gz")
    assert "\n" not in str(err.value)
    assert sum(produced) <= (8 << 20) + 1 and max(produced) <= kineto_json._INFLATE_CHUNK
    assert len(inflate(data, 80 << 20)) > 64 << 20          # the same file under a larger limit


def test_inflation_past_the_ratio_is_refused_whatever_the_limit(monkeypatch):
    """A bomb is refused at MAX_INFLATION times its size even with memory to spare (no limit
    given); the corpus' traces (14-26x) are far below it."""
    monkeypatch.setattr(kineto_json, "INFLATION_FLOOR", 1 << 20)
    data = bytearray(_gzip_of_spaces(64))
    with pytest.raises(kineto_json.CaptureError, match=r"inflates to more than \d+ MiB, 128x its size"):
        inflate(data)
    with pytest.raises(kineto_json.CaptureError, match="128x its size"):
        inflate(data, 1 << 40)


def test_corpus_traces_inflate_well_within_the_ratio(corpus):
    for path in sorted(corpus.glob("pytorch-*/**/*.pt.trace.json.gz")):
        stored = read_bytes(str(path))
        assert len(inflate(stored)) < 30 * len(stored), path


def test_a_remote_trace_is_refused_before_it_is_read_and_a_remote_bomb_before_it_is_inflated(monkeypatch):
    """A remote plain trace larger than the budget allows is refused from the size its store
    reports, nothing of it fetched; a remote gzip bomb is fetched (it is small) and inflated only
    up to what the budget allows."""
    fsspec = pytest.importorskip("fsspec")
    from tb_gpuadvisor.input.kineto.build import read

    memory = fsspec.filesystem("memory")
    plain, bomb = "/issue34/big.pt.trace.json", "/issue34/bomb.pt.trace.json.gz"
    memory.pipe(plain, _trace([_kernel(k) for k in range(20_000)]))
    memory.pipe(bomb, _gzip_of_spaces(64))
    fetched = []
    real_cat = type(memory).cat_file
    monkeypatch.setattr(type(memory), "cat_file", lambda self, path, *a, **k: fetched.append(path) or real_cat(self, path, *a, **k))
    with pytest.raises(kineto_json.CaptureError, match=r"^refused: this \d+ MiB trace needs about"):
        read(plain, "big", memory, budget=1 << 20)
    assert fetched == []
    with pytest.raises(kineto_json.CaptureError, match=r"^refused: bomb\.pt\.trace\.json\.gz \(0\.1 MiB\) inflates to more than 8 MiB"):
        read(bomb, "bomb", memory, budget=16 << 20)
    assert read(plain, "big", memory, budget=1 << 30).devices
    memory.rm("/issue34", recursive=True)


def _analysed(tmp_path, trace) -> dict:
    from tb_gpuadvisor.input.discovery import find_sessions
    from tb_gpuadvisor.multihost import analyze_session

    path = tmp_path / "run" / "worker0.pt.trace.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace))
    return analyze_session(find_sessions(str(tmp_path))[0])


def test_a_bare_array_trace_of_the_old_categories_is_pytorch_with_its_steps(tmp_path):
    """Issue 38.5: torch.profiler's 2020 form, a bare array with "Operator"/"Runtime"/"Kernel"
    categories and string tids ("stream 7"), reads as PyTorch with its 3 ProfilerStep#N steps."""
    from synth_kineto import kineto_trace

    events = kineto_trace(steps=3, kernels=4, old=True)["traceEvents"]
    for event in events:
        if event.get("cat") == "Kernel":
            event["tid"] = f"stream {event['args']['stream']}"
    session = _analysed(tmp_path, events)
    assert session["errors"] == [] and session["framework"] == "pytorch"
    assert session["steps"]["count"] == 3 and session["steps"]["source"] == "profiler_step"


def test_a_kineto_trace_without_ops_is_pytorch(tmp_path):
    """A trace of CUDA activity only (no CPU op: profile(activities=[CUDA])) holds runtime calls
    and kernels whose names no framework owns; its format says it is PyTorch's."""
    from synth_kineto import kineto_trace

    trace = kineto_trace(steps=3, kernels=4, old=True)
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("cat") != "Operator"]
    session = _analysed(tmp_path, trace)
    assert session["framework"] == "pytorch" and session["errors"] == []
    kernels_only = [e for e in trace["traceEvents"] if e.get("cat") == "Kernel"]
    assert _analysed(tmp_path / "alone", {"traceEvents": kernels_only})["errors"] == []


@pytest.fixture
def helpers(monkeypatch, small_runs):
    """Two helper processes for any trace of a dozen runs or more (4 KiB runs, 2 per process)."""
    monkeypatch.setattr(kineto_json, "HELPER_PIECES", 2)
    monkeypatch.setattr(kineto_json.cores, "threads", lambda most: min(most, 3))


def test_helper_processes_give_the_columns_of_one_process(corpus, helpers, tmp_path):
    """A large trace is decoded by this process and two helpers (each a range of runs of the
    same open file, or of the inflated text streamed to it): on every PyTorch trace of the
    corpus, written plain, and on a trace whose header follows its events (read by the last
    helper), the columns equal the one-go decode's, comms rows and thread names included."""
    from tb_gpuadvisor.input.files import LocalFile

    events = [_kernel(k, **({"In msg nelems": 64, "Collective name": "allreduce"} if k % 97 == 0 else {}))
              for k in range(3000)]
    texts = [json.dumps({"traceEvents": events, "deviceProperties": [{"id": 0, "totalGlobalMem": 42}],
                         "baseTimeNanoseconds": 5}).encode()]
    texts += [bytes(inflate(read_bytes(str(p)))) for p in sorted(corpus.glob("pytorch-*/**/*.pt.trace.json*"))]
    decoded = []
    for k, text in enumerate(texts):
        path = tmp_path / f"{k}.pt.trace.json"
        path.write_bytes(text)
        bare = text.lstrip()[:1] == b"["
        with LocalFile(str(path)) as local:
            decoded.append(kineto_json._helped(local, bare))
        assert decoded[-1] is not None, path
        assert decoded[-1] == _whole(bytearray(text)), path
        if k < 2:       # inflated text streamed to the helpers: the synthetic trace and the first real one
            streamed = kineto_json._helped(kineto_json._Buffer(bytearray(text)), bare)
            assert streamed is not None and streamed == decoded[-1], path
    assert len(decoded[0].comms) == 31 and decoded[0].base_ns == 5 and decoded[0].devices[0].total_memory == 42
    assert any(cols.threads for cols in decoded[1:])


def test_a_failed_helper_leaves_the_decode_to_this_process(helpers, monkeypatch, tmp_path):
    """A helper that dies (or cannot start) sends nothing whole: the trace is decoded here alone,
    to the same columns."""
    from tb_gpuadvisor.input.files import LocalFile

    text = _trace([_kernel(k) for k in range(3000)])
    path = tmp_path / "w.pt.trace.json"
    path.write_bytes(text)
    monkeypatch.setattr(kineto_json, "_HELPER", "import sys; sys.stdout.write('x'); sys.exit(3)")
    with LocalFile(str(path)) as local:
        assert kineto_json._helped(local, False) is None
        assert decode(local) == _whole(bytearray(text))
