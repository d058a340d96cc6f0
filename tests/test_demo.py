"""End to end: every demo scenario trains on the CPU, and the Advisor finds what was planted.

The demo runs once per test session (``--all`` in short mode, one child process
per scenario), then each capture goes through ``report.analyze_session`` exactly
as the CLI and the Advisor tab would.  The expectations below are about the
captures; the Advisor never sees a scenario's name.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from demo.serve import MissingToolsCache

from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.multihost import analyze_session

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = ("healthy", "input_bound", "host_overhead", "launch_bound",
             "host_placement", "fp32", "multi_gpu", "custom_loop")
PROFILED_STEPS, WARMUP_STEPS = 4, 2
FIRES = {"warning", "critical"}


@pytest.fixture(scope="session")
def demo_logdir(tmp_path_factory) -> Path:
    if importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("keras") is None:
        pytest.skip("the demo needs tensorflow and keras (pip install '.[demo]')")
    logdir = tmp_path_factory.mktemp("demo_logs")
    command = [sys.executable, "-m", "demo.train", "--all", "--logdir", str(logdir),
               "--steps", str(PROFILED_STEPS), "--warmup", str(WARMUP_STEPS)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1200,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))   # as `make demo` runs it
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (logdir.parent / f"{logdir.name}.log").write_text(result.stdout + result.stderr)
    return logdir


def test_demo_log_has_no_traceback(demo_logdir: Path):
    log = (demo_logdir.parent / f"{demo_logdir.name}.log").read_text()
    assert "Traceback" not in log, log[-3000:]


def _record(message: str, error: BaseException | None) -> logging.LogRecord:
    exc_info = (type(error), error, None) if error else None
    return logging.LogRecord("tensorboard.plugins.profile", logging.ERROR, "profile_io.py", 1, message, (),
                             exc_info)


def test_serve_drops_only_xprofs_missing_cache_traceback():
    keep = MissingToolsCache().filter
    missing = FileNotFoundError(2, "No such file or directory")
    assert not keep(_record("Error reading or decoding file s/.cached_tools.json: x, invalidating.", missing))
    assert keep(_record("Error reading or decoding file s/.cached_tools.json", ValueError("bad json")))
    assert keep(_record("Error reading s/trace.json", missing))


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("flavour,extra,removed", [("cpu", ".[demo]", "tensorflow"),
                                                    ("gpu", ".[demo-gpu]", "tensorflow-cpu")])
def test_make_demo_installs_one_tensorflow(tmp_path, flavour, extra, removed):
    plan = subprocess.run(["make", "-n", "demo", f"TF={flavour}", f"VENV={tmp_path / 'venv'}"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout
    installs = [line for line in plan.splitlines() if "pip install" in line and "-e" in line]
    assert len(installs) == 1 and installs[0].endswith(f'"{extra}"'), plan
    if flavour == "gpu" or os.uname().machine == "x86_64":
        assert f"pip uninstall -y -q {removed} " in plan, plan
    assert "TF_CPP_MIN_LOG_LEVEL=2" in plan and "-m demo.serve" in plan


@pytest.fixture(scope="session")
def reports(demo_logdir: Path) -> dict[str, dict]:
    """One analyzed session per scenario, keyed by the scenario (the run's first path part)."""
    sessions = {}
    for ref in find_sessions(str(demo_logdir)):
        scenario, _, rest = ref.run.partition("/")
        assert rest == "train" and scenario not in sessions, f"unexpected run layout {ref.run!r}"
        sessions[scenario] = analyze_session(ref)
    return sessions


def _finding(session: dict, check: str) -> dict:
    matches = [f for f in session["findings"] if f["check"] == check]
    assert len(matches) == 1, f"{check} missing from {[f['check'] for f in session['findings']]}"
    return matches[0]


def test_every_demo_report_follows_the_schema(reports: dict[str, dict]):
    from schema_check import validate

    from tb_gpuadvisor.schema import report_schema

    schema = report_schema()
    for name, session in reports.items():
        assert validate(session, schema, "session") == [], name


def test_every_scenario_wrote_one_readable_capture(reports: dict[str, dict], demo_logdir: Path):
    assert sorted(reports) == sorted(SCENARIOS)
    for name, session in reports.items():
        assert session["errors"] == [], name
        record = json.loads((demo_logdir / name / "demo_scenario.json").read_text())
        assert record["scenario"] == name and record["profiled_steps"] == PROFILED_STEPS


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_steps_found_with_the_marker_the_trainer_used(reports: dict[str, dict], scenario: str):
    steps = reports[scenario]["steps"]
    assert steps["source"] == ("custom_loop" if scenario == "custom_loop" else "keras")
    assert steps["count"] == PROFILED_STEPS
    assert steps["mean_ms"] > 0


def test_input_bound_is_critical_on_the_slow_pipeline(reports: dict[str, dict]):
    finding = _finding(reports["input_bound"], "input_bound")
    assert finding["severity"] == "critical", finding["metrics"]


def test_input_bound_is_ok_on_healthy(reports: dict[str, dict]):
    finding = _finding(reports["healthy"], "input_bound")
    assert finding["severity"] == "ok", finding["metrics"]


def test_host_overhead_fires_on_per_batch_python_work(reports: dict[str, dict]):
    finding = _finding(reports["host_overhead"], "host_overhead")
    assert finding["severity"] in FIRES, finding["metrics"]


def test_op_placement_fires_on_host_pinned_ops(reports: dict[str, dict]):
    finding = _finding(reports["host_placement"], "op_placement")
    assert finding["severity"] in FIRES, finding["metrics"]


@pytest.mark.parametrize("scenario,check", [("input_bound", "input_bound"),
                                            ("host_overhead", "host_overhead"),
                                            ("host_placement", "op_placement")])
def test_planted_problem_is_ranked_first(reports: dict[str, dict], scenario: str, check: str):
    session = reports[scenario]
    ranked = sorted((f for f in session["findings"] if f["severity"] in FIRES), key=lambda f: f["rank"])
    assert ranked and ranked[0]["check"] == check, [(f["check"], f["severity"]) for f in ranked]
    assert session["first_fix"]["check"] == check


def test_launch_bound_leads_with_dropping_run_eagerly(reports: dict[str, dict]):
    """launch_bound compiles its model with run_eagerly=True: fit's steps hold no tf.function call
    and the host's time is eager dispatch (TFE_Py_FastPathExecute_C in the evidence). The first
    finding's first fix must be turning run_eagerly off, not steps_per_execution."""
    session = reports["launch_bound"]
    top = min((f for f in session["findings"] if f["severity"] in FIRES), key=lambda f: f["rank"])
    assert "run_eagerly" in top["fixes"][0]["text"], [fix["text"][:60] for fix in top["fixes"]]
    assert "steps_per_execution" not in top["fixes"][0]["code"]


# GPU-only mechanisms a run without a GPU must not be told about.
GPU_ONLY = re.compile(r"copy engine|pin_memory|device=\"cuda\"|CUDA graph|on the GPU|TF_GPU_THREAD|non_blocking")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_cpu_runs_get_no_gpu_only_fix(reports: dict[str, dict], scenario: str):
    session = reports[scenario]
    if session["trust"]["model_ran_on"] != "cpu_only":
        pytest.skip("trained on a GPU")
    for finding in session["findings"]:
        for fix in finding["fixes"]:
            assert not GPU_ONLY.search(fix["text"] + fix["code"]), (finding["check"], fix["text"])


def test_tensorflow_start_up_notices_are_dropped_and_nothing_else():
    """The two lines every TensorFlow process prints before absl is set up, as TF 2.20 writes them."""
    from demo.quiet import harmless

    assert harmless("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n")
    assert harmless("I0000 00:00:1795694288.605209    8857 port.cc:153] oneDNN custom operations are on. "
                    "You may see slightly different numerical results due to floating-point round-off errors "
                    "from different computation orders. To turn them off, set the environment variable "
                    "`TF_ENABLE_ONEDNN_OPTS=0`.\n")
    for kept in ("Traceback (most recent call last):\n", "E0000 00:00:17.1 1 port.cc:153] oneDNN failed\n",
                 "WARNING: something else\n", "[demo] input_bound: ok in 9.0 s wall\n"):
        assert not harmless(kept)


def test_serve_checks_the_port_first():
    """`make demo` runs this before training: a port in use fails at once, with one line."""
    import socket

    from demo.serve import port_taken

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "demo.serve", "--check-port", "--host", "127.0.0.1",
                               "--port", str(port)], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and done.stderr.count("\n") == 1
        assert f"port {port} on 127.0.0.1 is not free" in done.stderr and f"PORT={port + 1}" in done.stderr
    assert port_taken("127.0.0.1", port) is None


