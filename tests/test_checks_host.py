"""The host-side checks on planted problems of varied size, healthy captures and real captures.

Each planted capture states its problem's size; the metric must come back within 3 points
and the severity must follow the catalogue's thresholds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from synth import PS_PER_MS, SpaceBuilder, build_training_session, write_session
from synth_whatif import analysed

from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.pipeline import analyse as analyse_model
from tb_gpuadvisor.checks import REGISTRY, Severity, all_checks
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.pipeline import load_session
from tb_gpuadvisor.input.xplane.schema import XPlane

all_checks()
GPU_ONLY = ("kernel_launch", "memcpy")
MINE = ("input_bound", "kernel_launch", "host_overhead", "op_placement", "memcpy", "profile_quality")


def load(path: Path) -> Analysis:
    (ref,) = find_sessions(str(path))
    return analyse_model(load_session(ref))


def analyse(tmp_path: Path, **planted):
    session = build_training_session(**planted)
    return analysed(session, tmp_path), session.truth


def run(analysis: Analysis, check: str):
    finding = REGISTRY[check].run(analysis)
    finding.to_json()   # must serialise
    return finding


# --- input_bound ------------------------------------------------------------------------------

@pytest.mark.parametrize("planted, marker, gpus, expected", [
    (0.35, "keras2", 1, Severity.CRITICAL),
    (0.12, "r", 1, Severity.WARNING),
    (0.60, "keras3", 2, Severity.CRITICAL),
    (0.08, "r", 0, Severity.WARNING),
    (0.02, "keras2", 1, Severity.OK),
])
def test_input_bound_planted(tmp_path, planted, marker, gpus, expected) -> None:
    analysis, truth = analyse(tmp_path, input_wait_frac=planted, marker=marker, gpus=gpus, steps=5)
    finding = run(analysis, "input_bound")
    assert finding.metrics["input_percent"] == pytest.approx(100 * planted, abs=3)
    assert finding.severity is expected
    assert finding.estimated_savings_ms_per_step == pytest.approx(truth.mean("input_ms"), rel=0.05)
    if expected is not Severity.OK:
        stage = next(e for e in finding.evidence if e.kind == "stage")
        assert stage.name == "Iterator::Model::ParallelMapV2"
        assert "ParallelMapV2" in finding.summary
        assert any("AUTOTUNE" in fix.code for fix in finding.fixes)


def test_input_bound_healthy_capture_is_ok(tmp_path) -> None:
    analysis, _ = analyse(tmp_path, steps=4)
    finding = run(analysis, "input_bound")
    assert finding.severity is Severity.OK
    assert finding.metrics["input_percent"] < 1
    assert finding.fixes == []


# --- kernel_launch ----------------------------------------------------------------------------

@pytest.mark.parametrize("planted, kernel_us, expected", [
    (0.22, 6.0, Severity.CRITICAL),
    (0.07, 15.0, Severity.WARNING),
    (0.0, 400.0, Severity.OK),
])
def test_kernel_launch_planted(tmp_path, planted, kernel_us, expected) -> None:
    analysis, truth = analyse(tmp_path, launch_frac=planted, kernel_us=kernel_us, steps=4, step_ms=12.0)
    finding = run(analysis, "kernel_launch")
    assert finding.metrics["launch_percent"] == pytest.approx(100 * planted, abs=3)
    assert finding.severity is expected
    assert finding.metrics["median_kernel_us"] == pytest.approx(kernel_us, rel=0.1)
    assert finding.metrics["kernels_per_step"] == pytest.approx(truth.mean("kernels", 0), rel=0.02)
    if expected is Severity.CRITICAL:
        tiny = [e for e in finding.evidence if e.kind == "op"]
        assert tiny and tiny[0].unit == "kernels/step"
        assert any("jit_compile=True" in fix.code for fix in finding.fixes)


def test_kernel_launch_not_applicable_without_gpu(tmp_path) -> None:
    analysis, _ = analyse(tmp_path, gpus=0, marker="r", steps=3)
    for check in GPU_ONLY:
        assert run(analysis, check).severity is Severity.NOT_APPLICABLE


# --- host_overhead ----------------------------------------------------------------------------

@pytest.mark.parametrize("planted, marker, expected", [
    (0.17, "keras3", Severity.CRITICAL),
    (0.06, "keras2", Severity.WARNING),
    (0.31, "r", Severity.CRITICAL),
])
def test_host_overhead_planted(tmp_path, planted, marker, expected) -> None:
    analysis, truth = analyse(tmp_path, host_overhead_frac=planted, marker=marker, steps=5)
    finding = run(analysis, "host_overhead")
    assert finding.metrics["other_idle_percent"] == pytest.approx(100 * planted, abs=3)
    assert finding.severity is expected
    culprit = next(e for e in finding.evidence if e.kind == "thread")
    assert culprit.name in {"convert_to_tensor", "tf.constant", "TFE_Py_FastPathExecute_C"}
    gap = next(e for e in finding.evidence if e.start_ms is not None)
    assert gap.end_ms > gap.start_ms


def test_host_overhead_healthy_is_ok(tmp_path) -> None:
    analysis, _ = analyse(tmp_path, input_wait_frac=0.1, steps=4)
    finding = run(analysis, "host_overhead")
    assert finding.severity is Severity.OK
    assert finding.metrics["other_idle_percent"] < 1


# --- op_placement -----------------------------------------------------------------------------

# The planted host ops overlap GPU work: a high share, but no time to gain, so info
# (was critical/warning on the share alone).
@pytest.mark.parametrize("planted, expected", [
    (0.55, Severity.INFO),
    (0.23, Severity.INFO),
    (0.0, Severity.OK),
])
def test_op_placement_planted(tmp_path, planted, expected) -> None:
    analysis, _ = analyse(tmp_path, host_ops_frac=planted, steps=4)
    finding = run(analysis, "op_placement")
    assert finding.metrics["host_op_percent"] == pytest.approx(100 * planted, abs=3)
    assert finding.severity is expected
    if planted:
        ops = {e.name: e.detail for e in finding.evidence if e.kind == "op"}
        assert "no GPU kernel" in ops["Unique"]
        assert "GPU kernel exists" in ops["MatMul"]
        # The planted host ops overlap GPU work, so moving them would not shorten the step.
        assert finding.estimated_savings_ms_per_step == pytest.approx(0, abs=0.05)


# --- memcpy -----------------------------------------------------------------------------------

@pytest.mark.parametrize("planted, h2d, d2h, expected", [
    (0.18, 8 << 20, 2 << 20, Severity.CRITICAL),
    (0.07, 3 << 20, 0, Severity.WARNING),
    (0.02, 1 << 20, 0, Severity.OK),
])
def test_memcpy_planted(tmp_path, planted, h2d, d2h, expected) -> None:
    analysis, truth = analyse(tmp_path, memcpy_frac=planted, h2d_bytes=h2d, d2h_bytes=d2h, steps=4)
    finding = run(analysis, "memcpy")
    assert finding.metrics["memcpy_percent"] == pytest.approx(100 * planted, abs=3)
    assert finding.severity is expected
    assert finding.metrics["h2d_mb_per_step"] == pytest.approx(h2d / 1e6, rel=0.01)
    assert finding.metrics["d2h_mb_per_step"] == pytest.approx(d2h / 1e6, rel=0.01)
    assert finding.estimated_savings_ms_per_step == pytest.approx(truth.mean("copy_ms", 0), rel=0.05)


# --- profile_quality --------------------------------------------------------------------------

def test_profile_quality_healthy(tmp_path) -> None:
    analysis, _ = analyse(tmp_path, steps=6)
    finding = run(analysis, "profile_quality")
    assert finding.severity is Severity.OK
    assert finding.metrics["capture_kind"] == "gpu"


@pytest.mark.parametrize("planted, expected, words", [
    (dict(steps=6, first_step_factor=3.5), Severity.INFO, "left out"),
    (dict(steps=2), Severity.WARNING, "Only 2 steps"),
    (dict(steps=14), Severity.INFO, "14 steps"),
    (dict(steps=5, marker="none"), Severity.INFO, "inferred"),
])
def test_profile_quality_degraded(tmp_path, planted, expected, words) -> None:
    analysis, _ = analyse(tmp_path, **planted)
    finding = run(analysis, "profile_quality")
    assert finding.severity is expected
    assert words in finding.title or words in finding.summary
    assert finding.fixes


def _gpu_session_without_device_events(steps: int = 4):
    """A GPU training session whose GPU planes lost every line, as when CUPTI records nothing."""
    session = build_training_session(gpus=1, marker="r", steps=steps)
    for plane in session.space.planes:
        if plane.name.startswith("/device:GPU"):
            del plane.lines[:]
    return session


def test_profile_quality_empty_gpu_trace(tmp_path) -> None:
    """The GPU ran the model (the host only dispatched: ops of microseconds, launch calls) but
    its plane is empty: the profiler lost the trace, and the fix is CUPTI's."""
    _gpu_session_without_device_events().write(tmp_path)
    analysis = load(tmp_path)
    finding = run(analysis, "profile_quality")
    assert finding.severity is Severity.WARNING
    assert finding.metrics["capture_kind"] == "gpu_empty"
    assert finding.metrics["model_ran_on"] == "gpu_trace_lost"
    assert finding.title == "Empty GPU trace"
    assert any("NVreg_RestrictProfilingToAdminUsers=0" in fix.code for fix in finding.fixes)
    assert run(analysis, "op_placement").severity is not Severity.CRITICAL


