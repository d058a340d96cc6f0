"""Remote logdirs through fsspec, with no network: the in-memory filesystem stands in for a
bucket.  The same captures are written to local disk too, and every answer (CLI, plugin) must
be the local one.  fsspec's memory filesystem is per process, so everything here runs in it."""

from __future__ import annotations

import json
import sys
import uuid

import pytest

fsspec = pytest.importorskip("fsspec")
from fsspec.implementations.memory import MemoryFileSystem  # noqa: E402

import synth  # noqa: E402
from test_plugin import PLUGIN_ROOT, make_client, make_flags, wait_for_report  # noqa: E402
from tb_gpuadvisor import service  # noqa: E402
from tb_gpuadvisor.input import discovery  # noqa: E402
from tb_gpuadvisor.cli import main  # noqa: E402
from tb_gpuadvisor.pipeline import load_session  # noqa: E402
from tb_gpuadvisor.input.session import MEMORY_BASELINE_BYTES, MEMORY_PER_CAPTURE_BYTE  # noqa: E402
from tb_gpuadvisor.input import files  # noqa: E402
from tb_gpuadvisor.input.xplane.reader import CaptureFile  # noqa: E402
from tb_gpuadvisor.input.files import CaptureError  # noqa: E402

SESSIONS = {
    ("train", "2024_01_01_00_00_00"): lambda: synth.build_training_session(steps=5, input_wait_frac=0.3).spaces,
    ("pod/multi", "2024_01_02_00_00_00"): lambda: {
        "h1": synth.build_training_session(steps=4, host="h1").space,
        "h2": synth.build_training_session(steps=4, host="h2", gpu_compute_scale={0: 1.5}, seed=1).space,
    },
    ("mixed", "2024_01_03_00_00_00"): lambda: {
        "good": synth.build_training_session(steps=4, memcpy_frac=0.3).space,
        "corrupt": synth.garbage(),
    },
}


class ListingCacheFS(MemoryFileSystem):
    """The memory store (shared with memory://) seen like s3fs and gcsfs see a bucket: listings
    are cached and answer info(), and every ranged read is recorded."""

    protocol = "cachedmem"
    reads: list[tuple[str, int | None, int | None]] = []

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(path.replace("cachedmem://", "memory://", 1))

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        if path not in self.dircache:
            self.dircache[path] = super().ls(path, detail=True)
        entries = self.dircache[path]
        return entries if detail else [entry["name"] for entry in entries]

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        cached = next((e for e in self.dircache.get(self._parent(path), []) if e["name"] == path), None)
        return cached or super().info(path, **kwargs)

    def invalidate_cache(self, path=None):
        """As s3fs and gcsfs do: everything, or PATH and the folders above it."""
        if path is None:
            self.dircache.clear()
            return
        path = self._strip_protocol(path)
        while path not in ("", "/"):
            self.dircache.pop(path, None)
            path = self._parent(path)

    def cat_file(self, path, start=None, end=None, **kwargs):
        self.reads.append((self._strip_protocol(path), start, end))
        return super().cat_file(path, start, end, **kwargs)


fsspec.register_implementation("cachedmem", ListingCacheFS, clobber=True)


def _write_memory(root: str, run: str, session: str, spaces: dict) -> None:
    memory = fsspec.filesystem("memory")
    for host, space in spaces.items():
        data = space if isinstance(space, bytes) else space.SerializeToString()
        memory.pipe(f"{root}/{run}/plugins/profile/{session}/{host}.xplane.pb", data)


@pytest.fixture
def memory_root():
    """A fresh folder of the (process-wide) memory store, removed afterwards."""
    root = f"/remote-{uuid.uuid4().hex[:8]}"
    yield root
    memory = fsspec.filesystem("memory")
    if memory.exists(root):
        memory.rm(root, recursive=True)


@pytest.fixture(scope="module")
def logdirs(tmp_path_factory):
    """(memory:// URL, local folder) holding the same sessions."""
    local = tmp_path_factory.mktemp("local")
    root = f"/remote-{uuid.uuid4().hex[:8]}"
    for (run, session), build in SESSIONS.items():
        spaces = build()
        synth.write_session(local, run, session, spaces)
        _write_memory(root, run, session, spaces)
    yield "memory://" + root, local
    fsspec.filesystem("memory").rm(root, recursive=True)


