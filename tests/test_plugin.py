"""The Advisor routes through TensorBoard's own WSGI app and werkzeug's test client."""

from __future__ import annotations

import argparse
import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tensorboard.backend import application
from werkzeug import test as werkzeug_test
from werkzeug import wrappers

import synth
from conftest import CORPUS
from tb_gpuadvisor import loader, plugin

SESSION = "2024_01_01_00_00_00"
BAD_SESSION = "2024_01_02_00_00_00"
PLUGIN_ROOT = "/data/plugin/gpu_advisor"


def make_flags(logdir: str = "", logdir_spec: str = "", path_prefix: str = "") -> argparse.Namespace:
    return argparse.Namespace(logdir=logdir, logdir_spec=logdir_spec, path_prefix=path_prefix,
                              samples_per_plugin={}, window_title="", generic_data="false")


def make_client(flags: argparse.Namespace) -> werkzeug_test.Client:
    app = application.TensorBoardWSGIApp(flags, [loader.GpuAdvisorLoader()])
    return werkzeug_test.Client(app, wrappers.Response)


def wait_for_report(client, url: str, timeout: float = 60.0):
    """GET until the answer is not 202 (as the frontend polls)."""
    deadline = time.monotonic() + timeout
    while True:
        response = client.get(url)
        if response.status_code != 202 or time.monotonic() > deadline:
            return response
        time.sleep(0.05)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("logdir")
    synth.build_training_session(steps=5, input_wait_frac=0.3).write(root, "train", SESSION)
    synth.write_bad_session(root, "train", BAD_SESSION, "garbage")
    outside = root.parent / (root.name + "-outside")
    synth.build_training_session(steps=2).write(outside, "secret", SESSION)
    return root


@pytest.fixture(scope="module")
def client(logdir) -> werkzeug_test.Client:
    return make_client(make_flags(logdir=str(logdir)))


def test_plugin_is_listed_with_its_tab_and_module(client):
    deadline = time.monotonic() + 10
    while True:
        listing = json.loads(client.get("/data/plugins_listing").get_data())
        if listing["gpu_advisor"]["enabled"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    entry = listing["gpu_advisor"]
    assert entry["enabled"] is True
    assert entry["tab_name"] == "Advisor"
    assert entry["loading_mechanism"] == {"type": "IFRAME", "module_path": PLUGIN_ROOT + "/index.js"}


def test_inactive_without_captures(tmp_path):
    (tmp_path / "run" / "plugins" / "profile" / "s").mkdir(parents=True)
    instance = loader.GpuAdvisorLoader().load(
        application.base_plugin.TBContext(logdir=str(tmp_path), flags=make_flags(logdir=str(tmp_path))))
    time.sleep(0.3)
    assert instance.is_active() is False


def test_runs_lists_both_sessions(client):
    response = client.get(PLUGIN_ROOT + "/runs")
    assert response.status_code == 200
    assert json.loads(response.get_data()) == [
        {"run": "train", "session": SESSION, "hosts": ["synth-host"]},
        {"run": "train", "session": BAD_SESSION, "hosts": ["bad-host"]},
    ]


def test_report_of_good_session_beside_a_corrupt_one(client):
    bad = wait_for_report(client, f"{PLUGIN_ROOT}/report?run=train&session={BAD_SESSION}")
    assert bad.status_code == 200
    bad_body = json.loads(bad.get_data())
    assert bad_body["errors"], bad_body
    good = wait_for_report(client, f"{PLUGIN_ROOT}/report?run=train&session={SESSION}")
    assert good.status_code == 200
    body = json.loads(good.get_data())
    assert body["run"] == "train" and body["session"] == SESSION
    assert body["errors"] == []
    assert body["steps"]["count"] == 5
    assert good.headers["Content-Type"].startswith("application/json")
    started = time.perf_counter()
    cached = client.get(f"{PLUGIN_ROOT}/report?run=train&session={SESSION}")
    assert time.perf_counter() - started < 0.1
    assert json.loads(cached.get_data()) == body


@pytest.mark.parametrize("query", [
    "run=../..&session=" + SESSION,
    "run=..%2F..&session=" + SESSION,
    "run=%2E%2E%2F%2E%2E&session=" + SESSION,
    "run=train&session=..%2F..%2F..%2F..",
    "run=%2Fetc&session=passwd",
    "run=/etc&session=" + SESSION,
    "run=train%2F..%2F..%2F{outside}%2Fsecret&session=" + SESSION,
    "run=train&session=" + SESSION + "&host=..%2F..%2Fx",
    "run=train&session=" + SESSION + "&host=%2Fetc%2Fpasswd",
    "run=C:%5Cwindows&session=" + SESSION,
    "run=&session=" + SESSION,
    "session=" + SESSION,
])
def test_traversal_attempts_are_rejected(client, logdir, query):
    query = query.replace("{outside}", logdir.name + "-outside")
    response = client.get(f"{PLUGIN_ROOT}/report?{query}")
    assert response.status_code == 400, response.get_data()
    assert "error" in json.loads(response.get_data())


def test_symlink_out_of_the_logdir_is_rejected(tmp_path):
    root = tmp_path / "logdir"
    root.mkdir()
    synth.build_training_session(steps=2).write(tmp_path / "outside", "secret", SESSION)
    (root / "link").symlink_to(tmp_path / "outside" / "secret")
    client = make_client(make_flags(logdir=str(root)))
    response = client.get(f"{PLUGIN_ROOT}/report?run=link&session={SESSION}")
    assert response.status_code == 400


@pytest.mark.parametrize("query", [
    "run=nope&session=" + SESSION, "run=train&session=nope",
    "run=train&session=" + SESSION + "&host=other-host",
])
def test_unknown_names_are_404(client, query):
    assert client.get(f"{PLUGIN_ROOT}/report?{query}").status_code == 404


def test_pending_report_answers_202_with_progress(logdir):
    release = threading.Event()

    def slow(ref):
        release.wait(10)
        return {"run": ref.run, "session": ref.session, "hosts": list(ref.hosts), "findings": [],
                "errors": []}

    instance = plugin.GpuAdvisorPlugin(
        application.base_plugin.TBContext(logdir=str(logdir), flags=make_flags(logdir=str(logdir))))
    instance._service._analyze = slow
    instance._service._wait_s = 0.0
    client = werkzeug_test.Client(application.TensorBoardWSGI([instance]), wrappers.Response)
    response = client.get(f"{PLUGIN_ROOT}/report?run=train&session={SESSION}")
    assert response.status_code == 202
    body = json.loads(response.get_data())
    assert body["status"] == "pending"
    assert body["progress"]["stage"] in ("queued", "analyzing")
    release.set()
    assert wait_for_report(client, f"{PLUGIN_ROOT}/report?run=train&session={SESSION}").status_code == 200


def test_concurrent_requests(client):
    urls = [f"{PLUGIN_ROOT}/report?run=train&session={SESSION}",
            f"{PLUGIN_ROOT}/report?run=train&session={BAD_SESSION}",
            f"{PLUGIN_ROOT}/runs",
            f"{PLUGIN_ROOT}/report?run=../..&session=x"] * 6

    def fetch(url):
        return url, wait_for_report(client, url).status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(fetch, urls))
    for url, status in results:
        assert status == (400 if "../.." in url else 200), url