def test_model_on_cpu_beside_a_visible_gpu(tmp_path) -> None:
    """CPU training (ms-long model ops on host threads) with an empty GPU plane: TensorFlow saw the
    GPU but did not use it. That is op placement, critical, not a profiler problem."""
    session = build_training_session(gpus=0, marker="r", steps=4)
    session.space.planes.append(XPlane(id=7, name="/device:GPU:0"))   # a GPU plane without lines
    session.write(tmp_path)
    analysis = load(tmp_path)
    quality = run(analysis, "profile_quality")
    assert quality.metrics["model_ran_on"] == "host_despite_gpu"
    assert "ran on the CPU" in quality.title and not any("NVreg" in f.code for f in quality.fixes)
    placement = run(analysis, "op_placement")
    assert placement.severity is Severity.CRITICAL and placement.metrics["host_op_percent"] >= 80


# --- real captures ----------------------------------------------------------------------------

BATCHES = (8, 16, 32, 64, 128, 256, 512)


def test_launch_overhead_falls_as_batch_grows(corpus) -> None:
    """Batches 8 and 16 launch the same kernels in about the same time (steps of 3.7 and 3.9 ms
    from their host call), so their shares are within a couple of points; from there on the
    share falls with every doubling."""
    series = corpus / "keras-cnn-rtx5000"
    percents = []
    for batch in BATCHES:
        (folder,) = series.glob(f"download{batch}-*")
        finding = run(load(folder), "kernel_launch")
        percents.append(finding.metrics["launch_percent"])
    assert all(later <= earlier + 2 for earlier, later in zip(percents, percents[1:])), percents
    assert percents[1:] == sorted(percents[1:], reverse=True), percents
    assert percents[0] - percents[-1] > 20
    assert percents[0] >= 15    # batch 8: launch-bound


