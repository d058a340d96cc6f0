"""AdvisorService without a web server: names, roots, pending/cached analyses."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

import synth
from tb_gpuadvisor import service

SESSION = "2024_01_01_00_00_00"


def _write(logdir: Path, run: str = "train", session: str = SESSION, **kwargs) -> Path:
    kwargs.setdefault("steps", 4)
    return synth.build_training_session(**kwargs).write(logdir, run, session)


class RecordingAnalyzer:
    """Stands in for analyze_session: counts calls and can hold them until released."""

    def __init__(self, block: bool = False) -> None:
        self.calls: list = []
        self.release = threading.Event()
        if not block:
            self.release.set()

    def __call__(self, ref) -> dict:
        self.calls.append(ref)
        assert self.release.wait(10)
        return {"run": ref.run, "session": ref.session, "hosts": list(ref.hosts),
                "stamp": ref.stat_key(), "findings": [], "errors": []}


@pytest.fixture
def svc_factory():
    made = []

    def make(roots, **kwargs):
        svc = service.AdvisorService(roots, **kwargs)
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.close()


def test_roots_from_logdir_and_logdir_spec(tmp_path):
    assert service.roots_from_flags(str(tmp_path), "") == [service.LogRoot("", str(tmp_path.resolve()))]
    spec = f"a:{tmp_path}/x,{tmp_path}/y,gs://bucket/logs,b:s3://other/logs"
    assert service.roots_from_flags("", spec) == [
        service.LogRoot("a", str(tmp_path.resolve() / "x")),
        service.LogRoot("", str(tmp_path.resolve() / "y")),
        service.LogRoot("", "gs://bucket/logs"),
        service.LogRoot("b", "s3://other/logs"),
    ]
    assert service.roots_from_flags(None, None) == []


@pytest.mark.parametrize("value", ["", "/etc", "../x", "a/../../b", "..", "a\\..\\b",
                                   "C:\\Windows", "x\x00y", "\\\\server\\share"])
def test_check_name_rejects_escapes(value):
    with pytest.raises(service.BadRequest):
        service.check_name("run", value)


@pytest.mark.parametrize("value", ["train", "exp/train", ".", "a..b"])
def test_check_name_accepts_relative_names(value):
    assert service.check_name("run", value) == value


def test_runs_lists_sessions_with_spec_prefixes(tmp_path, svc_factory):
    _write(tmp_path / "one", run="train")
    _write(tmp_path / "two", run=".", session="s2")
    svc = svc_factory(service.roots_from_flags("", f"first:{tmp_path / 'one'},second:{tmp_path / 'two'}"))
    assert svc.runs() == [
        {"run": "first/train", "session": SESSION, "hosts": ["synth-host"]},
        {"run": "second", "session": "s2", "hosts": ["synth-host"]},
    ]
    analyzer = RecordingAnalyzer()
    svc = svc_factory(service.roots_from_flags("", f"first:{tmp_path / 'one'},second:{tmp_path / 'two'}"),
                      analyze=analyzer)
    report = svc.report("first/train", SESSION)
    assert report["run"] == "first/train"
    assert analyzer.calls[0].path == str(tmp_path / "one" / "train" / "plugins" / "profile" / SESSION)
    assert svc.report("second", "s2")["session"] == "s2"
    with pytest.raises(service.NotFound):
        svc.report("third/train", SESSION)


def test_has_sessions_needs_a_capture_file(tmp_path, svc_factory):
    svc = svc_factory([service.LogRoot("", str(tmp_path))])
    (tmp_path / "train" / "plugins" / "profile" / "empty").mkdir(parents=True)
    (tmp_path / "train" / "events.out.tfevents.1").write_bytes(b"")
    assert not svc.has_sessions()
    _write(tmp_path, run="deep/er/run")
    assert svc.has_sessions()


def test_pending_then_ready_then_cached(tmp_path, svc_factory):
    _write(tmp_path)
    analyzer = RecordingAnalyzer(block=True)
    svc = svc_factory([service.LogRoot("", str(tmp_path))], analyze=analyzer, wait_s=0.0)
    first = svc.report("train", SESSION)
    assert isinstance(first, service.Pending)
    assert first.progress["stage"] in ("queued", "analyzing")
    assert 0.0 <= first.progress["fraction"] < 1.0
    assert first.progress["bytes"] > 0
    again = svc.report("train", SESSION)
    assert isinstance(again, service.Pending)
    analyzer.release.set()
    deadline = time.monotonic() + 10
    result = again
    while isinstance(result, service.Pending) and time.monotonic() < deadline:
        time.sleep(0.02)
        result = svc.report("train", SESSION)
    assert result["session"] == SESSION
    started = time.perf_counter()
    assert svc.report("train", SESSION) is result
    assert time.perf_counter() - started < 0.1
    assert len(analyzer.calls) == 1


def test_changed_or_new_capture_is_reanalyzed(tmp_path, svc_factory):
    folder = _write(tmp_path)
    analyzer = RecordingAnalyzer()
    svc = svc_factory([service.LogRoot("", str(tmp_path))], analyze=analyzer)
    before = svc.report("train", SESSION)
    host_file = folder / "synth-host.xplane.pb"
    stat = host_file.stat()
    os.utime(host_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    after = svc.report("train", SESSION)
    assert after is not before and after["stamp"] != before["stamp"]
    synth.build_training_session(steps=2, host="second-host").write(tmp_path, "train", SESSION)
    both = svc.report("train", SESSION)
    assert both["hosts"] == ["second-host", "synth-host"]
    _write(tmp_path, session="2024_02_02_00_00_00")
    assert [item["session"] for item in svc.runs()] == [SESSION, "2024_02_02_00_00_00"]
    assert svc.report("train", "2024_02_02_00_00_00")["session"] == "2024_02_02_00_00_00"
    assert len(analyzer.calls) == 4


def test_host_selection(tmp_path, svc_factory):
    _write(tmp_path, host="h1")
    synth.build_training_session(steps=2, host="h2").write(tmp_path, "train", SESSION)
    analyzer = RecordingAnalyzer()
    svc = svc_factory([service.LogRoot("", str(tmp_path))], analyze=analyzer)
    assert svc.report("train", SESSION, "h2")["hosts"] == ["h2"]
    assert svc.report("train", SESSION)["hosts"] == ["h1", "h2"]
    with pytest.raises(service.NotFound):
        svc.report("train", SESSION, "h3")
    with pytest.raises(service.BadRequest):
        svc.report("train", SESSION, "../h1")


@pytest.mark.parametrize("run,session", [
    ("../outside", SESSION), ("/etc", SESSION), ("train", "../../outside/plugins/profile/x"),
    ("train/../../outside", SESSION), ("escape", SESSION), ("train", "link"),
])
def test_escapes_are_rejected_and_never_read(tmp_path, svc_factory, run, session):
    logdir = tmp_path / "logdir"
    _write(logdir)
    outside = tmp_path / "outside"
    _write(outside, run=".")
    os.symlink(outside, logdir / "escape")
    os.symlink(outside / "plugins" / "profile" / SESSION, logdir / "train" / "plugins" / "profile" / "link")
    analyzer = RecordingAnalyzer()
    svc = svc_factory([service.LogRoot("", str(logdir))], analyze=analyzer)
    with pytest.raises(service.BadRequest):
        svc.report(run, session)
    assert analyzer.calls == []


def test_unknown_names_are_not_found(tmp_path, svc_factory):
    _write(tmp_path)
    svc = svc_factory([service.LogRoot("", str(tmp_path))], analyze=RecordingAnalyzer())
    for run, session in [("nope", SESSION), ("train", "nope"), ("train/plugins", SESSION)]:
        with pytest.raises(service.NotFound):
            svc.report(run, session)


def test_analyzer_crash_becomes_an_error_entry(tmp_path, svc_factory):
    _write(tmp_path)

    def broken(ref):
        raise RuntimeError("boom")

    svc = svc_factory([service.LogRoot("", str(tmp_path))], analyze=broken)
    report = svc.report("train", SESSION)
    assert report["findings"] == []
    assert "boom" in report["errors"][0]["message"]


def test_real_analysis_of_good_and_corrupt_sessions(tmp_path, svc_factory):
    _write(tmp_path, steps=6, input_wait_frac=0.3)
    synth.write_bad_session(tmp_path, "train", "2024_01_03_00_00_00", "garbage")
    svc = svc_factory([service.LogRoot("", str(tmp_path))], wait_s=10.0)
    bad = svc.report("train", "2024_01_03_00_00_00")
    good = svc.report("train", SESSION)
    assert bad["errors"] and bad["session"] == "2024_01_03_00_00_00"
    assert not good["errors"]
    assert good["steps"]["count"] == 6
    assert len(good["breakdown"]["steps"]) == 6


def test_memory_the_analysis_freed_goes_back_after_each_one(tmp_path, svc_factory, monkeypatch):
    """TensorBoard's process outlives every analysis: the real analyzer hands the memory an
    analysis freed back to the system (malloc_trim) once it is done, crashed or not."""
    from tb_gpuadvisor import heap
    trims = []
    monkeypatch.setattr(heap, "return_freed_memory", lambda: trims.append(1) or True)
    _write(tmp_path, steps=3)
    svc = svc_factory([service.LogRoot("", str(tmp_path))], wait_s=10.0)
    assert svc.report("train", SESSION)["steps"]["count"] == 3 and trims == [1]


def test_a_file_being_written_is_pending_then_read_again_never_a_cached_error(tmp_path, svc_factory, monkeypatch):
    """An analysis that met a host file the profiler is still writing (its error says being_written)
    is answered Pending ("writing", with the reason) however often it is asked, without
    re-reading it each time; once RECHECK_WRITING_S has passed, the next request reads it again
    (the file need not have changed: its mtime ages), and the complete file is the report."""
    _write(tmp_path)
    answers = [{"errors": [{"host": "h", "message": "being written: the trace ends early", "being_written": True}]},
               {"errors": [{"host": "h", "message": "being written: the trace ends early", "being_written": True}]},
               {"errors": [], "findings": ["the report"]}]
    calls = []

    def analyze(ref) -> dict:
        calls.append(ref)
        return dict(answers[len(calls) - 1], run=ref.run, session=ref.session)

    monkeypatch.setattr(service, "RECHECK_WRITING_S", 0.3)
    svc = svc_factory([service.LogRoot("", str(tmp_path))], analyze=analyze, wait_s=5.0)
    for _ in range(3):
        first = svc.report("train", SESSION)
        assert isinstance(first, service.Pending)
        assert first.progress["stage"] == "writing" and first.progress["message"] == "h: being written: the trace ends early"
    assert len(calls) == 1
    time.sleep(0.35)
    assert isinstance(svc.report("train", SESSION), service.Pending) and len(calls) == 2
    time.sleep(0.35)
    assert svc.report("train", SESSION)["findings"] == ["the report"] and len(calls) == 3
    assert svc.report("train", SESSION)["findings"] == ["the report"] and len(calls) == 3   # cached once final