def test_static_files_and_content_types(client):
    index = client.get(PLUGIN_ROOT + "/index.js")
    assert index.status_code == 200
    assert index.headers["Content-Type"].startswith("text/javascript")
    assert b"export async function render" in index.get_data()
    for name in ("model.js", "views.js"):
        assert client.get(f"{PLUGIN_ROOT}/{name}").headers["Content-Type"].startswith("text/javascript")
    assert client.get(PLUGIN_ROOT + "/style.css").headers["Content-Type"].startswith("text/css")
    for path in ("/__init__.py", "/../plugin.py", "/%2e%2e/plugin.py", "/..%2Fplugin.py",
                 "/frontend/index.js", "/nope.js"):
        assert client.get(PLUGIN_ROOT + path).status_code == 404, path


def test_plugin_entry_page_imports_index(client):
    page = client.get("/data/plugin_entry.html?name=gpu_advisor")
    assert page.status_code == 200
    assert b'import("./index.js")' in page.get_data()


def test_path_prefix(logdir):
    client = make_client(make_flags(logdir=str(logdir), path_prefix="/tb/x"))
    assert client.get("/tb/x" + PLUGIN_ROOT + "/index.js").status_code == 200
    response = wait_for_report(client, f"/tb/x{PLUGIN_ROOT}/report?run=train&session={SESSION}")
    assert response.status_code == 200
    assert client.get(PLUGIN_ROOT + "/runs").status_code == 404


def test_logdir_spec(logdir, tmp_path):
    second = tmp_path / "second"
    synth.build_training_session(steps=3).write(second, "eval", "s2")
    client = make_client(make_flags(logdir_spec=f"first:{logdir},second:{second}"))
    runs = json.loads(client.get(PLUGIN_ROOT + "/runs").get_data())
    assert [(r["run"], r["session"]) for r in runs] == [
        ("first/train", SESSION), ("first/train", BAD_SESSION), ("second/eval", "s2")]
    report = wait_for_report(client, f"{PLUGIN_ROOT}/report?run=second/eval&session=s2")
    assert report.status_code == 200
    assert json.loads(report.get_data())["steps"]["count"] == 3
    assert client.get(f"{PLUGIN_ROOT}/report?run=train&session={SESSION}").status_code == 404


