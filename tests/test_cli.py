"""The command line: formats, exit codes, one-line errors, and no TensorFlow import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from synth import build_training_session, write_bad_session

from tb_gpuadvisor.cli import main


@pytest.fixture
def logdir(tmp_path):
    build_training_session(steps=5, input_wait_frac=0.3).write(tmp_path, "good", "s1")
    write_bad_session(tmp_path, "broken", "s2", "garbage")
    return tmp_path


def test_json_lists_every_session_with_errors_kept_apart(logdir, capsys):
    assert main(["analyze", str(logdir), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema_version"] == 1
    by_run = {s["run"]: s for s in report["sessions"]}
    assert set(by_run) == {"good", "broken"}
    good, broken = by_run["good"], by_run["broken"]
    assert good["steps"]["count"] == 5 and not good["errors"] and good["devices"]
    assert broken["errors"] and broken["steps"]["count"] == 0
    for key in ("run", "session", "hosts", "framework", "devices", "steps", "findings", "errors"):
        assert key in good


@pytest.mark.parametrize("fmt,needle", [("text", "good / s1"), ("markdown", "# GPU Advisor report")])
def test_text_and_markdown(logdir, capsys, fmt, needle):
    assert main(["analyze", str(logdir), "--format", fmt]) == 0
    assert needle in capsys.readouterr().out


def test_bad_path_exits_2_with_one_line(tmp_path, capsys):
    assert main(["analyze", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no such file" in err
    assert main(["analyze", str(tmp_path)]) == 2
    assert "no profile sessions" in capsys.readouterr().err


def test_fail_on_critical(logdir, capsys):
    code = main(["analyze", str(logdir / "good"), "--format", "json", "--fail-on", "critical"])
    severities = [f["severity"] for s in json.loads(capsys.readouterr().out)["sessions"] for f in s["findings"]]
    assert code == (1 if "critical" in severities else 0)


def test_checks_listing(capsys):
    assert main(["checks"]) == 0
    assert capsys.readouterr().out.strip()


def test_plugin_and_analysis_never_import_tensorflow(logdir):
    code = (
        "import sys, tb_gpuadvisor, tb_gpuadvisor.loader\n"
        "from tb_gpuadvisor.cli import main\n"
        f"main(['analyze', {str(logdir)!r}, '--format', 'json'])\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
