"""No stage writes into another's values (issue 33): the analysis of one capture built twice
gives the same report, the model's tables and the checks' findings are left as each stage
returned them, and the report's findings are new objects.

The capture is golden.py's planted scenario (4 GPUs; input, host, launch, skew, precision, copy
and memory problems planted), so that nearly every check finds something and the report
reconciles, re-ranks and re-grades many findings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

import synth
from tb_gpuadvisor import report as report_stage
from tb_gpuadvisor.checks.finding import Finding
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.pipeline import analyse, check, load_session, report
from tb_gpuadvisor.timeline import SessionModel


def _fingerprint(model: SessionModel) -> str:
    """A digest of every column and list of the model's tables and steps."""
    digest = hashlib.sha256()
    tables = [model.steps] + [t for h in model.hosts for t in (h.activity, h.memory, *h.devices)]
    for table in tables:
        for item in dataclasses.fields(table):
            value = getattr(table, item.name)
            if isinstance(value, np.ndarray):
                digest.update(item.name.encode() + value.tobytes())
            elif isinstance(value, (list, str, int)):
                digest.update(item.name.encode() + repr(value).encode())
    return digest.hexdigest()


def _as_text(findings: list[Finding]) -> str:
    return json.dumps([f.to_json() for f in findings], sort_keys=True, default=str)


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    logdir = tmp_path_factory.mktemp("planted")
    synth.build_training_session(steps=6, step_ms=20.0, gpus=4, marker="keras3", input_wait_frac=0.35,
                                 host_overhead_frac=0.06, launch_frac=0.08, gpu_compute_scale={0: 1.4},
                                 launch_skew_ms=1.5, kernel_us=120, fp16_frac=0.3, tensor_core_frac=0.25,
                                 host_ops_frac=0.2, memcpy_frac=0.05, h2d_bytes=8 << 20, d2h_bytes=2 << 20,
                                 allreduce_calls=3, peak_mem_frac=0.85, cc=(8, 0)).write(logdir, "train", "s1")
    return logdir


def test_two_analyses_of_one_capture_agree_and_leave_each_stage_s_values(planted, monkeypatch):
    (ref,) = find_sessions(str(planted))
    model = load_session(ref)
    before = _fingerprint(model)
    returned: list[tuple[list[Finding], str]] = []     # the checks' findings, and their text then
    run_checks = report_stage.run_checks

    def recorded(analysis):
        findings, errors = run_checks(analysis)
        returned.append((findings, _as_text(findings)))
        return findings, errors
    monkeypatch.setattr(report_stage, "run_checks", recorded)

    reports, described = [], []
    for _ in range(2):
        analysis = analyse(model)
        found = check(analysis)
        described.append((found[1], _as_text(found[1])))
        breakdown = json.dumps(analysis.breakdown.to_json(), sort_keys=True, default=str)
        reports.append(report(found, analysis))
        assert json.dumps(analysis.breakdown.to_json(), sort_keys=True, default=str) == breakdown
    fresh = analyse(load_session(ref))
    reports.append(report(check(fresh), fresh))

    assert reports[0] == reports[1] == reports[2]
    assert any(f["severity"] in ("critical", "warning") for f in reports[0]["findings"])
    assert _fingerprint(model) == before
    # What the checks returned and what describe handed on, as each returned it.
    for findings, text in returned + described:
        assert _as_text(findings) == text
    # The report made new findings: none of its inputs' objects is one it changed.
    checks_ids = {id(f) for findings, _ in returned for f in findings}
    assert not checks_ids & {id(f) for findings, _ in described for f in findings}
