"""The Advisor tab in a real browser: Debian's chromium driven by Playwright,
against a real `tensorboard` process serving synthetic and real captures.

Skips when /usr/bin/chromium or Playwright is missing (CI installs both).
Screenshots of every state are saved under the test's tmp dir.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

import synth
from conftest import CORPUS

CHROMIUM = "/usr/bin/chromium"
# A CPU-only run, named to sort after the others (the tab opens the first run).
CPU_RUN = "z-cpu-only"
# A PyTorch run (torch.profiler's tensorboard_trace_handler files sit in the run folder itself).
PYTORCH_RUN = "pytorch-resnet50"
# Its session: months before the others, so it is never the closest base in time.
CPU_SESSION = "2023_06_01_00_00_00"
MALICIOUS = "<img src=x onerror=alert(1)>&amp;"
GOOD = "2024_01_01_00_00_00"
BETTER = "2024_01_05_00_00_00"
BROKEN = "2024_01_09_00_00_00"
# A session of another run, closer in time to GOOD than any other session of "train".
VALIDATION = "2024_01_01_06_00_00"
# Runs for the step timeline, named to sort after the others: steps inferred from repeated
# function runs (no step markers), and a session of two hosts.
INFERRED_RUN = "zz-inferred"
TWO_HOSTS_RUN = "zz-two-hosts"

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium at /usr/bin/chromium")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _poison_kernel_names(space) -> None:
    """Prefix GPU kernel names with markup, as C++ template names carry < > &."""
    for plane in space.planes:
        if plane.name.startswith("/device:GPU"):
            for meta in plane.event_metadata.values():
                if meta.name and not meta.name.startswith("Memcpy"):
                    meta.name = MALICIOUS + meta.name


def _build_logdir(root: Path) -> Path:
    logdir = root / "logdir"
    slow = synth.build_training_session(steps=8, gpus=2, input_wait_frac=0.3, launch_frac=0.08,
                                        host_overhead_frac=0.05, gpu_compute_scale={1: 0.6},
                                        memcpy_frac=0.06, step_ms=25.0)
    _poison_kernel_names(slow.space)
    slow.write(logdir, "train", GOOD)
    synth.build_training_session(steps=8, gpus=2, input_wait_frac=0.02, step_ms=15.0).write(
        logdir, "train", BETTER)
    synth.build_training_session(steps=4).write(logdir, "train", MALICIOUS)
    synth.write_bad_session(logdir, "train", BROKEN, "garbage")
    synth.build_training_session(steps=4, step_ms=20.0).write(logdir, "validation", VALIDATION)
    synth.build_training_session(steps=4, gpus=0, marker="r", input_wait_frac=0.2,
                                 host_overhead_frac=0.2).write(logdir, CPU_RUN, CPU_SESSION)
    synth.build_training_session(steps=6, framework="jax", marker="none", launch_frac=0.3,
                                 kernel_us=15).write(logdir, INFERRED_RUN, GOOD)
    for host, scale in (("w0", None), ("w1", {1: 1.3})):
        synth.build_training_session(steps=5, gpus=2, cc=(8, 0), collective_frac=0.1, allreduce_calls=2,
                                     gpu_compute_scale=scale, host=host).write(logdir, TWO_HOSTS_RUN, GOOD)
    torch_trace = CORPUS / "pytorch-resnet50-dataloader" / "num_workers_0" / "worker0.pt.trace.json.gz"
    if torch_trace.is_file():
        (logdir / PYTORCH_RUN).mkdir(parents=True)
        shutil.copy(torch_trace, logdir / PYTORCH_RUN)
    sources = sorted((CORPUS / "keras-cnn-rtx5000").glob("download8-*/train/plugins/profile/*"))
    if sources:
        target = logdir / "rtx5000" / "plugins" / "profile" / sources[0].name
        target.mkdir(parents=True)
        shutil.copy(next(sources[0].glob("*.xplane.pb")), target)
    return logdir


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real tensorboard process on 127.0.0.1 (the venv's, with this package installed)."""
    root = tmp_path_factory.mktemp("browser")
    logdir = _build_logdir(root)
    port = _free_port()
    tensorboard = Path(sys.executable).with_name("tensorboard")
    log = open(root / "tensorboard.log", "wb")
    process = subprocess.Popen(
        [str(tensorboard), "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port),
         "--path_prefix", "/tb"],
        stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/tb"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(base + "/data/plugins_listing", timeout=5) as response:
                    listing = json.load(response)
                if listing.get("gpu_advisor", {}).get("enabled"):
                    break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail("tensorboard did not serve the Advisor tab:\n" +
                            (root / "tensorboard.log").read_text(errors="replace")[-3000:])
            time.sleep(0.3)
        yield {"base": base, "root": root, "real": (logdir / "rtx5000").is_dir()}
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        instance = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run"])
        yield instance
        instance.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    page = context.new_page()
    page.dialogs = []
    page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))
    yield page
    context.close()


def _advisor(page, server):
    """Opens the Advisor tab and returns its iframe."""
    page.goto(server["base"] + "/#gpu_advisor")
    iframe = page.wait_for_selector('iframe[src*="plugin_entry.html?name=gpu_advisor"]', timeout=60000)
    frame = iframe.content_frame()
    frame.wait_for_selector(".advisor", timeout=30000)
    return frame


