"""Finding runs, sessions and hosts; refusing paths that escape the logdir."""

from __future__ import annotations

import pytest
from synth import build_training_session, write_session

from tb_gpuadvisor.input.discovery import DiscoveryError, UnsafePathError, find_sessions, resolve_session


@pytest.fixture
def logdir(tmp_path):
    space = build_training_session(steps=2).space
    write_session(tmp_path, "exp1/train", "2024_01_01_00_00_00", {"hostA": space, "hostB": space})
    cache = write_session(tmp_path, "exp2", "2024_01_02_00_00_00", {"w0": space})
    write_session(tmp_path, ".", "2024_01_03_00_00_00", {"root": space})
    (cache / "w0.trace_viewer.pb").write_bytes(b"cache")          # XProf caches are ignored
    (cache / "w0.overview_page.pb").write_bytes(b"cache")
    return tmp_path


def test_finds_runs_at_any_depth_with_their_hosts(logdir):
    found = {(r.run, r.session): r.hosts for r in find_sessions(str(logdir))}
    assert found == {
        (".", "2024_01_03_00_00_00"): ("root",),
        ("exp1/train", "2024_01_01_00_00_00"): ("hostA", "hostB"),
        ("exp2", "2024_01_02_00_00_00"): ("w0",),
    }


def test_run_folder_session_folder_and_single_file(logdir):
    assert [r.session for r in find_sessions(str(logdir / "exp1"))] == ["2024_01_01_00_00_00"]
    session = logdir / "exp2" / "plugins" / "profile" / "2024_01_02_00_00_00"
    (ref,) = find_sessions(str(session))
    assert (ref.run, ref.session, ref.hosts) == ("exp2", "2024_01_02_00_00_00", ("w0",))
    (single,) = find_sessions(str(session / "w0.xplane.pb"))
    assert single.hosts == ("w0",) and single.host_file("w0").endswith("w0.xplane.pb")


def test_empty_logdir_and_bad_paths(tmp_path):
    assert find_sessions(str(tmp_path)) == []
    with pytest.raises(DiscoveryError, match="no such file"):
        find_sessions(str(tmp_path / "missing"))
    other = tmp_path / "notes.txt"
    other.write_text("x")
    with pytest.raises(DiscoveryError, match="not a profile capture"):
        find_sessions(str(other))


def test_resolve_session(logdir):
    ref = resolve_session(str(logdir), "exp1/train", "2024_01_01_00_00_00")
    assert ref.hosts == ("hostA", "hostB")
    with pytest.raises(LookupError):
        resolve_session(str(logdir), "exp1/train", "2099_01_01_00_00_00")
    with pytest.raises(LookupError):
        resolve_session(str(logdir), "nope", "2024_01_01_00_00_00")


@pytest.mark.parametrize("run,session", [
    ("../..", "2024_01_01_00_00_00"), ("exp1/../../x", "s"), ("/etc", "s"), ("exp2", "../exp2"),
    ("exp2", "a/b"), ("C:\\x", "s"), ("exp2", ""), ("gs://bucket", "s"), ("exp2\x00", "s"),
])
def test_escape_attempts_are_refused_before_any_read(logdir, run, session):
    with pytest.raises(UnsafePathError):
        resolve_session(str(logdir), run, session)


def test_symlink_out_of_the_logdir_is_refused(logdir, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    write_session(outside, "secret", "s1", {"h": build_training_session(steps=2).space})
    (logdir / "link").symlink_to(outside / "secret")
    with pytest.raises(UnsafePathError):
        resolve_session(str(logdir), "link", "s1")


def test_fsspec_memory_filesystem():
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    data = build_training_session(steps=2).space.SerializeToString()
    fs.pipe("/logs/run1/plugins/profile/s1/h1.xplane.pb", data)
    fs.pipe("/logs/run1/plugins/profile/s1/h1.overview_page.pb", b"cache")
    (ref,) = find_sessions("memory://logs")
    assert (ref.run, ref.session, ref.hosts) == ("run1", "s1", ("h1",))
    assert resolve_session("memory://logs", "run1", "s1").hosts == ("h1",)
    from tb_gpuadvisor.pipeline import load_session
    model = load_session(ref)
    assert not model.errors and len(model.steps) == 2
