"""PyTorch traces read under the names users give them (issue 41): any ``.json[.gz]`` whose first
bytes are a Chrome trace, by path and in a logdir, grouped into sessions by run; JSON that is not a
trace refused in one line, and found out from its first 64 KiB only."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest
from synth import build_training_session, write_session
from synth_kineto import kineto_trace, write_trace
from test_plugin import PLUGIN_ROOT, make_client, make_flags, wait_for_report

from tb_gpuadvisor import service
from tb_gpuadvisor.cli import main
from tb_gpuadvisor.input import KINETO, opens_in_xprof
from tb_gpuadvisor.input.discovery import DiscoveryError, find_sessions, resolve_session
from tb_gpuadvisor.input.files import LocalFile
from tb_gpuadvisor.input.kineto import sniff as sniffing
from tb_gpuadvisor.multihost import build_report

# The names of the public traces the issue collected, as PyTorch's recipe and tools write them.
NAMES = ("trace.json", "trace1.json", "trace_3.json", "trace_optimized.json", "myconv_trace.json",
         "rank-3.json.gz", "rank0.json.gz", "sampled_rank-1.json.gz", "profile-rank0-trace.json.gz",
         "llama_7b-rank0-chrome-trace.json.gz", "train.json", "test.json.gz", "resnet_kineto.json.gz",
         "benchmark_result_1_2_trace.json.gz")
STEPS = 3


def _small() -> dict:
    return kineto_trace(steps=STEPS, kernels=3)


def _stem(name: str) -> str:
    return KINETO.stem(name)


def _one_session(path: "Path | str") -> dict:
    (session,) = build_report(find_sessions(str(path)))["sessions"]
    return session


@pytest.mark.parametrize("name", NAMES)
def test_every_name_is_read_by_path_and_as_a_run_folder(tmp_path, name):
    """A three-step synthetic trace under each name: its one session reads all three steps."""
    path = write_trace(tmp_path / "run" / name, _small())
    by_path = _one_session(path)
    assert by_path["framework"] == "pytorch" and by_path["hosts"] == [_stem(name)]
    assert by_path["errors"] == [] and by_path["steps"]["count"] == STEPS
    (ref,) = find_sessions(str(tmp_path))
    assert (ref.run, ref.session, ref.hosts) == ("run", _stem(name), (_stem(name),))
    again = resolve_session(str(tmp_path), "run", ref.session)
    assert again.host_file(_stem(name)) == str(path)
    assert not opens_in_xprof(str(path))


def test_every_name_is_a_run_of_the_logdir_and_of_the_tab(tmp_path):
    """Each name in its own run folder: one run each in the CLI's search and the tab's runs list,
    and the tab's report of one of them is the trace's."""
    for index, name in enumerate(NAMES):
        write_trace(tmp_path / f"run{index:02d}" / name, _small())
    for rank in (0, 1):
        write_trace(tmp_path / "ranks" / f"rank{rank}.json.gz", _small())
    expected = [("ranks", "rank*")] + [(f"run{index:02d}", _stem(name)) for index, name in enumerate(NAMES)]
    assert [(r.run, r.session) for r in find_sessions(str(tmp_path))] == expected
    svc = service.AdvisorService([service.LogRoot("", str(tmp_path))], wait_s=20.0)
    try:
        assert [(item["run"], item["session"]) for item in svc.runs()] == expected
        report = svc.report("run05", "rank-3")
        assert report["errors"] == [] and report["hosts"] == ["rank-3"] and report["steps"]["count"] == STEPS
        both = svc.report("ranks", "rank*")
        assert both["errors"] == [] and both["hosts"] == ["rank0", "rank1"]
    finally:
        svc.close()


def test_a_bare_array_of_events_is_a_trace(tmp_path):
    """The Chrome trace format's other form (PyTorch wrote it until 2021): a JSON array of events."""
    events = _small()["traceEvents"]
    path = tmp_path / "old" / "trace.json"
    path.parent.mkdir()
    path.write_text(json.dumps(events, indent=1))
    session = _one_session(path)
    assert session["errors"] == [] and session["steps"]["count"] == STEPS
    assert [r.session for r in find_sessions(str(tmp_path))] == ["trace"]