def test_run_all_keeps_finished_captures_unless_retrained(tmp_path, monkeypatch, capsys):
    """A scenario whose marker file says it was made with the same steps and warm-up, and whose
    session folder holds files, is not trained again; --retrain (RETRAIN=1) trains it."""
    from demo import train

    for name in train.SCENARIOS:
        session = tmp_path / name / "train" / "plugins" / "profile" / "s1"
        session.mkdir(parents=True)
        (session / "host.xplane.pb").write_bytes(b"x")
        (tmp_path / name / train.MARKER_FILE).write_text(json.dumps({"profiled_steps": 4, "warmup_steps": 2}))
    ran: list[list[str]] = []
    monkeypatch.setattr(train, "run_quietly", lambda command, **kw: ran.append(command) or 0)
    assert train.run_all(tmp_path, 4, 2) == 0 and ran == []
    assert "make demo RETRAIN=1" in capsys.readouterr().out
    assert train.run_all(tmp_path, 5, 2) == 0 and len(ran) == len(train.SCENARIOS)   # other settings
    ran.clear()
    assert train.run_all(tmp_path, 4, 2, retrain=True) == 0 and len(ran) == len(train.SCENARIOS)
    assert not train.reusable(tmp_path / "missing", 4, 2)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_clean_removes_compiled_extensions(tmp_path):
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    built = tmp_path / "tb_gpuadvisor" / "input" / "xplane" / "_wire.cpython-311-x86_64-linux-gnu.so"
    built.parent.mkdir(parents=True)
    built.write_bytes(b"\x7fELF")
    (tmp_path / "tb_gpuadvisor" / "keep.py").write_text("")
    done = subprocess.run(["make", "-C", str(tmp_path), "clean"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not built.exists() and (tmp_path / "tb_gpuadvisor" / "keep.py").exists()


def test_every_demo_step_timeline_marks_what_its_findings_count(demo_logdir: Path):
    """Issue 43: on every demo run, each step's marks add up to the step's attributed time and,
    over all steps, to the finding's number, within 1 percentage point."""
    from stepview_check import disagreements
    from tb_gpuadvisor.pipeline import analysed_session

    refs = find_sessions(str(demo_logdir))
    assert refs
    problems = {ref.run: disagreements(analysed_session(ref)) for ref in refs}
    assert {run: found for run, found in problems.items() if found} == {}