def _select_session(frame, run: str, session: str) -> None:
    frame.select_option("[data-testid=run-select]", run)
    frame.select_option("[data-testid=session-select]", session)


def _expand_all(frame) -> None:
    """Opens the passed-checks list and every finding, as a user clicking through would."""
    if frame.locator("details.passed > summary").count():
        frame.click("details.passed > summary")
    toggles = frame.locator("button.finding-toggle")
    for index in range(toggles.count()):
        if toggles.nth(index).get_attribute("aria-expanded") == "false":
            toggles.nth(index).click()


def _shot(page, server, name: str, target=None) -> None:
    """Screenshot of the page, with `target` (a locator in the iframe) scrolled to the top."""
    if target is not None:
        target.evaluate("node => node.scrollIntoView({block: 'start'})")
    page.screenshot(path=str(server["root"] / f"{name}.png"))


def test_report_findings_chart_and_fix(page, server):
    frame = _advisor(page, server)
    assert page.get_by_text("Advisor", exact=False).first.is_visible()
    _select_session(frame, "train", GOOD)
    frame.wait_for_selector("[data-testid=step-chart]", timeout=30000)
    _shot(page, server, "1-report")
    bars = frame.locator("[data-testid=step-chart] g.step-bar")
    assert bars.count() == 8
    assert frame.locator("[data-testid=device-chart] g.gpu-bar").count() == 2
    assert frame.locator("[data-testid=device-chart] g.gpu-bar.straggler").count() == 1
    assert "20" in frame.locator("[data-testid=step-mean]").inner_text() or \
        "25" in frame.locator("[data-testid=step-mean]").inner_text()
    findings = frame.locator("[data-testid=findings] > li.finding")
    assert findings.count() >= 1, "no actionable findings rendered"
    severities = {findings.nth(i).get_attribute("data-severity") for i in range(findings.count())}
    assert severities <= {"critical", "warning", "info"}
    assert frame.locator("[data-testid=findings] .badge.sev-critical").count() >= 1
    # The first finding starts open; collapse it with the keyboard and open the second.
    first_toggle = findings.nth(0).locator("button.finding-toggle")
    assert first_toggle.get_attribute("aria-expanded") == "true"
    first_toggle.focus()
    page.keyboard.press("Enter")
    assert first_toggle.get_attribute("aria-expanded") == "false"
    assert findings.nth(0).locator(".finding-body").is_hidden()
    page.keyboard.press("Enter")
    body = findings.nth(0).locator(".finding-body")
    assert body.is_visible()
    assert body.locator(".fixes li.fix").count() >= 1
    _shot(page, server, "2-finding-expanded", findings.nth(0))
    assert body.locator(".code").count() >= 1      # the top finding (input_bound) fixes in code
    body.locator("button.copy").first.click()
    # The label changes once the (asynchronous) clipboard write has settled.
    sync_api.expect(body.locator("button.copy").first).to_have_text(re.compile(r"^(Copied|Select & copy)$"))


def test_malicious_names_render_as_text(page, server):
    frame = _advisor(page, server)
    _select_session(frame, "train", GOOD)
    frame.wait_for_selector("[data-testid=findings]", timeout=30000)
    _expand_all(frame)
    frame.select_option("[data-testid=session-select]", MALICIOUS)
    frame.wait_for_selector("[data-testid=step-chart]", timeout=30000)
    _shot(page, server, "3-malicious-session")
    options = frame.locator("[data-testid=session-select] option").all_inner_texts()
    assert MALICIOUS in options
    assert frame.locator("img").count() == 0
    assert page.locator("img[src=x]").count() == 0
    assert page.dialogs == []


def test_malicious_kernel_in_evidence_is_text(page, server):
    frame = _advisor(page, server)
    _select_session(frame, "train", GOOD)
    frame.wait_for_selector("[data-testid=findings]", timeout=30000)
    _expand_all(frame)
    names = frame.locator(".evidence td.name code").all_inner_texts()
    assert any(MALICIOUS in name for name in names), names[:10]
    assert frame.locator(".evidence img").count() == 0
    link = frame.locator(".evidence a.profile-link").first
    href = link.get_attribute("href")
    assert f"run=train%2F{GOOD}" in href and "tool=" in href and href.endswith("#profile")
    assert href.startswith(server["base"] + "/?")
    assert link.get_attribute("target") == "_parent"
    _shot(page, server, "4-evidence", frame.locator(".evidence").first)
    assert page.dialogs == []


def test_corrupt_session_shows_its_error(page, server):
    """Issue 26.6: a capture nothing could be read from shows its error and nothing invented
    (no device card, "CPU only" chip, step chart or findings)."""
    frame = _advisor(page, server)
    _select_session(frame, "train", BROKEN)
    error = frame.wait_for_selector("[data-testid=report-errors]", timeout=30000)
    assert "XSpace" in error.inner_text() or "bad-host" in error.inner_text()
    assert error.inner_text().startswith("This capture could not be read:")
    assert frame.locator("[data-testid=unread-note]").is_visible()
    content = frame.locator("main.content").inner_text()
    for invented in ("Devices", "CPU only", "Step time", "Findings", "Mark each training step", "Fix first"):
        assert invented not in content, (invented, content)
    assert frame.locator("[data-testid=step-chart], .summary, section.findings").count() == 0
    _shot(page, server, "5-corrupt")
    frame.select_option("[data-testid=session-select]", GOOD)
    frame.wait_for_selector("[data-testid=step-chart]", timeout=30000)
    assert frame.locator("[data-testid=report-errors]").count() == 0