def test_new_capture_shows_up_without_restart(tmp_path):
    client = make_client(make_flags(logdir=str(tmp_path)))
    assert json.loads(client.get(PLUGIN_ROOT + "/runs").get_data()) == []
    synth.build_training_session(steps=3).write(tmp_path, "train", SESSION)
    first = json.loads(wait_for_report(client, f"{PLUGIN_ROOT}/report?run=train&session={SESSION}").get_data())
    synth.build_training_session(steps=6).write(tmp_path, "train", SESSION)
    second = json.loads(wait_for_report(client, f"{PLUGIN_ROOT}/report?run=train&session={SESSION}").get_data())
    assert (first["steps"]["count"], second["steps"]["count"]) == (3, 6)


def test_compare_route(tmp_path):
    synth.build_training_session(steps=5, input_wait_frac=0.3).write(tmp_path, "train", SESSION)
    synth.write_bad_session(tmp_path, "train", BAD_SESSION, "garbage")
    synth.build_training_session(steps=4, input_wait_frac=0.1).write(tmp_path, "other", SESSION)
    client = make_client(make_flags(logdir=str(tmp_path)))
    url = f"{PLUGIN_ROOT}/compare?run=train&session={SESSION}&base_run=other&base_session={SESSION}"
    response = wait_for_report(client, url)
    assert response.status_code == 200
    body = json.loads(response.get_data())
    assert {"base", "new", "checks"} <= set(body)
    # Issue 26.5: a session that could not be analysed is refused, not tabled as "fixed"/"unchanged".
    url = f"{PLUGIN_ROOT}/compare?run=train&session={SESSION}&base_run=train&base_session={BAD_SESSION}"
    refused = wait_for_report(client, url)
    assert refused.status_code == 422
    assert json.loads(refused.get_data())["error"].startswith(
        f"cannot compare: the base session train / {BAD_SESSION} could not be analysed: ")
    bad = client.get(f"{PLUGIN_ROOT}/compare?run=train&session={SESSION}&base_run=..&base_session=x")
    assert bad.status_code == 400
    missing = client.get(f"{PLUGIN_ROOT}/compare?run=train&session={SESSION}&base_run=train&base_session=nope")
    assert missing.status_code == 404


@pytest.mark.skipif(not (CORPUS / "keras-cnn-rtx5000").is_dir(), reason="shared corpus not present")
def test_real_capture_first_report_under_two_seconds(tmp_path):
    source = next((CORPUS / "keras-cnn-rtx5000").glob("download128-*/train/plugins/profile/*"))
    target = tmp_path / "cnn" / "train" / "plugins" / "profile" / source.name
    target.mkdir(parents=True)
    shutil.copy(next(source.glob("*.xplane.pb")), target)
    client = make_client(make_flags(logdir=str(tmp_path)))
    url = f"{PLUGIN_ROOT}/report?run=cnn/train&session={source.name}"
    started = time.perf_counter()
    response = wait_for_report(client, url)
    elapsed = time.perf_counter() - started
    assert response.status_code == 200
    body = json.loads(response.get_data())
    assert body["steps"]["count"] > 0 and body["errors"] == []
    assert elapsed < 2.0, elapsed
    started = time.perf_counter()
    assert client.get(url).status_code == 200
    assert time.perf_counter() - started < 0.1


def test_info_says_whether_the_profile_tab_is_installed(client, monkeypatch):
    """Issue 44 item 4: the tab learns whether XProf's Profile plugin (its "profile" entry point) is
    there before drawing links into it, and what installs it."""
    from importlib import metadata as importlib_metadata

    here = json.loads(client.get(PLUGIN_ROOT + "/info").get_data())
    installed = any(e.name == "profile" for e in importlib_metadata.entry_points(group="tensorboard_plugins"))
    assert here["profile_tab"] is installed and "pip install xprof" in here["profile_install"]
    monkeypatch.setattr(plugin, "entry_points", lambda group: [])
    assert json.loads(client.get(PLUGIN_ROOT + "/info").get_data())["profile_tab"] is False


def test_timeline_route(tmp_path):
    synth.build_training_session(steps=4, input_wait_frac=0.3).write(tmp_path, "train", SESSION)
    client = make_client(make_flags(logdir=str(tmp_path)))
    response = wait_for_report(client, f"{PLUGIN_ROOT}/timeline?run=train&session={SESSION}")
    assert response.status_code == 200
    body = json.loads(response.get_data())
    marks = next(m for m in body["findings"] if m["check"] == "input_bound")
    assert marks["step_percent"] == pytest.approx(30.0, abs=1.0)
    assert client.get(f"{PLUGIN_ROOT}/timeline?run=train&session={SESSION}&step=x").status_code == 400
    assert client.get(f"{PLUGIN_ROOT}/timeline?run=train&session={SESSION}&step=999").status_code == 404
