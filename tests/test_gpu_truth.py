"""The GPU truth script (demo/gpu_truth.py) and the product held to its GPU captures.

The smoke tests run the script's CPU mode once (tiny sizes, every scenario that needs no CUDA;
skipped when torch or jax is missing), then check that the manifest is complete, that the
product reads every capture, and that --pack keeps to the returned-file limits. They assert no
finding: a CPU capture cannot show what a GPU does.

The GPU tests read the captures a GPU run packed into tests/data/gpu/*.tar.gz and hold the
product to what the manifest wrote down before the run: the planted problem is the first
actionable finding and absent from its fixed twin, the predicted saving is within 25% of the
twins' measured difference, and a healthy run has no critical finding and steps the length the
script measured. They skip with "no GPU captures yet" until such captures are committed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from demo import gpu_truth as gt
from tb_gpuadvisor.checks import all_checks
from tb_gpuadvisor.checks.finding import ACTIONABLE
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.multihost import build_report
from tb_gpuadvisor.multihost.engine import LocalEngine

REPO = Path(__file__).resolve().parent.parent
GPU_DATA = REPO / "tests" / "data" / "gpu"
SAVING_TOLERANCE = 0.25
STEP_TOLERANCE = 0.25
SMOKE_TIMEOUT_S = 300


def _report(path: Path) -> list[dict]:
    """The product's sessions for one run folder, analysed in this process."""
    with LocalEngine(workers=1) as engine:
        return build_report(find_sessions(str(path)), engine=engine)["sessions"]


def test_scenarios_are_written_down_with_registered_checks():
    """Every expectation names a check the registry has; every planted problem has a fixed twin
    and a saving to hold it to; the healthy runs expect nothing."""
    known = {check.id for check in all_checks()}
    names = [s.name for s in gt.SCENARIOS]
    assert len(names) == len(set(names))
    assert {s.framework for s in gt.SCENARIOS} == {"pytorch", "jax"}
    for s in gt.SCENARIOS:
        for check in (s.expected_check, s.expected_check_gloo):
            assert check is None or check in known, (s.name, check)
        if s.expected_check is None:
            assert s.fix is None and s.saving is None, s.name
        else:
            assert s.fix and s.saving, s.name


def test_budget_skips_what_would_not_fit_and_a_failure_costs_only_its_scenario(tmp_path):
    """A pair starts only while the slowest pair so far fits before the deadline; a run that raises
    is listed with its error and the next scenario still runs."""
    def run(scenario: gt.Scenario, fixed: bool) -> dict:
        if scenario.name == "dataloader" and fixed:
            raise RuntimeError("no workers")
        time.sleep(0.05)
        return {"step_ms": 1.0 if fixed else 3.0, "meta": {}}

    first = [gt.by_name(n) for n in ("dataloader", "item_sync")]
    runs, skipped = gt.run_scenarios(first, tmp_path, gt.SMOKE_SIZES, gt.Budget(time.time() + 60), run, {})
    assert [r["run"] for r in runs] == ["dataloader", "item_sync", "item_sync_fixed"]
    assert skipped == [{"scenario": "dataloader_fixed", "reason": "failed: RuntimeError('no workers')"}]
    assert runs[1]["measured_saving_ms"] == 2.0 and "measured_saving_ms" not in runs[0]

    budget = gt.Budget(time.time() + 0.15)      # room for one pair (0.1 s), not for 1.2 times it more
    rest = [gt.by_name(n) for n in ("launch_bound", "train_mode_inference", "healthy")]
    runs, skipped = gt.run_scenarios(rest, tmp_path, gt.SMOKE_SIZES, budget, run, {})
    assert [r["run"] for r in runs] == ["launch_bound", "launch_bound_fixed"]
    assert skipped == [{"scenario": n, "reason": "time budget spent"} for n in ("train_mode_inference", "healthy")]


# --- the CPU smoke run ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[Path, dict]:
    missing = [m for m in ("torch", "jax") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed")
    out = tmp_path_factory.mktemp("gpu_truth") / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, str(REPO / "demo" / "gpu_truth.py"), "--out", str(out), "--cpu-smoke"],
                            capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return out, json.loads((out / gt.MANIFEST).read_text())


def test_smoke_manifest_is_complete(smoke):
    out, manifest = smoke
    assert manifest["mode"] == "cpu-smoke"
    assert [s["name"] for s in manifest["scenarios"]] == [s.name for s in gt.SCENARIOS]
    skipped = {s["scenario"]: s["reason"] for s in manifest["skipped"]}
    assert skipped == {s.name: "needs CUDA" for s in gt.SCENARIOS if s.needs_cuda}
    runs = {r["run"]: r for r in manifest["runs"]}
    for s in gt.SCENARIOS:
        if s.needs_cuda:
            continue
        planted = runs[s.name]
        assert planted["planted"] == s.planted and planted["expected_first_check"] == gt.expected_check(
            s, planted["meta"].get("backend"))
        assert planted["device"] and planted[s.framework == "jax" and "jax" or "torch"]
        if s.fix:
            fixed = runs[gt.run_name(s.name, True)]
            # A gloo twin still all-reduces through the host: it is held to the saving only.
            absent = None if fixed["meta"].get("backend") == "gloo" else planted["expected_first_check"]
            assert fixed["fix"] == s.fix and fixed["absent_check"] == absent
            assert planted["measured_saving_ms"] == pytest.approx(planted["step_ms"] - fixed["step_ms"], abs=1e-3)
    for run in runs.values():
        assert run["step_ms"] > 0 and run["synced_step_ms"] > 0 and run["wall_s"] >= 0, run["run"]
        assert (out / run["logdir"]).is_dir(), run["logdir"]
    assert runs["ddp"]["meta"]["backend"] == "gloo" and len(runs["ddp"]["ranks"]) == 2