def _compare_tab(page, server, session: str):
    """The Advisor tab on train/SESSION with its Compare view opened."""
    frame = _advisor(page, server)
    _select_session(frame, "train", session)
    frame.wait_for_selector("[data-testid=step-chart]", timeout=30000)
    frame.click("#tab-compare")
    return frame


def test_compare_view(page, server):
    frame = _compare_tab(page, server, BETTER)
    frame.select_option("[data-testid=base-select]", f"train\u0000{GOOD}")
    compare = frame.wait_for_selector("[data-testid=compare]", timeout=30000)
    delta = frame.locator("[data-testid=step-delta]").inner_text()
    assert delta.startswith("-") or delta.startswith("−"), delta
    statuses = frame.locator(".compare-table tbody tr").evaluate_all(
        "rows => rows.map(r => r.dataset.status)")
    assert set(statuses) & {"fixed", "better"}, statuses
    assert compare.is_visible()
    _shot(page, server, "6-compare")


def test_compare_on_a_runs_first_session_has_nothing_to_compare_yet(page, server):
    """Issue 35.6: GOOD is the first session of "train". Compare picks no other run's session by
    itself (the closest in time, VALIDATION, is another run's): it says there is nothing to compare
    yet. Picking VALIDATION by hand compares and says the base is another run's; a base of the
    same run drops the note."""
    frame = _compare_tab(page, server, GOOD)
    empty = frame.wait_for_selector("[data-testid=nothing-to-compare]", timeout=30000)
    assert "Nothing to compare yet" in empty.inner_text() and GOOD in empty.inner_text()
    assert frame.locator("[data-testid=base-select]").input_value() == ""
    assert frame.locator("[data-testid=compare]").count() == 0
    _shot(page, server, "6b-compare-nothing-yet")
    frame.select_option("[data-testid=base-select]", f"validation\u0000{VALIDATION}")
    frame.wait_for_selector("[data-testid=compare]", timeout=30000)
    note = frame.locator("[data-testid=base-note]").inner_text()
    assert f"validation / {VALIDATION}" in note and "another run" in note, note
    frame.select_option("[data-testid=base-select]", f"train\u0000{BETTER}")
    frame.wait_for_selector("[data-testid=compare]", timeout=30000)
    assert frame.locator("[data-testid=base-note]").count() == 0


def test_compare_defaults_to_the_runs_previous_session(page, server):
    frame = _compare_tab(page, server, BETTER)
    frame.wait_for_selector("[data-testid=compare]", timeout=30000)
    assert frame.locator("[data-testid=base-select]").input_value() == f"train\u0000{GOOD}"
    assert frame.locator("[data-testid=base-note]").count() == 0


def test_compare_skips_an_unreadable_previous_session_and_stops_offering_it(page, server):
    """Issue 44 item 6: the session before MALICIOUS in "train" is BROKEN (sessions sort by name,
    "<" after the dates). Compare opens on the one before it, BETTER, with no error, and BROKEN is no
    longer among the bases offered."""
    frame = _advisor(page, server)
    _select_session(frame, "train", MALICIOUS)
    frame.wait_for_selector("[data-testid=findings]", timeout=30000)
    frame.click("#tab-compare")
    frame.wait_for_selector("[data-testid=compare]", timeout=30000)
    assert frame.locator("[data-testid=base-select]").input_value() == f"train\u0000{BETTER}"
    assert frame.locator(".compare-bar ~ [role=alert]").count() == 0
    offered = frame.locator("[data-testid=base-select] option").evaluate_all("(options) => options.map((o) => o.value)")
    assert f"train\u0000{BROKEN}" not in offered and f"train\u0000{GOOD}" in offered


def test_compare_refuses_a_session_that_could_not_be_analysed(page, server):
    """Issue 26.5: the broken capture as a base gives one error line, no table of invented changes."""
    frame = _compare_tab(page, server, BETTER)
    frame.select_option("[data-testid=base-select]", f"train\u0000{BROKEN}")
    error = frame.wait_for_selector(".compare-bar ~ [role=alert]", timeout=30000)
    text = error.inner_text()
    assert text.startswith("Cannot compare:") and f"train / {BROKEN} could not be analysed" in text, text
    assert "cannot compare:" not in text.lower()[len("Cannot compare:"):], text     # said once
    assert frame.locator("[data-testid=compare], .compare-table").count() == 0
    _shot(page, server, "6c-compare-refused")


def test_real_capture(page, server):
    if not server["real"]:
        pytest.skip("shared corpus not present")
    frame = _advisor(page, server)
    frame.select_option("[data-testid=run-select]", "rtx5000")
    frame.wait_for_selector("[data-testid=step-chart]", timeout=60000)
    assert frame.locator("[data-testid=step-chart] g.step-bar").count() >= 10
    assert frame.locator("[data-testid=report-errors]").count() == 0
    _shot(page, server, "7-real-capture")