def _analyze(path: str, capsys) -> tuple[int, dict]:
    code = main(["analyze", path, "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def _findings(session: dict) -> list[tuple]:
    return [(f["check"], f["severity"], f.get("estimated_savings_ms_per_step")) for f in session["findings"]]


def test_cli_on_a_memory_logdir_reports_what_the_local_copy_does(logdirs, capsys):
    url, local = logdirs
    remote_code, remote = _analyze(url, capsys)
    local_code, here = _analyze(str(local), capsys)
    assert remote_code == local_code == 0
    assert [(s["run"], s["session"], s["hosts"]) for s in remote["sessions"]] == [
        ("mixed", "2024_01_03_00_00_00", ["good"]),        # the hosts analysed
        ("pod/multi", "2024_01_02_00_00_00", ["h1", "h2"]),
        ("train", "2024_01_01_00_00_00", ["synth-host"]),
    ]
    assert remote["sessions"] == here["sessions"]
    assert all(_findings(s) for s in remote["sessions"])


def test_corrupt_host_is_an_error_while_the_good_host_stands(logdirs, capsys):
    url, local = logdirs
    mixed = f"{url}/mixed"
    _, remote = _analyze(mixed, capsys)
    (session,) = remote["sessions"]
    assert [(e["host"], e["file"]) for e in session["errors"]] == [("corrupt", "corrupt.xplane.pb")]
    assert "XSpace" in session["errors"][0]["message"]
    good_file = local / "mixed" / "plugins" / "profile" / "2024_01_03_00_00_00" / "good.xplane.pb"
    _, good_only = _analyze(str(good_file), capsys)
    # One host of two unread makes the profile degraded; every other finding is the good host's.
    assert [f for f in _findings(session) if f[0] != "profile_quality"] == \
        [f for f in _findings(good_only["sessions"][0]) if f[0] != "profile_quality"] != []


def test_plugin_routes_serve_a_memory_logdir_like_a_local_one(logdirs):
    url, local = logdirs
    remote, here = make_client(make_flags(logdir=url)), make_client(make_flags(logdir=str(local)))
    listing = json.loads(remote.get(PLUGIN_ROOT + "/runs").get_data())
    assert listing == json.loads(here.get(PLUGIN_ROOT + "/runs").get_data())
    assert {item["run"] for item in listing} == {"train", "pod/multi", "mixed"}
    for item in listing:
        query = f"/report?run={item['run']}&session={item['session']}"
        answers = [wait_for_report(client, PLUGIN_ROOT + query) for client in (remote, here)]
        assert [a.status_code for a in answers] == [200, 200]
        assert json.loads(answers[0].get_data()) == json.loads(answers[1].get_data())
    multi = next(item for item in listing if item["run"] == "pod/multi")
    one_host = wait_for_report(remote, PLUGIN_ROOT + f"/report?run=pod/multi&session={multi['session']}&host=h2")
    assert json.loads(one_host.get_data())["hosts"] == ["h2"]


def test_rewritten_memory_file_changes_the_cache_key(memory_root):
    data = synth.build_training_session(steps=2).space.SerializeToString()
    _write_memory(memory_root, "run", "s", {"h": data})
    url = "memory://" + memory_root
    before = discovery.resolve_session(url, "run", "s").stat_key()
    assert before == discovery.resolve_session(url, "run", "s").stat_key()
    _write_memory(memory_root, "run", "s", {"h": data[::-1]})      # same size, new bytes
    after = discovery.resolve_session(url, "run", "s").stat_key()
    assert after != before and after[0][1] == before[0][1] == len(data)


def test_listings_cached_by_the_filesystem_do_not_hide_new_or_rewritten_files(memory_root):
    """s3fs and gcsfs answer from listings they cached: the plugin's Refresh must see past them."""
    url = "cachedmem://" + memory_root
    _write_memory(memory_root, "a", "s", {"h": synth.garbage(100)})
    assert [r.run for r in discovery.find_sessions(url)] == ["a"]
    key = discovery.resolve_session(url, "a", "s").stat_key()
    _write_memory(memory_root, "b", "s", {"h": synth.garbage(100)})
    _write_memory(memory_root, "a", "s", {"h": synth.garbage(200)})
    assert [r.run for r in discovery.find_sessions(url)] == ["a", "b"]
    assert discovery.resolve_session(url, "a", "s").stat_key() != key


def test_plugin_recomputes_the_report_when_a_memory_file_is_rewritten(memory_root):
    url = "memory://" + memory_root
    _write_memory(memory_root, "run", "s", synth.build_training_session(steps=3).spaces)
    svc = service.AdvisorService([service.LogRoot("", url)], wait_s=30)
    assert len(svc.report("run", "s")["steps"]["numbers"]) == 3
    _write_memory(memory_root, "run", "s", synth.build_training_session(steps=6).spaces)
    assert len(svc.report("run", "s")["steps"]["numbers"]) == 6


def test_remote_files_are_read_in_bounded_ranges(memory_root, monkeypatch):
    monkeypatch.setattr(files, "REMOTE_CHUNK_BYTES", 4096)
    data = synth.build_training_session(steps=5).space.SerializeToString()
    _write_memory(memory_root, "run", "s", {"h": data})
    fs = fsspec.filesystem("cachedmem")
    path = f"{memory_root}/run/plugins/profile/s/h.xplane.pb"
    ListingCacheFS.reads.clear()
    with CaptureFile(path, fs) as capture:
        assert bytes(capture.read((0, capture.size))) == data and capture.index.plane_spans
    spans = [(start, end) for _, start, end in ListingCacheFS.reads]
    assert len(spans) == -(-len(data) // 4096)
    assert all(end - start <= 4096 for start, end in spans)
    assert [s for s, _ in spans] == [e for _, e in [(0, 0), *spans[:-1]]] and spans[-1][1] == len(data)


class _Rewriting:
    """A filesystem whose file is rewritten (to REPLACEMENT) after the first range is read."""

    def __init__(self, replacement: bytes):
        self.fs = fsspec.filesystem("memory")
        self.replacement = replacement
        self.ranges = 0

    def info(self, path):
        return self.fs.info(path)

    def invalidate_cache(self, path=None):
        self.fs.invalidate_cache(path)

    def cat_file(self, path, start=None, end=None):
        chunk = self.fs.cat_file(path, start, end)
        self.ranges += 1
        if self.ranges == 1:
            self.fs.pipe(path, self.replacement)
        return chunk


@pytest.mark.parametrize("change", ["grows", "shrinks", "same size"])
def test_a_remote_file_changing_while_read_is_a_capture_error(memory_root, monkeypatch, change):
    monkeypatch.setattr(files, "REMOTE_CHUNK_BYTES", 4096)
    data = synth.build_training_session(steps=5).space.SerializeToString()
    path = f"{memory_root}/h.xplane.pb"
    fsspec.filesystem("memory").pipe(path, data)
    replacement = {"grows": data + data, "shrinks": data[:5000], "same size": data[::-1]}[change]
    with pytest.raises(CaptureError, match="changed while it was read"):
        CaptureFile(path, _Rewriting(replacement))


def test_remote_sizes_feed_the_memory_guard_before_anything_is_read(memory_root, tmp_path, monkeypatch):
    data = synth.build_training_session(steps=50).space.SerializeToString()
    _write_memory(memory_root, "run", "s", {"h": data})
    synth.write_session(tmp_path, "run", "s", {"h": data})
    needed = MEMORY_BASELINE_BYTES + MEMORY_PER_CAPTURE_BYTE * len(data)
    assert needed % (1 << 20)
    monkeypatch.setenv("TB_GPUADVISOR_MEMORY_LIMIT_MB", str(needed >> 20))
    ListingCacheFS.reads.clear()
    remote = load_session(discovery.resolve_session("cachedmem://" + memory_root, "run", "s"))
    here = load_session(discovery.resolve_session(str(tmp_path), "run", "s"))
    assert remote.errors == here.errors and "GiB" in remote.errors[0]["message"]
    assert ListingCacheFS.reads == []


@pytest.mark.parametrize("protocol, package", [("gs", "gcsfs"), ("s3", "s3fs")])
def test_missing_backend_is_one_line_naming_the_package(protocol, package, capsys, monkeypatch):
    if protocol in fsspec.registry:
        pytest.skip(f"{package} is loaded in this process already")
    monkeypatch.setitem(sys.modules, package, None)         # as if it were not installed
    url = f"{protocol}://bucket/logs"
    assert main(["analyze", url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"pip install {package}" in err and "Traceback" not in err

    client = make_client(make_flags(logdir=url))
    for route in ("/runs", "/report?run=train&session=s"):
        answer = client.get(PLUGIN_ROOT + route)
        assert answer.status_code == 503
        assert f"pip install {package}" in json.loads(answer.get_data())["error"]
    assert service.AdvisorService([service.LogRoot("", url)]).has_sessions()


def test_a_failing_remote_root_does_not_hide_a_working_one(logdirs, monkeypatch):
    if "s3" in fsspec.registry:
        pytest.skip("s3fs is loaded in this process already")
    monkeypatch.setitem(sys.modules, "s3fs", None)
    url, _ = logdirs
    client = make_client(make_flags(logdir_spec=f"bad:s3://bucket/logs,good:{url}"))
    listing = json.loads(client.get(PLUGIN_ROOT + "/runs").get_data())
    assert {item["run"] for item in listing} == {"good/train", "good/pod/multi", "good/mixed"}


def test_remote_run_names_are_canonical_and_stay_inside_the_logdir(memory_root):
    """A store's keys are plain strings: folders named "..", "." or "" are not ways up or aliases."""
    capture = synth.garbage(10)
    for run in ("ok", "a/b", "x/../y", "x/../../z", "q/.", "d//e"):
        _write_memory(memory_root, run, "s", {"h": capture})
    _write_memory(memory_root, "ok", "..", {"h": capture})
    memory = fsspec.filesystem("memory")
    memory.pipe(f"{memory_root}-sibling/run/plugins/profile/s/h.xplane.pb", capture)
    try:
        refs = discovery.find_sessions("memory://" + memory_root)
    finally:
        memory.rm(f"{memory_root}-sibling", recursive=True)
    assert [(r.run, r.session) for r in refs] == [("a/b", "s"), ("ok", "s")]
    for ref in refs:
        assert discovery.resolve_session("memory://" + memory_root, ref.run, ref.session).path == ref.path


def test_cli_names_a_remote_run_folder_as_it_names_a_local_one(logdirs, capsys):
    url, local = logdirs
    for path in (f"{url}/train", str(local / "train")):
        assert [s["run"] for s in _analyze(path, capsys)[1]["sessions"]] == ["train"]
