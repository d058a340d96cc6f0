"""A check declares everything about itself in its ``register`` call, and every stage reads it.

The toy check below is registered by the test alone (and removed afterwards): seeing it in the
report, the what-if, compare and ``tb-gpuadvisor checks`` proves that adding a check needs no
edit outside its own module.
"""

from __future__ import annotations

import copy

import pytest
from synth import build_training_session, write_session

from tb_gpuadvisor.attribution.replay import Scenario
from tb_gpuadvisor.checks import REGISTRY, Finding, Severity, all_checks, explaining, replay_scenarios
from tb_gpuadvisor.checks.base import ASPECTS, UNDECLARED, Compared, CrossHost, Marks, NoReplay, Replayed, register
from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.pipeline import analyse
from tb_gpuadvisor.cli import main
from tb_gpuadvisor.compare import compare_sessions
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.pipeline import load_session
from tb_gpuadvisor.multihost import analyze_session
from tb_gpuadvisor.multihost.mapper import HostJob, map_host
from tb_gpuadvisor.multihost.merge import merge

TOY = "toy_host_gaps"


def _toy(analysis: Analysis) -> Finding:
    """Half the time the host spent on other work, as a replayed saving."""
    saving = analysis.what_if.saving_ms(TOY)
    share = 100.0 * saving / analysis.mean_step_ms
    return Finding(TOY, Severity.WARNING, "Toy: host gaps", "A toy finding.",
                   {"toy_percent": round(share, 2), "toy_ms_per_step": round(saving, 3)}, saving)


@pytest.fixture
def toy():
    all_checks()
    register(TOY, "Toy host gaps", "A check registered by a test.",
             what_if=Replayed(lambda model: Scenario(idle={"other_host": 0.5}), on_cpu=True, what="half the gaps"),
             aspect="replicas", explains="host", explains_order=9,
             compared=Compared("toy_percent", "toy_ms_per_step"))(_toy)
    try:
        yield REGISTRY[TOY]
    finally:
        del REGISTRY[TOY]


@pytest.fixture
def session(tmp_path):
    logdir = build_training_session(steps=6, host_overhead_frac=0.3).write(tmp_path)
    (ref,) = find_sessions(str(logdir))
    return ref


def test_a_toy_check_reaches_report_whatif_compare_and_cli(toy, session, capsys):
    analysis = analyse(load_session(session))
    assert TOY in analysis.what_if.checks
    alone = analysis.what_if.saving_ms(TOY)
    # Half the host gaps: a positive gain, below what host_overhead's whole scenario gains.
    assert 0 < alone < analysis.what_if.saving_ms("host_overhead")

    report = analyze_session(session)
    toy_finding = next(f for f in report["findings"] if f["check"] == TOY)
    assert toy_finding["severity"] in ("warning", "info")
    # The declared aspect gave its confidence: "replicas" on a one-GPU run says nothing low.
    assert toy_finding["confidence"] in ("high", "medium")
    assert TOY in explaining("host") and explaining("host")[-1] == TOY

    slower = copy.deepcopy(report)
    slower_toy = next(f for f in slower["findings"] if f["check"] == TOY)
    slower_toy["metrics"]["toy_ms_per_step"] += 5.0
    slower_toy["metrics"]["toy_percent"] += 20.0
    row = next(c for c in compare_sessions(report, slower)["checks"] if c["check"] == TOY)
    assert row["main_metric"] == "toy_percent" and row["name"] == "Toy host gaps"
    assert row["new_ms"] == pytest.approx(row["base_ms"] + 5.0, abs=1e-3)
    assert row["status"] == "worse"

    assert main(["checks"]) == 0
    assert TOY in capsys.readouterr().out
    assert main(["checks", TOY]) == 0
    shown = capsys.readouterr().out
    for needle in ("replayed: half the gaps", "confidence aspect:  replicas", "explains bound:     host",
                   "time: toy_ms_per_step, share: toy_percent", "no: judged on the primary host"):
        assert needle in shown


def test_the_toy_check_is_gone_after_the_test(session):
    assert TOY not in REGISTRY
    assert TOY not in [f["check"] for f in analyze_session(session)["findings"]]


def test_every_registered_check_has_a_valid_declaration():
    checks = all_checks()
    assert len(checks) == 15
    for check in checks:
        assert check.aspect in ASPECTS
        assert isinstance(check.what_if, (Replayed, NoReplay))
        if isinstance(check.what_if, NoReplay):
            assert len(check.what_if.why) > 20, check.id
        assert check.marks is not UNDECLARED, f"{check.id} declares no timeline marks"
    xla = REGISTRY["xla_ops"]
    assert isinstance(xla.what_if, NoReplay) and xla.compared.share == "conversion_percent"
    assert "xla_ops" in explaining("device compute")


def test_scenarios_on_a_cpu_capture_are_the_host_timeline_ones(session):
    model = load_session(session)
    assert set(replay_scenarios(model, "cpu")) == {"input_bound", "host_overhead"}
    gpu = set(replay_scenarios(model, "gpu"))
    assert {"kernel_launch", "precision", "multi_gpu_imbalance"} <= gpu and "xla_ops" not in gpu


def test_a_bad_declaration_is_refused_at_import():
    with pytest.raises(ValueError, match="aspect"):
        register("bad", "Bad", "", what_if=NoReplay("no"), aspect="vibes")
    with pytest.raises(ValueError, match="bound"):
        register("bad", "Bad", "", what_if=NoReplay("no"), explains="gpu")
    with pytest.raises(ValueError, match="marks unknown causes"):
        register("bad", "Bad", "", what_if=NoReplay("no"), marks=Marks(("idle",), "idle_percent"))
    with pytest.raises(ValueError, match="twice"):
        register("memory", "Again", "", what_if=NoReplay("no"))(_toy)


TOY_HOSTS = "toy_gpu_count"


def _count_gpus(analysis: Analysis) -> int:
    return len(analysis.model.active_gpus)


def _judge_count(total: int, scale) -> Finding:
    return Finding(TOY_HOSTS, Severity.INFO, f"{total} GPUs ran kernels", "A toy cross-host finding.", {"gpus": total})


def test_a_toy_cross_host_check_is_joined_over_every_host(tmp_path):
    """Declaring a CrossHost (measure, join, judge) is all the many-host merge needs: each host
    counts its own 2 GPUs, the merge joins the hosts' counts into the session's 4."""
    all_checks()
    register(TOY_HOSTS, "Toy GPU count", "A cross-host check registered by a test.", what_if=NoReplay("a toy count"),
             cross_host=CrossHost(_count_gpus, lambda alignment, primary, parts, steps: sum(p for _, p in parts) or None,
                                  _judge_count, "GPU counts summed"))(lambda analysis: _judge_count(_count_gpus(analysis), analysis))
    try:
        space = build_training_session(steps=4, gpus=2).space
        write_session(tmp_path, "run", "s", {"w0": space, "w1": space})
        (ref,) = find_sessions(str(tmp_path))
        summaries = [map_host(HostJob(ref, host, 2)) for host in ref.hosts]
        assert [s.parts[TOY_HOSTS] for s in summaries] == [2, 2]
        merged = next(f for f in merge(ref, summaries)["findings"] if f["check"] == TOY_HOSTS)
        assert merged["metrics"] == {"gpus": 4}
    finally:
        del REGISTRY[TOY_HOSTS]