def test_without_the_profile_tab_the_links_say_what_to_install(page, server):
    """Issue 44 item 4: a TensorBoard without XProf (the Advisor's /info says so) gets no link into a
    Profile tab it lacks: each evidence row says there is none, and a note says what to install."""
    page.route("**/data/plugin/gpu_advisor/info*", lambda route: route.fulfill(
        content_type="application/json",
        body=json.dumps({"profile_tab": False, "profile_install": "pip install xprof"})))
    frame = _advisor(page, server)
    _select_session(frame, "train", GOOD)
    frame.wait_for_selector("[data-testid=findings] [data-testid=profile-missing]", timeout=30000)
    assert frame.locator("[data-testid=findings] a.profile-link, [data-testid=findings] a.range-link").count() == 0
    note = frame.locator("[data-testid=profile-missing-note]").first.inner_text()
    assert "pip install xprof" in note, note


def test_deep_link_opens_profile_tab_in_parent_page(page, server):
    frame = _advisor(page, server)
    _select_session(frame, "train", GOOD)
    frame.wait_for_selector("[data-testid=findings] .profile-link", timeout=30000)
    link = frame.locator("[data-testid=findings] .profile-link").first
    expected = link.get_attribute("href")
    link.click()
    page.wait_for_url("**#profile", timeout=30000)
    assert page.url == expected
    assert page.url.startswith(server["base"] + "/?run=train%2F" + GOOD)
    page.wait_for_timeout(3000)
    _shot(page, server, "8-profile-deep-link")


def test_pending_report_shows_progress_then_the_report(page, server):
    """The first answers are held as 202s (as for a large capture): the tab shows progress and polls."""
    pending = {"status": "pending",
               "progress": {"stage": "analyzing", "fraction": 0.4, "bytes": 8 << 20, "elapsed_s": 1.2}}
    held = {"count": 0}

    def hold_twice(route):
        if held["count"] < 2 and f"session={BETTER}" in route.request.url:
            held["count"] += 1
            route.fulfill(status=202, content_type="application/json", body=json.dumps(pending))
        else:
            route.continue_()

    page.route("**/data/plugin/gpu_advisor/report?*", hold_twice)
    frame = _advisor(page, server)
    _select_session(frame, "train", BETTER)
    frame.wait_for_selector("progress", timeout=30000)
    status = frame.locator("[role=status]").inner_text()
    assert "Analyzing" in status and "40 %" in status
    _shot(page, server, "9-pending")
    frame.wait_for_selector("[data-testid=step-chart]", timeout=30000)
    assert held["count"] == 2


def test_trace_viewer_links_carry_the_view_range(page, server):
    """Issue 26.3, against the installed XProf (2.24.2): its Profile tab drops view_start/view_end, so
    those links carry none and a note says so; the "at this time" link opens XProf's trace viewer page,
    which reads the range from its own URL. Checked in the browser: the viewer's first data request
    asks for the range (with its margin), and the step the evidence names lies inside it on XProf's
    clock (the report's times plus time_origin_ms: the synthetic capture starts at 1.5 ms)."""
    frame = _advisor(page, server)
    _select_session(frame, "train", GOOD)
    frame.wait_for_selector("[data-testid=findings]", timeout=30000)
    _expand_all(frame)
    profile = frame.locator('.evidence a.profile-link[data-tool="trace_viewer"]').evaluate_all(
        "links => links.map(a => a.href)")
    assert profile and not [href for href in profile if "view_start" in href], profile[:3]
    rows = frame.locator(".evidence tr:has(a.range-link)")
    assert rows.count(), "no evidence row links a time range"
    assert frame.locator("[data-testid=range-note]").first.is_visible()
    step_row = rows.filter(has_text=re.compile(r"^step \d+$"))
    name = (step_row.first if step_row.count() else rows.first).locator("td.name code").inner_text()
    href = (step_row.first if step_row.count() else rows.first).locator("a.range-link").get_attribute("href")
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(href).query)
    start, end = float(query["view_start"][0]), float(query["view_end"][0])
    assert end > start >= 1.5
    assert href.startswith(server["base"] + "/data/plugin/profile/trace_viewer_index.html?")
    viewer = page.context.new_page()
    with viewer.expect_response(lambda r: "/data/plugin/profile/data?" in r.url and "start_time_ms" in r.url,
                                timeout=60000) as answer:
        viewer.goto(href)
    response = answer.value
    asked = urllib.parse.parse_qs(urllib.parse.urlsplit(response.url).query)
    lo, hi = float(asked["start_time_ms"][0]), float(asked["end_time_ms"][0])
    assert lo <= start and hi >= end and hi - lo <= 3 * (end - start) + 1e-6, (lo, hi, start, end)
    if name.startswith("step "):
        number = name.split()[1]
        events = [e for e in response.json()["traceEvents"] if e.get("name") == number and "ts" in e]
        assert events and any(start <= e["ts"] / 1000 <= end for e in events), (start, end, events[:3])
    viewer.wait_for_timeout(2000)
    viewer.screenshot(path=str(server["root"] / "11-trace-viewer-range.png"))
    viewer.close()