def test_ranks_of_one_run_are_one_session_and_loose_traces_one_each(tmp_path):
    """The grouping rule of the README: files named alike but for a rank number are the hosts of
    one session (ordered by rank: rank2 before rank10); other files are sessions of their own."""
    run = tmp_path / "job"
    for rank in (0, 2, 10):
        write_trace(run / f"llama-rank{rank}-chrome-trace.json.gz", _small())
    for name in ("trace1.json", "trace_optimized.json", "rank-3.json.gz"):
        write_trace(run / name, _small())
    refs = {r.session: r.hosts for r in find_sessions(str(tmp_path))}
    assert refs == {"llama-rank*-chrome-trace": ("llama-rank0-chrome-trace", "llama-rank2-chrome-trace",
                                                 "llama-rank10-chrome-trace"),
                    "rank-3": ("rank-3",), "trace1": ("trace1",), "trace_optimized": ("trace_optimized",)}
    session = build_report(find_sessions(str(run / "llama-rank2-chrome-trace.json.gz")))["sessions"][0]
    assert session["hosts"] == ["llama-rank2-chrome-trace"]
    ranks = resolve_session(str(tmp_path), "job", "llama-rank*-chrome-trace")
    assert len(ranks.hosts) == 3


def test_ranks_named_only_by_distributed_info_are_one_session(tmp_path):
    """Kineto writes ``distributedInfo`` at a trace's top: files of distinct ranks of one world
    size are one session; two traces that both say rank 0 of 1 (single-process runs) are not."""
    run = tmp_path / "dist"
    for rank, name in ((1, "b.json"), (0, "a.json.gz")):
        write_trace(run / name, {"distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2}, **_small()})
    single = tmp_path / "single"
    for name in ("first.json", "second.json"):
        write_trace(single / name, {"distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 1}, **_small()})
    refs = [(r.run, r.session, r.hosts) for r in find_sessions(str(tmp_path))]
    assert refs == [("dist", "ranks", ("a", "b")), ("single", "first", ("first",)), ("single", "second", ("second",))]


def test_a_folder_mixing_the_handlers_files_and_loose_ones(tmp_path):
    """A handler's ``rank-0.pt.trace.json`` (session "trace", no time in its name) beside an
    exported ``trace.json``: two sessions, the second renamed so both stay addressable."""
    run = tmp_path / "mixed"
    write_trace(run / "rank-0.pt.trace.json", _small())
    write_trace(run / "trace.json", _small())
    refs = find_sessions(str(tmp_path))
    assert [(r.session, r.files) for r in refs] == [("trace", (("rank-0", "rank-0.pt.trace.json"),)),
                                                    ("trace_", (("trace", "trace.json"),))]
    assert resolve_session(str(tmp_path), "mixed", "trace_").hosts == ("trace",)


@pytest.mark.parametrize("name, data", [
    ("config.json", b'{"lr": 0.1, "layers": [64, 128]}'),
    ("metrics.json.gz", gzip.compress(b'{"loss": [1.0, 0.5]}')),
    ("events.json", b'[1, 2, 3]'),
    ("table.json", b'[["a", "b"], ["c", "d"]]'),
    ("notes.json", b"not json at all"),
    ("fake.json.gz", b"\x1f\x8b not a gzip stream"),
    ("young_fake.json.gz", b"\x1f\x8b not a gzip stream"),
])
def test_json_that_is_not_a_trace_is_refused_in_one_line_and_is_no_session(tmp_path, capsys, name, data):
    path = tmp_path / "run" / name
    path.parent.mkdir()
    path.write_bytes(data)
    if not name.startswith("young"):
        os.utime(path, (time.time() - 3600,) * 2)
    with pytest.raises(DiscoveryError, match="not a profile trace"):
        find_sessions(str(path))
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a profile trace" in err
    assert find_sessions(str(tmp_path)) == []


def test_tensorboards_own_json_is_never_a_session(tmp_path):
    """TF 2.4 wrote ``<host>.trace.json.gz`` (a Chrome trace) and ``<host>.memory_profile.json.gz``
    beside its ``.xplane.pb``; XProf writes ``.cached_tools.json``; the demo writes ``manifest.json``.
    Only the XPlane session is one."""
    space = build_training_session(steps=2).space
    folder = write_session(tmp_path, "tf_run", "2024_01_01_00_00_00", {"host": space})
    write_trace(folder / "host.trace.json.gz", _small())
    (folder / "host.memory_profile.json.gz").write_bytes(gzip.compress(b'{"memoryProfilePerAllocator": {}}'))
    write_trace(tmp_path / "tf_run" / ".cached_tools.json", _small())
    (tmp_path / "manifest.json").write_text('{"runs": []}')
    refs = find_sessions(str(tmp_path))
    assert [(r.run, r.session, r.hosts) for r in refs] == [("tf_run", "2024_01_01_00_00_00", ("host",))]
    for below in (tmp_path / "tf_run" / "plugins", folder.parent):     # the search begun inside plugins/
        assert [r.hosts for r in find_sessions(str(below))] == [("host",)]


def test_a_trace_being_written_is_listed_and_said_so_then_dropped_if_never_finished(tmp_path):
    """An export that has just begun (empty, or cut before its keys) is listed and read as being
    written; the same file 30 s later is no trace.  A trace cut after its head (its keys seen) is a
    session whose host is being written while it is young, truncated for good once old."""
    run = tmp_path / "run"
    run.mkdir()
    empty = run / "trace.json"
    empty.write_bytes(b"")
    cut = run / "rank-1.json.gz"
    whole = json.dumps(_small()).encode()
    cut.write_bytes(gzip.compress(whole)[: len(gzip.compress(whole)) // 2])
    sessions = {s["session"]: s for s in build_report(find_sessions(str(tmp_path)))["sessions"]}
    assert set(sessions) == {"trace", "rank-1"}
    for session in sessions.values():
        (error,) = session["errors"]
        assert error["being_written"] and "being written" in error["message"]
    old = time.time() - 3600
    for path in (empty, cut):
        os.utime(path, (old, old))
    (session,) = build_report(find_sessions(str(tmp_path)))["sessions"]
    assert session["session"] == "rank-1" and "truncated" in session["errors"][0]["message"]
    assert "being_written" not in session["errors"][0]


def test_judging_a_head():
    """What the first bytes decide, and when they are too few to decide."""
    judge = sniffing.judge
    assert judge(b'\xef\xbb\xbf {"traceEvents": [', complete=False)
    assert judge(b'{"schemaVersion": 1, "deviceProperties": [{"id": 0', complete=False)
    assert judge(b'[\n  {"name": "aten::mm", "ph": "X"', complete=False)
    assert judge(b'{"schemaVersion": 1, "other": "x' + b" " * 100, complete=False) is False
    assert judge(b'{"schemaVersion": 1, "deviceProp', complete=True) is None
    assert judge(b"", complete=True) is None
    assert judge(b'{"a": 1}', complete=True) is False
    assert judge(b"[1, 2", complete=True) is False


class _CountingStore:
    """An opener (the part of an fsspec filesystem a reader uses) over local files that counts the
    bytes it hands out."""

    def __init__(self) -> None:
        self.read = 0

    def info(self, path: str) -> dict:
        return {"size": os.path.getsize(path), "type": "file"}

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        with open(path, "rb") as file:
            file.seek(start or 0)
            data = file.read((end or os.path.getsize(path)) - (start or 0))
        self.read += len(data)
        return data

    def invalidate_cache(self, path: str | None = None) -> None:
        pass


def _sparse_json(path: Path, size: int) -> Path:
    """A SIZE-byte JSON-looking file that is no trace, sparse (no disk for its zeros)."""
    with open(path, "wb") as file:
        file.write(b'{"rows": [' + b" " * 100)
        file.truncate(size)
    return path


def test_sniffing_a_large_json_reads_its_head_only(tmp_path, monkeypatch):
    """A 1 GiB non-trace JSON and a gzip one inflating to 256 MiB in a logdir: discovery reads at
    most HEAD_BYTES of either (counted through the local reader and through a store), and inflates
    at most HEAD_BYTES of the gzip stream."""
    big = _sparse_json(tmp_path / "data.json", 1 << 30)
    bomb = tmp_path / "dump.json.gz"
    bomb.write_bytes(gzip.compress(b'{"rows": "' + b"x" * (256 << 20) + b'"}', compresslevel=1))
    read: list[int] = []
    real = LocalFile.read_into

    def counted(self, start: int, view: memoryview) -> None:
        read.append(len(view))
        real(self, start, view)

    monkeypatch.setattr(LocalFile, "read_into", counted)
    assert find_sessions(str(tmp_path)) == []
    assert len(read) == 2 and max(read) <= sniffing.HEAD_BYTES
    store = _CountingStore()
    for path in (big, bomb):
        assert sniffing.sniff(str(path), store).holds is False
    assert store.read <= 2 * sniffing.HEAD_BYTES
    inflated: list[int] = []
    real_inflate = sniffing._inflate_head

    def measured(stored: bytes, complete: bool):
        text, ended = real_inflate(stored, complete)
        inflated.append(len(text))
        return text, ended

    monkeypatch.setattr(sniffing, "_inflate_head", measured)
    assert sniffing.sniff(str(bomb), None).holds is False
    assert inflated == [sniffing.HEAD_BYTES]


def test_the_corpus_traces_renamed_are_read_by_path_and_as_one_run(tmp_path, corpus):
    """HTA's two ranks (corpus pytorch-hta-2ranks) renamed to ``rank-0.json.gz``/``rank-1.json.gz``
    and qwen's H100 trace inflated to ``trace.json``.  Hand check (zcat | python -c json.load): each
    HTA file holds 2 ``ProfilerStep#N`` user_annotation events (#551, #552), and qwen's one
    (#6; 49.4 ms by test_pytorch's hand check of its handler-named copy), whose "traceEvents" key
    starts 26 259 bytes in (after a metadata block), inside the sniffed head."""
    hta = tmp_path / "hta"
    hta.mkdir()
    for rank in (0, 1):
        (hta / f"rank-{rank}.json.gz").write_bytes((corpus / "pytorch-hta-2ranks" / f"rank-{rank}.pt.trace.json.gz").read_bytes())
    session = _one_session(hta)
    assert session["session"] == "rank-*" and session["hosts"] == ["rank-0", "rank-1"]
    assert session["errors"] == [] and session["steps"]["count"] == 2
    single = tmp_path / "qwen" / "trace.json"
    single.parent.mkdir()
    single.write_bytes(gzip.decompress((corpus / "pytorch-h100-qwen" / "worker0.pt.trace.json.gz").read_bytes()))
    assert single.read_bytes().index(b'"traceEvents"') == 26259
    qwen = _one_session(single)
    assert qwen["hosts"] == ["trace"] and qwen["errors"] == [] and qwen["steps"]["count"] == 1
    assert qwen["steps"]["mean_ms"] == pytest.approx(49.4, abs=0.05)


_EXPORT = """
import sys
import torch
from torch.profiler import ProfilerActivity, profile

model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
with profile(activities=[ProfilerActivity.CPU]) as prof:
    model(torch.randn(32, 64))
prof.export_chrome_trace(sys.argv[1])
"""


def test_a_real_export_chrome_trace_is_read_by_path_and_in_its_folder(tmp_path):
    """The profiler recipe's capture, made here on the CPU: one ``with profile(...)`` around the
    first call of a small MLP, then ``prof.export_chrome_trace("trace.json")``.  Hand check (from the
    raw JSON with the standard library): no ``ProfilerStep#N`` and no device events, so the trace is
    one window; its ``ph == "X"`` ``cpu_op`` events span min(ts) .. max(ts + dur), which the
    report's one window equals (29.90 ms when first run here)."""
    pytest.importorskip("torch")
    path = tmp_path / "recipe" / "trace.json"
    path.parent.mkdir()
    result = subprocess.run([sys.executable, "-c", _EXPORT, str(path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    ops = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    span_ms = (max(e["ts"] + e["dur"] for e in ops) - min(e["ts"] for e in ops)) / 1000
    assert not any(e["name"].startswith("ProfilerStep#") for e in ops)
    for found in (path, path.parent):
        session = _one_session(found)
        run = "recipe" if found == path else "."     # a folder given is its own run, "." (the CLI names it)
        assert (session["run"], session["session"], session["hosts"]) == (run, "trace", ["trace"])
        assert session["framework"] == "pytorch" and session["errors"] == []
        assert session["steps"]["count"] == 1 and session["steps"]["mean_ms"] == pytest.approx(span_ms, abs=0.01)


def test_traces_in_a_remote_logdir_are_sniffed_through_the_store():
    """The same on an fsspec store (memory://): a ``trace.json`` is a session, a ``config.json``
    beside it is not, and the trace given by URL is read."""
    fsspec = pytest.importorskip("fsspec")
    memory = fsspec.filesystem("memory")
    root = f"/names-{os.getpid()}-{time.monotonic_ns()}"
    try:
        memory.pipe(f"{root}/run/trace.json", json.dumps(_small()).encode())
        memory.pipe(f"{root}/run/config.json", b'{"lr": 0.1}')
        refs = find_sessions("memory://" + root)
        assert [(r.run, r.session, r.hosts) for r in refs] == [("run", "trace", ("trace",))]
        session = _one_session(f"memory://{root}/run/trace.json")
        assert session["errors"] == [] and session["steps"]["count"] == STEPS
        with pytest.raises(DiscoveryError, match="not a profile trace"):
            find_sessions(f"memory://{root}/run/config.json")
    finally:
        memory.rm(root, recursive=True)


def test_the_tabs_http_routes_list_and_report_loose_traces(tmp_path):
    """Through TensorBoard's own WSGI app: the plugin is active on a logdir holding only exported
    traces, its runs route lists them, and the report route (the session name "rank-*" as the
    frontend sends it, URL-encoded) answers the two ranks' report."""
    for rank in (0, 1):
        write_trace(tmp_path / "job" / f"rank-{rank}.json.gz", _small())
    write_trace(tmp_path / "notebook" / "trace.json", _small())
    client = make_client(make_flags(logdir=str(tmp_path)))
    deadline = time.monotonic() + 10
    while not json.loads(client.get("/data/plugins_listing").get_data())["gpu_advisor"]["enabled"]:
        assert time.monotonic() < deadline, "the tab never became active"
        time.sleep(0.05)
    runs = json.loads(client.get(PLUGIN_ROOT + "/runs").get_data())
    assert [(r["run"], r["session"], r["hosts"]) for r in runs] == [
        ("job", "rank-*", ["rank-0", "rank-1"]), ("notebook", "trace", ["trace"])]
    response = wait_for_report(client, PLUGIN_ROOT + "/report?" + urlencode({"run": "job", "session": "rank-*"}))
    assert response.status_code == 200
    report = json.loads(response.get_data())
    assert report["hosts"] == ["rank-0", "rank-1"] and report["errors"] == [] and report["steps"]["count"] == STEPS


def test_a_sniff_is_remembered_only_while_the_file_is_unchanged(tmp_path, monkeypatch):
    """The tab searches its logdir on every listing: an unchanged file is not opened again, and a
    JSON rewritten into a trace (new size and time) is sniffed anew and found."""
    config = tmp_path / "run" / "out.json"
    config.parent.mkdir()
    config.write_text('{"lr": 0.1}')
    os.utime(config, (time.time() - 3600,) * 2)
    opened: list[str] = []
    real = LocalFile.__init__

    def counted(self, path: str) -> None:
        opened.append(path)
        real(self, path)

    monkeypatch.setattr(LocalFile, "__init__", counted)
    assert find_sessions(str(tmp_path)) == [] and find_sessions(str(tmp_path)) == []
    assert opened == [str(config)]
    write_trace(config, _small())
    assert [r.hosts for r in find_sessions(str(tmp_path))] == [("out",)]
    assert opened == [str(config)] * 2
