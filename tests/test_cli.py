"""The command line: formats, exit codes, one-line errors, and no TensorFlow import."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from synth import build_training_session, write_bad_session

from tb_gpuadvisor import multihost as report_module
from tb_gpuadvisor.cli import main


@pytest.fixture
def logdir(tmp_path):
    build_training_session(steps=5, input_wait_frac=0.3).write(tmp_path, "good", "s1")
    write_bad_session(tmp_path, "broken", "s2", "garbage")
    return tmp_path


def test_json_lists_every_session_with_errors_kept_apart(logdir, capsys):
    # The unreadable session makes the exit code 2, but the report is printed in full.
    assert main(["analyze", str(logdir), "--format", "json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["schema_version"] == 1
    by_run = {s["run"]: s for s in report["sessions"]}
    assert set(by_run) == {"good", "broken"}
    good, broken = by_run["good"], by_run["broken"]
    assert good["steps"]["count"] == 5 and not good["errors"] and good["devices"]
    assert broken["errors"] and broken["steps"]["count"] == 0
    for key in ("run", "session", "hosts", "framework", "devices", "steps", "findings", "errors"):
        assert key in good


def test_text_and_markdown(logdir, capsys):
    """The planted 30% input wait (6 of 20 ms) is the first fix in both renderings, ranked above
    the other actionable findings, with its saving and its top fix."""
    assert main(["analyze", str(logdir / "good"), "--format", "json"]) == 0
    findings = json.loads(capsys.readouterr().out)["sessions"][0]["findings"]
    assert findings[0]["check"] == "input_bound" and findings[0]["estimated_savings_ms_per_step"] == pytest.approx(6.0, abs=0.05)
    acting = [f["check"] for f in findings if f["severity"] in ("critical", "warning")]
    assert len(acting) >= 2

    assert main(["analyze", str(logdir / "good")]) == 0
    text = capsys.readouterr().out
    assert "good / s1" in text and "fix first: Training waits on input 30.0% of step time" in text
    assert re.search(r"\[CRIT\] input_bound +6\.00 ms/step", text), text
    assert "prefetch(tf.data.AUTOTUNE)" in text              # the top fix's code
    positions = [text.index(f"] {check} ") for check in acting]
    assert positions == sorted(positions), acting            # the report's rank order

    assert main(["analyze", str(logdir / "good"), "--format", "markdown"]) == 0
    markdown = capsys.readouterr().out
    assert markdown.startswith("# GPU Advisor report\n") and "## good / s1" in markdown
    assert "| 🔴 | `input_bound` | critical | 6.00 | Training waits on input 30.0% of step time |" in markdown
    rows = [markdown.index(f"| `{check}` |") for check in acting]
    assert rows == sorted(rows), acting
    assert "<details><summary>🔴 <b>Training waits on input 30.0% of step time</b></summary>" in markdown


@pytest.mark.parametrize("kind", ["garbage", "empty", "truncated"])
@pytest.mark.parametrize("fail_on", [[], ["--fail-on", "critical"]])
def test_unreadable_capture_exits_2_and_says_why(tmp_path, capsys, kind, fail_on):
    """CI must not pass on a capture nothing could be read from."""
    path = write_bad_session(tmp_path, "train", "s1", kind)
    assert main(["analyze", str(path)] + fail_on) == 2
    captured = capsys.readouterr()
    assert "train / s1" in captured.out and "could not be read: bad-host:" in captured.out
    assert "CPU-only capture on 0 hosts" not in captured.out and ". / ." not in captured.out
    assert "could not be analysed" in captured.err
    assert main(["analyze", str(path), "--format", "markdown"]) == 2
    assert "Could not be read" in capsys.readouterr().out


def test_loose_capture_is_named_after_its_folder(tmp_path, capsys, monkeypatch):
    (tmp_path / "x.xplane.pb").write_bytes(b"\xff\xff\x01")
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "x.xplane.pb", "--fail-on", "critical"]) == 2
    out = capsys.readouterr().out
    assert ". / ." not in out and out.splitlines()[1].startswith(tmp_path.name)


def test_refused_session_exits_2(logdir, capsys, monkeypatch):
    monkeypatch.setenv("TB_GPUADVISOR_MEMORY_LIMIT_MB", "1")
    assert main(["analyze", str(logdir / "good"), "--fail-on", "critical"]) == 2
    assert "could not be read:" in capsys.readouterr().out


def test_text_shows_the_top_fix_and_verbose_keeps_long_names(logdir, capsys):
    assert main(["analyze", str(logdir / "good")]) == 0
    out = capsys.readouterr().out
    assert "fix: " in out and "prefetch(" in out, out
    assert main(["analyze", str(logdir / "good"), "-v"]) == 0
    verbose = capsys.readouterr().out
    assert verbose.count("fix: ") > out.count("fix: ")


def test_verbose_evidence_names_are_not_cut(capsys, monkeypatch, logdir):
    name = "Iterator::Model::Prefetch::MapAndBatch::TensorSlice::" + "Nested" * 20
    evidence = [{"kind": "stage", "name": name, "value": 1.5, "unit": "ms/step"}]
    monkeypatch.setattr(report_module, "build_report", lambda refs, jobs, engine=None: _report(
        _finding("input_bound", "critical", evidence=evidence)))
    assert main(["analyze", str(logdir / "good"), "-v"]) == 0
    assert name in capsys.readouterr().out


def _finding(check: str, severity: str, **extra) -> dict:
    return dict({"check": check, "severity": severity, "title": "t", "summary": "s", "metrics": {},
                 "estimated_savings_ms_per_step": 1.0, "evidence": [], "fixes": []}, **extra)


def _report(*findings: dict, hosts=("h",), run="train") -> dict:
    return {"schema_version": 1, "sessions": [{
        "run": run, "session": "s1", "hosts": list(hosts), "framework": "tensorflow", "devices": [],
        "steps": {"count": 3, "source": "keras", "mean_ms": 10.0, "min_ms": 9.0, "max_ms": 11.0},
        "findings": list(findings), "first_fix": None, "errors": []}]}


def test_low_confidence_never_trips_fail_on_alone(capsys, monkeypatch, logdir):
    low = _finding("memcpy", "critical", confidence="low", confidence_reasons=["only 1 step captured"])
    monkeypatch.setattr(report_module, "build_report", lambda refs, jobs, engine=None: _report(low))
    assert main(["analyze", str(logdir / "good"), "--fail-on", "warning"]) == 0
    assert "confidence: low (only 1 step captured)" in capsys.readouterr().out
    assert main(["analyze", str(logdir / "good"), "--format", "markdown"]) == 0
    assert "**Confidence:** low (only 1 step captured)" in capsys.readouterr().out
    high = _finding("input_bound", "critical", confidence="high")
    monkeypatch.setattr(report_module, "build_report", lambda refs, jobs, engine=None: _report(low, high))
    assert main(["analyze", str(logdir / "good"), "--fail-on", "critical"]) == 1


def test_names_from_the_capture_are_inert(capsys, monkeypatch, logdir):
    """Escape sequences never reach the terminal; Markdown shows host names as text."""
    monkeypatch.setattr(report_module, "build_report", lambda refs, jobs, engine=None: _report(
        _finding("input_bound", "critical"), hosts=["<img src=x>|host"], run="\x1b[31mred\x1b]0;title\x07"))
    main(["analyze", str(logdir / "good")])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\\x1b[31mred" in out
    main(["analyze", str(logdir / "good"), "--format", "markdown"])
    out = capsys.readouterr().out
    assert "<img" not in out and "&lt;img src=x&gt;\\|host" in out and "\x1b" not in out


def test_non_utf8_names_under_strict_utf8_stdout(tmp_path):
    folder = os.path.join(os.fsencode(tmp_path), b"run\xff", b"plugins", b"profile", b"s\xfe")
    os.makedirs(folder)
    build_training_session(steps=3).write(tmp_path, "tmp", "x")
    source = tmp_path / "tmp" / "plugins" / "profile" / "x" / "synth-host.xplane.pb"
    os.rename(os.fsencode(source), os.path.join(folder, b"h\xfd.xplane.pb"))
    env = dict(os.environ, PYTHONIOENCODING="utf-8:strict", PYTHONPATH=os.pathsep.join(sys.path))
    for fmt in ("text", "markdown", "json"):
        result = subprocess.run([sys.executable, "-m", "tb_gpuadvisor.cli", "analyze", str(tmp_path),
                                 "--format", fmt], capture_output=True, env=env)
        assert result.returncode == 0, result.stderr.decode(errors="replace")
        assert b"\\udcff" in result.stdout or b"\\xff" in result.stdout, result.stdout[:300]


def test_usage_errors_and_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["analyze", ".", "--jobs", "0"])
    assert exit_info.value.code == 2 and "--jobs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["analyze", "--help"])
    help_text = capsys.readouterr().out
    assert "--format {text,json,markdown}" in help_text and "markdown for a PR comment" in help_text
    assert "2 usage error" in help_text.replace("\n", " ") or "could not be analysed" in help_text


def test_check_doc_prints_once_without_markdown(capsys):
    assert main(["checks", "input_bound"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("input_bound: Input pipeline bottleneck\n")
    assert out.count("input_bound") == 1 and "##" not in out and "``" not in out
    assert "What it measures\n----------------" in out


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


def test_fail_on_names_the_threshold_and_the_findings_on_stderr(capsys, monkeypatch, logdir):
    """Issue 26.4: exit 1 says on one stderr line which findings reached which threshold;
    a low-confidence finding is not named (it does not count)."""
    low = _finding("memcpy", "critical", confidence="low")
    monkeypatch.setattr(report_module, "build_report", lambda refs, jobs, engine=None: _report(
        _finding("input_bound", "critical"), _finding("kernel_launch", "warning"), low,
        _finding("precision", "info")))
    assert main(["analyze", str(logdir / "good"), "--fail-on", "warning"]) == 1
    err = capsys.readouterr().err
    assert err == "tb-gpuadvisor: fail-on warning reached: input_bound (critical), kernel_launch (warning)\n"
    assert main(["analyze", str(logdir / "good"), "--fail-on", "critical"]) == 1
    assert capsys.readouterr().err == "tb-gpuadvisor: fail-on critical reached: input_bound (critical)\n"
    assert main(["analyze", str(logdir / "good")]) == 0
    assert capsys.readouterr().err == ""


def test_markdown_folds_passed_and_not_applicable_checks_into_one_line(capsys, monkeypatch, logdir):
    """Issue 26.4: a PR comment lists what needs doing; passing checks take one line."""
    monkeypatch.setattr(report_module, "build_report", lambda refs, jobs, engine=None: _report(
        _finding("input_bound", "critical"), _finding("memcpy", "ok"), _finding("precision", "ok"),
        _finding("collectives", "not_applicable")))
    assert main(["analyze", str(logdir / "good"), "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "| `input_bound` |" in out
    assert "`memcpy` |" not in out and "`collectives` |" not in out
    assert out.count("\n🟢 Passed: `memcpy`, `precision` · ⚪ Not applicable: `collectives`\n") == 1


@pytest.mark.parametrize("base,new,names", [
    ("b/x/a/train", "b/x/a_fixed/train", ("a/train", "a_fixed/train")),
    ("b/x/a/train", "b/x/a/train", ("train", "train")),
    ("b1/a/train", "b2/a/train", ("train", "train")),     # two buckets: each keeps its own name
])
def test_compare_sides_are_named_below_their_shared_folder_on_a_store(base, new, names):
    """Issue 26.5 on an fsspec store (paths without a root): the same naming as on disk."""
    from tb_gpuadvisor.cli import _side_names
    from tb_gpuadvisor.input.discovery import SessionRef

    refs = [SessionRef("train", "s", f"{run}/plugins/profile/s", ("h",), fs=object()) for run in (base, new)]
    assert tuple(ref.run for ref in _side_names(*refs)) == names


def test_help_names_every_framework_read(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "TensorFlow, JAX and PyTorch profiles" in capsys.readouterr().out


# Words only a TensorFlow user should read.
TF_WORDS = re.compile(r"tf\.|tensorflow|TensorFlow|Keras|keras|tf_keras|steps_per_execution")


@pytest.mark.parametrize("framework", ["pytorch", "jax"])
def test_check_fixes_are_listed_per_framework(capsys, framework):
    """`checks host_overhead --framework X` lists the fixes a report for X would give, with no
    TensorFlow code; without --framework every framework has its own heading."""
    assert main(["checks", "host_overhead", "--framework", framework]) == 0
    out = capsys.readouterr().out
    fixes_part = out[out.index("Fixes it gives in"):]
    assert fixes_part.count("Fixes it gives in") == 1 and "  - " in fixes_part
    assert not TF_WORDS.search(fixes_part), fixes_part
    assert ("torch.compile" if framework == "pytorch" else "jax.jit") in fixes_part
    assert main(["checks", "eval_mode"]) == 0
    out = capsys.readouterr().out
    assert "Fixes it gives in TensorFlow runs\n---" in out and "does not run on these captures" in out
    assert "eval mode" in out[out.index("Fixes it gives in PyTorch runs"):]


def test_unreadable_capture_says_nothing_of_where_the_model_ran(logdir, capsys):
    """Nothing of the broken session was read, so its trust cannot say the model ran on the CPU."""
    assert main(["analyze", str(logdir / "broken"), "--format", "json"]) == 2
    (session,) = json.loads(capsys.readouterr().out)["sessions"]
    trust = session.get("trust") or {}
    assert trust.get("model_ran_on") in (None, "unknown") and "placement" not in trust