def test_input_pipeline_link_analyses_its_host(page, server):
    """Issue 26.3, against the installed XProf (2.24.2): the input pipeline link opens XProf's page for
    the capture's host (its data request names it). In a logdir with several sessions XProf leaves
    that page's Hosts list blank whatever the link says (checked: with host, host and hosts, or no
    host; a one-session logdir shows it), so the note next to the link says so."""
    frame = _advisor(page, server)
    _select_session(frame, "train", GOOD)
    frame.wait_for_selector("[data-testid=findings]", timeout=30000)
    _expand_all(frame)
    links = frame.locator('.evidence a.profile-link[data-tool="input_pipeline_analyzer"]')
    assert links.count(), "the input-bound session links no input pipeline page"
    assert "Hosts list blank" in frame.locator("[data-testid=input-pipeline-note]").first.inner_text()
    href = links.first.get_attribute("href")
    fresh = page.context.new_page()
    with fresh.expect_request(lambda r: "/data/plugin/profile/data?" in r.url and "input_pipeline_analyzer" in r.url,
                              timeout=60000) as asked:
        fresh.goto(href)
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(asked.value.url).query)
    assert query["host"] == ["synth-host"] and query["run"] == [f"train/{GOOD}"], query
    fresh.close()


def test_back_after_a_deep_link_returns_to_the_advisor(page, server):
    frame = _advisor(page, server)
    _select_session(frame, "train", GOOD)
    frame.wait_for_selector("[data-testid=findings] .profile-link", timeout=30000)
    frame.locator("[data-testid=findings] .profile-link").first.click()
    page.wait_for_url("**#profile", timeout=30000)
    page.go_back()
    page.wait_for_url("**#gpu_advisor", timeout=30000)
    iframe = page.wait_for_selector('iframe[src*="plugin_entry.html?name=gpu_advisor"]', timeout=60000)
    back = iframe.content_frame()
    back.wait_for_selector("[data-testid=findings]", timeout=30000)
    assert back.locator("[data-testid=session-select]").input_value() == GOOD


def test_selection_is_kept_in_the_url(page, server):
    frame = _advisor(page, server)
    _select_session(frame, "train", BETTER)
    frame.click("#tab-compare")
    frame.wait_for_selector("[data-testid=compare]", timeout=30000)
    assert f"advisor_session={BETTER}" in page.url and "advisor_view=compare" in page.url, page.url
    # The Compare base defaults to the previous session of the same run.
    assert frame.locator("[data-testid=base-select]").input_value() == f"train\u0000{GOOD}"
    shared = page.url
    other = page.context.new_page()
    other.goto(shared)
    iframe = other.wait_for_selector('iframe[src*="plugin_entry.html?name=gpu_advisor"]', timeout=60000)
    opened = iframe.content_frame()
    opened.wait_for_selector("[data-testid=compare]", timeout=30000)
    assert opened.locator("[data-testid=session-select]").input_value() == BETTER
    other.close()


def test_labels_name_checks_and_units(page, server):
    frame = _advisor(page, server)
    _select_session(frame, "train", BETTER)
    frame.wait_for_selector("[data-testid=step-chart]", timeout=30000)
    frame.click("details.passed > summary")
    passed = frame.locator("details.passed li.finding .check-id").all_inner_texts()
    # BETTER's two GPUs are balanced and start together: both replica checks pass.
    assert {"launch_skew", "multi_gpu_imbalance"} <= set(passed), passed
    assert all(passed), passed
    frame.click("#tab-compare")
    frame.select_option("[data-testid=base-select]", f"train\u0000{GOOD}")
    frame.wait_for_selector("[data-testid=compare]", timeout=30000)
    _shot(page, server, "10-compare-labels")
    names = frame.locator(".compare-table .check-name").all_inner_texts()
    assert "Multi-GPU load imbalance" in names and "Multi gpu imbalance" not in names, names
    text = frame.locator(".compare-table").inner_text()
    assert "ms/step" in text and "Ratio" not in text and "ratio" not in text, text
    assert frame.locator("[data-testid=noise-band]").is_visible()


def test_category_list_and_confidence_from_the_report(page, server):
    """Bars follow `breakdown.categories` when the report has it; confidence is shown when given."""
    def with_categories(route):
        response = route.fetch()
        report = response.json()
        if response.status == 200 and report.get("breakdown"):
            report["breakdown"]["categories"] = [
                {"key": "tc_fp32", "label": "FP32 on Tensor-Core-eligible ops", "group": "compute"},
                {"key": "input_wait", "label": "Waiting for input", "group": "input"}]
            for row in report["breakdown"]["steps"]:
                row.update(tc_fp32_ms=10.0, input_wait_ms=5.0)
            report["findings"][0].update(confidence="low", confidence_reasons=["only 8 steps"])
        route.fulfill(response=response, body=json.dumps(report))

    page.route("**/data/plugin/gpu_advisor/report?*", with_categories)
    frame = _advisor(page, server)
    _select_session(frame, "train", GOOD)
    frame.wait_for_selector("[data-testid=step-chart]", timeout=30000)
    legend = frame.locator("[data-testid=step-chart] .legend").inner_text()
    assert "FP32 on Tensor-Core-eligible ops" in legend and "Kernel launch" not in legend, legend
    assert frame.locator("[data-testid=step-chart] g.step-bar").first.locator("rect.seg").count() == 2
    assert "only 8 steps" in frame.locator("[data-testid=confidence]").first.inner_text()


def _legend(frame) -> list[dict]:
    """The step chart's legend: per entry its group, its labels and each swatch's colour."""
    return frame.locator("[data-testid=step-chart] .legend > li").evaluate_all(
        """items => items.map(li => ({group: li.dataset.group, text: li.innerText,
            colours: [...li.querySelectorAll('.swatch')].map(s => getComputedStyle(s).backgroundColor)}))""")


