"""Real outputs follow the report's JSON schema (tb_gpuadvisor/schema/report.schema.json).

Every golden case is analysed again here (each TF/JAX corpus capture, when the corpus is
present, and the synthetic scenarios: planted problems, healthy, CPU-only, two hosts...), plus
a session that could not be read, a comparison, and the tab's routes; the demo runs are
validated in test_demo.py. The schema forbids fields it does not list, so a field added to the
report without its description here fails too.
"""

from __future__ import annotations

import copy
import json

import pytest
import synth
from golden import CORPUS_CASES, SYNTH_CASES, outputs
from schema_check import validate

from tb_gpuadvisor.compare import compare_sessions
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.metadata import SCHEMA_VERSION
from tb_gpuadvisor.multihost import analyze_session
from tb_gpuadvisor.schema import report_schema
from tb_gpuadvisor.service import AdvisorService, roots_from_flags

SCHEMA = report_schema()


def test_the_schema_is_the_reports_version():
    assert SCHEMA["properties"]["schema_version"]["const"] == SCHEMA_VERSION
    assert f"schema_version {SCHEMA_VERSION}" in SCHEMA["title"]


@pytest.mark.parametrize("case", list(SYNTH_CASES))
def test_synthetic_reports_follow_the_schema(case):
    assert validate(json.loads(outputs(case)["json"]), SCHEMA) == []


@pytest.mark.parametrize("case", CORPUS_CASES)
def test_corpus_reports_follow_the_schema(case, corpus):
    if not (corpus / case).is_dir():
        pytest.skip(f"{case} is not in the corpus")
    assert validate(json.loads(outputs(case)["json"]), SCHEMA) == []


def test_an_unreadable_session_and_a_comparison_follow_the_schema(tmp_path):
    synth.build_training_session(steps=4, input_wait_frac=0.3).write(tmp_path, "train", "a")
    synth.build_training_session(steps=4).write(tmp_path, "train", "b")
    synth.write_bad_session(tmp_path, "train", "c", "garbage")
    for host in ("h1", "h2"):       # a many-host session none of whose hosts can be read
        synth.write_bad_session(tmp_path, "train", "d", "truncated", host=host)
    sessions = {ref.session: analyze_session(ref) for ref in find_sessions(str(tmp_path))}
    assert sessions["c"]["errors"]
    assert len(sessions["d"]["errors"]) == 2 and "trust" not in sessions["d"] and sessions["d"]["first_fix"] is None
    for session in sessions.values():
        assert validate(session, SCHEMA, "session") == []
    for base, new in (("a", "b"), ("b", "a"), ("a", "c")):
        assert validate(compare_sessions(sessions[base], sessions[new]), SCHEMA, "comparison") == []


def test_the_tabs_routes_follow_the_schema(tmp_path):
    synth.build_training_session(steps=3).write(tmp_path, "train", "s1")
    service = AdvisorService(roots_from_flags(str(tmp_path), None), wait_s=60.0)
    try:
        assert validate(service.runs(), SCHEMA, "runs") == []
        assert validate(service.report("train", "s1"), SCHEMA, "session") == []
    finally:
        service.close()

    def broken(ref):
        raise RuntimeError("boom")

    failing = AdvisorService(roots_from_flags(str(tmp_path), None), wait_s=60.0, analyze=broken)
    try:        # an analysis that raises still answers a whole session object, with the error
        answer = failing.report("train", "s1")
        assert "boom" in answer["errors"][0]["message"]
        assert validate(answer, SCHEMA, "session") == []
    finally:
        failing.close()


def test_the_validator_catches_what_breaks_the_schema():
    report = json.loads(outputs("synth-input-bound")["json"])
    finding = report["sessions"][0]["findings"][0]
    broken = copy.deepcopy(report)
    del broken["sessions"][0]["findings"][0]["rank"]
    broken["sessions"][0]["steps"]["mean_ms"] = "20"
    broken["sessions"][0]["breakdown"]["steps"][0]["compute_low_precision_ms"] = 1.0   # a legacy part
    broken["sessions"][0]["findings"][1]["severity"] = "severe"
    problems = validate(broken, SCHEMA)
    assert any("'rank' is missing" in p for p in problems), problems
    assert any("mean_ms: str is not number" in p for p in problems), problems
    assert any("compute_low_precision_ms: not in the schema" in p for p in problems), problems
    assert any("'severe' is not one of" in p for p in problems), problems
    assert finding["check"] and validate(report, SCHEMA) == []