def test_empty_gpu_trace_capture(corpus) -> None:
    """The GPU plane is empty because the model ran on the CPU (see tests/test_trust.py for the
    hand check): the GPU-only checks do not apply, op placement is critical."""
    analysis = load(corpus / "keras-cnn-rtx5000-empty-gpu-trace")
    quality = run(analysis, "profile_quality")
    assert quality.metrics["capture_kind"] == "gpu_empty"
    assert quality.metrics["model_ran_on"] == "host_despite_gpu"
    for check in GPU_ONLY:
        assert run(analysis, check).severity is Severity.NOT_APPLICABLE
    assert run(analysis, "op_placement").severity is Severity.CRITICAL


def test_tpu_capture(corpus) -> None:
    """Hand check (the raw XSpace read with tb_gpuadvisor.input.xplane.schema, nothing else): /device:TPU:0's
    "XLA Modules" line runs jit_f 100 times, 784.154 ms each on average, back to back (the runs
    sum to 78415.441 ms over a 78415.552 ms span); there is no GPU plane and no tf.data thread."""
    analysis = load(corpus / "jax-tpu-v6e")
    quality = run(analysis, "profile_quality")
    assert quality.metrics["capture_kind"] == "tpu"
    assert "TPU" in quality.summary
    for check in GPU_ONLY:
        assert run(analysis, check).severity is Severity.NOT_APPLICABLE
    assert analysis.steps_count == 100
    primary = analysis.breakdown.primary
    assert primary.name == "/device:TPU:0"
    assert analysis.ms_per_step(primary.total("compute")) == pytest.approx(784.154, abs=0.01)
    assert run(analysis, "input_bound").metrics["input_percent"] == 0.0
    host = run(analysis, "host_overhead")
    assert host.severity is Severity.OK and host.metrics["other_idle_percent"] < 0.05