def test_legend_lists_the_runs_categories_grouped_each_in_its_own_colour(page, server):
    frame = _advisor(page, server)
    _select_session(frame, "train", GOOD)
    frame.wait_for_selector("[data-testid=step-chart] .legend", timeout=30000)
    _shot(page, server, "11-legend-gpu", frame.locator("[data-testid=step-chart]"))
    entries = _legend(frame)
    colours = [c for e in entries for c in e["colours"]]
    assert len(colours) == len(set(colours)), entries          # no two categories alike
    groups = [e["group"] for e in entries]
    assert len(groups) == len(set(groups)), groups              # one entry per group, in breakdown order
    compute = next(e for e in entries if e["group"] == "compute")
    assert compute["text"].startswith("Compute:") and len(compute["colours"]) >= 2, compute
    # Only categories this run has: GOOD plants no collectives wait and nothing untraced.
    text = " ".join(e["text"] for e in entries)
    assert "not traced" not in text and "waiting for the slowest replica" not in text, text
    # Every bar segment uses a colour of the legend.
    fills = set(frame.locator("[data-testid=step-chart] rect.seg").evaluate_all(
        "rects => rects.map(r => getComputedStyle(r).fill)"))
    assert fills <= set(colours), (fills, colours)


def test_cpu_only_legend_has_no_gpu_categories(page, server):
    frame = _advisor(page, server)
    _select_session(frame, CPU_RUN, CPU_SESSION)
    frame.wait_for_selector("[data-testid=step-chart] .legend", timeout=30000)
    _shot(page, server, "12-legend-cpu", frame.locator("[data-testid=step-chart]"))
    text = " ".join(e["text"] for e in _legend(frame))
    for gpu_only in ("Tensor-Core", "16-bit", "collective", "copies", "launch"):
        assert gpu_only.lower() not in text.lower(), text
    assert "Compute" in text and "waiting for input" in text, text


def test_findings_keep_the_reports_order(page, server):
    """The tab shows the ranking the report gives, even one no sort by saving would give."""
    reversed_ids = []

    def reversed_actionable(route):
        response = route.fetch()
        report = response.json()
        if response.status == 200 and report.get("findings"):
            acting = [f for f in report["findings"] if f["severity"] in ("critical", "warning")]
            rest = [f for f in report["findings"] if f not in acting]
            acting.reverse()
            reversed_ids[:] = [f["check"] for f in acting]
            report["findings"] = acting + rest
        route.fulfill(response=response, body=json.dumps(report))

    page.route("**/data/plugin/gpu_advisor/report?*", reversed_actionable)
    frame = _advisor(page, server)
    _select_session(frame, "train", GOOD)
    frame.wait_for_selector("[data-testid=findings] > li.finding", timeout=30000)
    shown = frame.locator("[data-testid=findings] > li.finding").evaluate_all("items => items.map(i => i.dataset.check)")
    assert len(reversed_ids) >= 2 and shown == reversed_ids, (shown, reversed_ids)


def test_a_pytorch_run_beside_the_tf_runs_names_file_and_time_not_xprof(page, server):
    """The corpus's ResNet-50 trace with num_workers=0 (its DataLoader __next__ takes 46.6 of each
    154.8 ms step, read by hand from the raw JSON) in the same logdir as the TensorFlow runs: the
    tab lists the run, puts the DataLoader wait first with a PyTorch fix, and its evidence names
    the trace file and ms range, with no link into XProf, which cannot open Kineto JSON."""
    if not (server["root"] / "logdir" / PYTORCH_RUN).is_dir():
        pytest.skip("the PyTorch corpus trace is not present")
    frame = _advisor(page, server)
    _select_session(frame, PYTORCH_RUN, "trace")
    frame.wait_for_selector("[data-testid=findings]", timeout=60000)
    first = frame.locator("[data-testid=findings] > li").first
    assert first.get_attribute("data-check") == "input_bound", first.inner_text()[:200]
    assert "pytorch" in frame.locator(".advisor").inner_text()
    body = first.locator(".finding-body")
    assert "num_workers" in body.locator(".fixes, pre, code").all_inner_texts().__str__()
    assert "worker0.pt.trace.json.gz" in body.locator(".evidence").inner_text()
    assert frame.locator(".evidence a.profile-link, .evidence a.range-link").count() == 0
    _shot(page, server, "13-pytorch-run", first)


def test_step_axis_has_round_ticks_just_above_the_tallest_bar(page, server):
    """Issue 35.7: ticks are 1, 2 or 5 times a power of ten apart, and the axis ends at the first
    tick at or above the longest step (no 1000 ms axis for 500 ms bars, no 62.5/188 ticks)."""
    frame = _advisor(page, server)
    _select_session(frame, "train", GOOD)
    frame.wait_for_selector("[data-testid=step-chart] .legend", timeout=30000)
    labels = frame.locator("[data-testid=step-chart] svg > text.axis[text-anchor=end]").evaluate_all(
        "texts => texts.map(t => t.textContent)")
    values = [float(re.sub(r"[^0-9.]", "", label)) * (1e-3 if "µs" in label or "us" in label else 1.0)
              for label in labels]
    assert len(values) >= 3 and values[0] == 0, labels
    step = values[1] - values[0]
    assert all(abs((b - a) - step) < 1e-6 for a, b in zip(values, values[1:])), labels
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert min(abs(mantissa - m) for m in (1, 2, 5)) < 1e-6, labels
    longest = max(frame.locator("[data-testid=step-chart] g.step-bar").evaluate_all(
        "bars => bars.map(b => Number(b.querySelector('title').textContent.match(/: ([0-9.]+)/)[1]))"))
    assert values[-2] < longest <= values[-1], (labels, longest)


