"""A third capture format added from outside the product (issue 33): one adapter package
(tests/toy_format: reader and vocabulary) and one ``input.register`` call, and the whole flow
(discovery, model, trust, attribution, checks, report) reads it as it reads XPlane and Kineto.

The toy capture: 6 steps of 10 ms on one GPU; each step the host waits 6 ms for its batch
("wait_for_batch"), then launches one 2 ms kernel. So the GPU idles 8 ms of every 10 ms, 6 of
them waiting for input: the input is what bounds the steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tb_gpuadvisor import input as capture_formats
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.multihost import build_report
from toy_format import ADAPTER

STEPS, STEP_US, WAIT_US, KERNEL_US = 6, 10_000, 6_000, 2_000


def _toy_events() -> list[dict]:
    events = []
    for step in range(STEPS):
        t = 1_000 + step * STEP_US
        events += [{"name": "step", "ts": t, "dur": STEP_US, "on": "host", "step": step},
                   {"name": "wait_for_batch", "ts": t, "dur": WAIT_US, "on": "host"},
                   {"name": "launch", "ts": t + WAIT_US, "dur": 20, "on": "host", "corr": step},
                   {"name": "toy_gemm", "ts": t + WAIT_US + 30, "dur": KERNEL_US, "on": "gpu", "corr": step}]
    return events


@pytest.fixture
def toy_format():
    capture_formats.register(ADAPTER)
    yield ADAPTER
    capture_formats.unregister(ADAPTER.name)


def test_a_registered_format_is_found_read_and_reported(tmp_path: Path, toy_format):
    run = tmp_path / "toyrun"
    run.mkdir()
    (run / "worker0.toy.json").write_text(json.dumps({"events": _toy_events()}))
    refs = find_sessions(str(tmp_path))
    assert [(r.run, r.session, r.hosts) for r in refs] == [("toyrun", "trace", ("worker0",))]
    session = build_report(refs)["sessions"][0]
    assert session["errors"] == [] and session["hosts"] == ["worker0"]
    assert session["steps"]["count"] == STEPS
    assert session["bottleneck"]["bound_by"] == "input"
    first = session["findings"][0]
    assert first["check"] == "input_bound" and first["severity"] in ("warning", "critical")


def test_an_unregistered_format_is_not_a_capture(tmp_path: Path):
    (tmp_path / "worker0.toy.json").write_text(json.dumps({"events": _toy_events()}))
    assert find_sessions(str(tmp_path)) == []