# The checks whose share is their time over the mean step (their declared compare metrics).
SHARE_OF_STEP = ("input_bound", "kernel_launch", "host_overhead", "memcpy")


@pytest.mark.parametrize("folder", ["keras-cpu-macbook", "bert-8xv100", "keras-t4", "jax-mi300x-amd"])
def test_real_captures_give_sane_findings(corpus, folder) -> None:
    """Beyond ranges: each share of step time is its time per step over the mean step; the
    savings of a session add up to at most its mean step; on keras-cpu-macbook (hand check: its
    one file has a single plane, /host:CPU) the GPU-only checks do not apply, elsewhere they do."""
    for ref in find_sessions(str(corpus / folder)):
        analysis = analyse_model(load_session(ref))
        mean = analysis.mean_step_ms
        findings = {check: run(analysis, check) for check in MINE}
        for check, finding in findings.items():
            for name, value in finding.metrics.items():
                if name.endswith("percent") and value is not None:
                    assert 0 <= value <= 100, (check, name, value)
            assert finding.estimated_savings_ms_per_step >= 0
            assert finding.title and finding.summary
        for check in SHARE_OF_STEP:
            finding, declared = findings[check], REGISTRY[check].compared
            if finding.severity is not Severity.NOT_APPLICABLE:
                share = 100.0 * finding.metrics[declared.time] / mean
                assert finding.metrics[declared.share] == pytest.approx(share, abs=0.02), (check, finding.metrics)
        assert sum(f.estimated_savings_ms_per_step for f in findings.values()) <= mean
        cpu_only = folder == "keras-cpu-macbook"
        for check in GPU_ONLY:
            assert (findings[check].severity is Severity.NOT_APPLICABLE) == cpu_only, (check, findings[check].title)


# --- op_placement on CPU-only captures ---------------------------------------------------------

def _cpu_capture(tmp_path, unique_ms: float, matmul_ms: float, steps: int = 4):
    """Custom-loop steps of 20 ms: Unique and MatMul on an executor thread, plus work that must
    not count (a variable read, and a tf.data map op on a pipeline thread)."""
    space = SpaceBuilder(["cpu-host"])
    plane = space.plane("/host:CPU")
    main = plane.line(1, "python", 0)
    executor = plane.line(2, "tf_Compute/2", 0)
    pipeline = plane.line(3, "tf_data_private_threadpool/3", 0)
    for step in range(steps):
        t0 = step * 20 * PS_PER_MS
        main.add("train", t0, 20 * PS_PER_MS, {"step_num": step, "_r": 1})
        executor.add("model/ids/Unique:Unique", t0 + PS_PER_MS, int(unique_ms * PS_PER_MS))
        executor.add("model/dense/MatMul:MatMul", t0 + int((1.5 + unique_ms) * PS_PER_MS),
                     int(matmul_ms * PS_PER_MS))
        executor.add("model/dense/ReadVariableOp:ReadVariableOp", t0 + int(18.5 * PS_PER_MS), PS_PER_MS)
        pipeline.add("map/Conv2D:Conv2D", t0, 15 * PS_PER_MS)
    write_session(tmp_path, "cpu", "s", {"cpu-host": space.build()})
    (ref,) = find_sessions(str(tmp_path))
    return analyse_model(load_session(ref))


@pytest.mark.parametrize("unique_ms, matmul_ms, expected", [
    (3.0, 7.0, Severity.WARNING), (9.0, 6.0, Severity.CRITICAL), (0.4, 9.6, Severity.OK),
])
def test_op_placement_on_cpu_measures_ops_without_gpu_kernel(tmp_path, unique_ms, matmul_ms, expected) -> None:
    finding = run(_cpu_capture(tmp_path, unique_ms, matmul_ms), "op_placement")
    assert finding.metrics["measured_on"] == "cpu"
    assert finding.metrics["host_op_percent"] == pytest.approx(100 * unique_ms / (unique_ms + matmul_ms), abs=0.5)
    assert finding.severity is expected
    if expected is not Severity.OK:
        assert finding.evidence[0].name == "Unique"
        assert finding.estimated_savings_ms_per_step == pytest.approx(unique_ms, rel=0.01)