def test_device_legend_names_no_empty_category(page, server):
    """With no GPU spending time in collectives (zeroed in GOOD's report here), the per-GPU
    chart's legend does not list them."""
    def no_collectives(route):
        response = route.fetch()
        report = response.json()
        for device in (report.get("breakdown") or {}).get("per_device", []):
            device["collective_ms"] = 0.0
        route.fulfill(response=response, body=json.dumps(report))

    page.route("**/data/plugin/gpu_advisor/report?*", no_collectives)
    frame = _advisor(page, server)
    _select_session(frame, "train", GOOD)
    frame.wait_for_selector("[data-testid=device-chart] .legend", timeout=30000)
    text = frame.locator("[data-testid=device-chart] .legend").inner_text()
    assert "Compute" in text and "Collective" not in text, text


def test_cpu_run_with_nothing_to_fix_says_the_gpu_checks_need_a_gpu(page, server):
    """Issue 35.7: a CPU-only capture whose CPU checks pass (its actionable findings turned ok
    here) is not given a green "Nothing to fix": the GPU checks could not look."""
    def quiet(route):
        response = route.fetch()
        report = response.json()
        if response.status == 200 and report.get("findings"):
            for finding in report["findings"]:
                if finding["severity"] in ("critical", "warning"):
                    finding["severity"] = "ok"
        route.fulfill(response=response, body=json.dumps(report))

    page.route("**/data/plugin/gpu_advisor/report?*", quiet)
    frame = _advisor(page, server)
    _select_session(frame, CPU_RUN, CPU_SESSION)
    note = frame.wait_for_selector("[data-testid=needs-gpu]", timeout=30000).inner_text()
    assert "need a GPU capture" in note and "precision" in note, note
    assert frame.locator("p.good").count() == 0
    # As many named as the N/A list shows (issue 44 item 10: it named 6 of 9, "GPUs" unmatched).
    assert "multi_gpu_imbalance" in note and "launch_skew" in note, note


def test_missing_logdir_is_told_apart_from_an_empty_one(page, server):
    """The runs route answers 404 when the logdir does not exist; the tab says so, with the ways
    to capture in each framework."""
    page.route("**/data/plugin/gpu_advisor/runs*", lambda route: route.fulfill(
        status=404, content_type="application/json", body=json.dumps({"error": "/nowhere: no such folder (yet)"})))
    frame = _advisor(page, server)
    view = frame.wait_for_selector("[data-testid=missing-logdir]", timeout=30000).inner_text()
    assert "does not exist" in view and "/nowhere" in view
    for way in ("AdvisorCallback", "profile_steps", "tensorboard_trace_handler"):
        assert way in view, view


def _timeline(frame, step: str | None = None):
    """The step timeline once it has drawn (STEP: the step it must show)."""
    selector = "[data-testid=timeline][data-state=ready]" + (f'[data-step="{step}"]' if step else "")
    frame.wait_for_selector(selector, timeout=60000)
    return frame.locator("[data-testid=timeline]")


def test_timeline_marks_the_input_waits_of_the_planted_run(page, server):
    """GOOD plants a 30% input wait: the timeline opens on the representative step with the input
    finding marked (the report ranks it first), its marks 30% of the step as the finding says."""
    frame = _advisor(page, server)
    _select_session(frame, "train", GOOD)
    timeline = _timeline(frame)
    assert frame.locator("[data-testid=timeline-finding]").input_value() == "input_bound"
    marked = float(timeline.get_attribute("data-marked"))
    report = json.loads(urllib.request.urlopen(
        f"{server['base']}/data/plugin/gpu_advisor/report?run=train&session={GOOD}", timeout=30).read())
    finding = next(f for f in report["findings"] if f["check"] == "input_bound")
    assert abs(marked - 30.0) <= 1.0 and abs(marked - finding["metrics"]["input_percent"]) <= 1.0
    assert "of this step" in frame.locator("[data-testid=timeline-note]").inner_text()
    canvas = frame.locator("[data-testid=timeline-canvas]")
    assert int(canvas.get_attribute("data-rects")) > 0
    _shot(page, server, "timeline-input-bound", timeline)
    # Hover card over the cause row (the first row under the marks).
    box = canvas.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + 22 + 14 + 9)
    card = frame.locator("[data-testid=timeline-card]")
    card.wait_for(state="visible", timeout=5000)
    assert "in the step" in card.inner_text()
    # Keyboard zoom, pan and fit; mouse-wheel zoom.
    canvas.focus()
    full = float(canvas.get_attribute("data-to")) - float(canvas.get_attribute("data-from"))
    for key in ("+", "+", "ArrowRight"):
        page.keyboard.press(key)
    page.wait_for_timeout(100)
    zoomed = float(canvas.get_attribute("data-to")) - float(canvas.get_attribute("data-from"))
    assert zoomed == pytest.approx(full / 4, rel=0.01)
    page.keyboard.press("0")
    page.mouse.move(box["x"] + box["width"] * 0.7, box["y"] + 40)
    page.mouse.wheel(0, -400)
    page.wait_for_timeout(100)
    assert float(canvas.get_attribute("data-to")) - float(canvas.get_attribute("data-from")) < full
    frame.click("[data-testid=timeline-fit]")
    assert float(canvas.get_attribute("data-to")) - float(canvas.get_attribute("data-from")) == pytest.approx(full)
    # A click on another step's bar draws that step; a finding without intervals says why.
    frame.locator("[data-testid=step-chart] g.step-bar .hit").nth(2).click()
    _timeline(frame, frame.locator("[data-testid=step-chart] g.step-bar").nth(2).get_attribute("data-step"))
    frame.select_option("[data-testid=timeline-finding]", "precision")
    assert "nothing to mark" in frame.locator("[data-testid=timeline-note]").inner_text()