def test_product_reads_every_smoke_capture(smoke):
    """Each run folder is one session the product analyses without errors, with steps, of the
    run's framework and (DDP) both ranks. Which findings a CPU capture gets is not asserted."""
    out, manifest = smoke
    for run in manifest["runs"]:
        (session,) = _report(out / run["logdir"])
        assert session["errors"] == [], (run["run"], session["errors"])
        assert session["framework"] == run["framework"], run["run"]
        assert session["steps"]["count"] >= 1, run["run"]
        assert len(session["hosts"]) == (2 if run["scenario"] == "ddp" else 1), run["run"]


def test_pack_keeps_to_the_returned_file_limits(smoke, tmp_path):
    out, manifest = smoke
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    archives = gt.pack(copy, tmp_path / "packed")
    assert 1 <= len(archives) <= gt.PACK_ARCHIVES
    assert all(a.stat().st_size < 16 * 2**20 for a in archives)
    names = set()
    for archive in archives:
        with tarfile.open(archive) as tar:
            names |= {n.split("/")[0] for n in tar.getnames()}
    assert names == {gt.MANIFEST} | {r["logdir"] for r in manifest["runs"]}


# --- the GPU captures ------------------------------------------------------------------------------

def _gpu_manifest() -> dict | None:
    for archive in sorted(GPU_DATA.glob("*.tar.gz")):
        with tarfile.open(archive) as tar:
            if gt.MANIFEST in tar.getnames():
                return json.load(tar.extractfile(gt.MANIFEST))
    return None


GPU_MANIFEST = _gpu_manifest()
NO_CAPTURES = [pytest.param(None, marks=pytest.mark.skip(reason="no GPU captures yet"))]


def _runs(**match) -> list:
    if GPU_MANIFEST is None:
        return NO_CAPTURES
    return [pytest.param(r, id=r["run"]) for r in GPU_MANIFEST["runs"]
            if all((r.get(k) is not None) == v for k, v in match.items())]


@pytest.fixture(scope="module")
def gpu_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gpu_captures")
    for archive in sorted(GPU_DATA.glob("*.tar.gz")):
        with tarfile.open(archive) as tar:
            tar.extractall(root, filter="data")
    return root


@pytest.mark.skipif(GPU_MANIFEST is None, reason="no GPU captures yet")
def test_gpu_captures_come_from_a_gpu_run():
    """The archives hold a GPU run (not a CPU smoke run packed by mistake), every scenario of the
    table run or skipped with its reason."""
    assert GPU_MANIFEST["mode"] == "gpu"
    assert {r["device_kind"] for r in GPU_MANIFEST["runs"]} == {"gpu"}
    ran = {r["scenario"] for r in GPU_MANIFEST["runs"]} | {s["scenario"] for s in GPU_MANIFEST["skipped"]}
    assert {s["name"] for s in GPU_MANIFEST["scenarios"]} <= ran


def _actionable(session: dict) -> list[dict]:
    return [f for f in session["findings"] if f["severity"] in {s.value for s in ACTIONABLE}]


@pytest.mark.parametrize("run", _runs(expected_first_check=True))
def test_gpu_planted_problem_comes_first_with_its_saving(run, gpu_dir):
    (session,) = _report(gpu_dir / run["logdir"])
    assert (session["first_fix"] or {}).get("check") == run["expected_first_check"], _actionable(session)[:3]
    if run.get("measured_saving_ms") is not None:
        finding = next(f for f in session["findings"] if f["check"] == run["expected_first_check"])
        predicted, measured = finding["estimated_savings_ms_per_step"], run["measured_saving_ms"]
        assert abs(predicted - measured) <= SAVING_TOLERANCE * abs(measured), (predicted, measured)


@pytest.mark.parametrize("run", _runs(absent_check=True))
def test_gpu_fixed_twin_lacks_the_problem(run, gpu_dir):
    (session,) = _report(gpu_dir / run["logdir"])
    assert run["absent_check"] not in {f["check"] for f in _actionable(session)}


@pytest.mark.parametrize("run", [r for r in _runs(expected_first_check=False, absent_check=False)
                                 if r.values[0] is None or r.values[0]["variant"] == "planted"])
def test_gpu_healthy_run_has_no_critical_finding_and_the_gpus_step(run, gpu_dir):
    (session,) = _report(gpu_dir / run["logdir"])
    assert not [f["check"] for f in session["findings"] if f["severity"] == "critical"]
    assert session["steps"]["mean_ms"] == pytest.approx(run["step_ms"], rel=STEP_TOLERANCE)