def test_timeline_of_a_pytorch_trace(page, server):
    if not (server["root"] / "logdir" / PYTORCH_RUN).is_dir():
        pytest.skip("the corpus is absent")
    frame = _advisor(page, server)
    frame.select_option("[data-testid=run-select]", PYTORCH_RUN)
    timeline = _timeline(frame)
    # ProfilerStep#6 lasts 158.5 ms, the median of the six (see test_stepview's hand check).
    assert timeline.get_attribute("data-step") == "6"
    frame.select_option("[data-testid=timeline-finding]", "input_bound")
    assert float(timeline.get_attribute("data-marked")) == pytest.approx(23.7, abs=1.0)


def test_timeline_of_a_two_host_session_groups_rows_by_host(page, server):
    frame = _advisor(page, server)
    frame.select_option("[data-testid=run-select]", TWO_HOSTS_RUN)
    timeline = _timeline(frame)
    assert timeline.get_attribute("data-hosts") == "2"
    assert int(timeline.get_attribute("data-rows")) >= 1 + 2 * 2 + 2


def test_timeline_of_inferred_steps(page, server):
    frame = _advisor(page, server)
    frame.select_option("[data-testid=run-select]", INFERRED_RUN)
    timeline = _timeline(frame)
    assert timeline.get_attribute("data-step")
    assert frame.locator("[data-testid=timeline-finding]").input_value() == "kernel_launch"
    assert float(timeline.get_attribute("data-marked")) > 10


def test_timeline_readable_at_900_px_in_the_dark(browser, server):
    """The README's screenshot: 900 px wide, dark colour scheme, the input finding marked."""
    context = browser.new_context(viewport={"width": 900, "height": 1000}, color_scheme="dark")
    page = context.new_page()
    try:
        frame = _advisor(page, server)
        _select_session(frame, "train", GOOD)
        timeline = _timeline(frame)
        canvas = frame.locator("[data-testid=timeline-canvas]")
        assert canvas.bounding_box()["width"] <= 900
        background = canvas.evaluate("c => Array.from(c.getContext('2d').getImageData(2, 2, 1, 1).data)")
        assert sum(background[:3]) < 3 * 80, "the dark scheme draws on a dark background"
        timeline.screenshot(path=str(server["root"] / "timeline-dark-900.png"))
    finally:
        context.close()


def test_timeline_zooms_20000_rectangles_without_a_long_frame(page, server):
    """The drawing alone, fed 20,000 rectangles in 10 rows: no zoom or pan frame over 100 ms."""
    frame = _advisor(page, server)
    _select_session(frame, "train", GOOD)
    _timeline(frame)
    worst = frame.evaluate("""async () => {
        const css = [...document.querySelectorAll('link[rel=stylesheet]')].find((l) => l.href.endsWith('style.css'));
        const {StepTimeline} = await import(css.href.replace(/style\\.css$/, 'timeline.js'));
        const rows = [];
        for (let r = 0; r < 10; r += 1) {
            const n = 2000, start = [], dur = [], lane = [];
            for (let i = 0; i < n; i += 1) { start.push(i * 50); dur.push(30); lane.push(r % 2 ? i % 2 : 0); }
            rows.push({host: '', kind: r % 2 ? 'host' : 'device', device: '', label: `row ${r}`, start, dur,
                       name: Array(n).fill(0), group: Array(n).fill(r % 6), corr: Array(n).fill(-1),
                       lane, count: Array(n).fill(1)});
        }
        const timeline = new StepTimeline(async () => ({
            step: 1, index: 0, steps: [1], start_ms: 0, duration_us: 100000, resolution_us: 0.5,
            groups: ['compute', 'copy', 'collective', 'input', 'launch', 'host', 'host_ops', 'not_traced'],
            device: '', rows, names: ['k'], findings: []}));
        timeline.element.style.width = '1200px';
        document.body.appendChild(timeline.element);
        await timeline.load(1);
        const canvas = timeline.canvas;
        let worst = 0;
        for (let k = 0; k < 30; k += 1) {
            const began = performance.now();
            timeline.zoom(k < 15 ? 0.8 : 1.25, 50000);
            timeline.draw();
            timeline.pan(k % 2 ? 0.1 : -0.1);
            timeline.draw();
            worst = Math.max(worst, (performance.now() - began) / 2);
        }
        timeline.fit();
        return {worst, rects: Number(canvas.dataset.rects)};
    }""")
    # At the whole step two rectangles share most pixels, and a pixel is filled once per row and lane.
    assert worst["rects"] >= 5000
    print(f"worst frame {worst['worst']:.1f} ms, {worst['rects']} rectangles drawn at the whole step")
    assert worst["worst"] < 100
