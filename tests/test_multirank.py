"""Ranks of a PyTorch DDP job, one GPU each in its own trace file: the session compares them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from synth_kineto import kineto_trace, write_trace
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.multihost import analyze_session
from tb_gpuadvisor.multihost.engine import LocalEngine
from tb_gpuadvisor.timeline import PS_PER_MS


def _imbalance(folder) -> dict:
    refs = find_sessions(str(folder))
    assert len(refs) == 1 and len(refs[0].hosts) == 2
    with LocalEngine(workers=1) as engine:
        session = analyze_session(refs[0], engine)
    return next(f for f in session["findings"] if f["check"] == "multi_gpu_imbalance")


def test_one_gpu_per_rank_is_compared_across_ranks(tmp_path):
    """Rank 1's kernels take 600 us against rank 0's 400 us (20 per step): rank 1 is the
    straggler, busy 12 ms per step against 8 ms, a third more; each file alone has one GPU."""
    write_trace(tmp_path / "run" / "rank-0.pt.trace.json", kineto_trace(steps=4, kernels=20, kernel_us=400.0))
    write_trace(tmp_path / "run" / "rank-1.pt.trace.json", kineto_trace(steps=4, kernels=20, kernel_us=600.0))
    finding = _imbalance(tmp_path)
    assert finding["severity"] != "not_applicable"
    assert finding["metrics"]["straggler_device"].startswith("rank-1/")
    assert finding["metrics"]["max_busy_ms_per_step"] == pytest.approx(12.0, rel=0.02)
    assert finding["metrics"]["min_busy_ms_per_step"] == pytest.approx(8.0, rel=0.02)
    assert finding["metrics"]["imbalance_percent"] == pytest.approx(33.3, abs=1)


def test_hta_ranks_are_set_side_by_side(corpus):
    """pytorch-hta-2ranks, one A100 per rank. Hand check (a blind expert, from the raw JSON):
    compute kernels 106 and 104 ms in rank 0's two steps, 136 and 136 ms in rank 1's, so rank 1
    computes longer; with copies and memsets outside NCCL, 105.8 vs 140.3 ms per step."""
    folder = corpus / "pytorch-hta-2ranks"
    if not folder.exists():
        pytest.skip("corpus trace absent")
    finding = _imbalance(folder)
    assert finding["metrics"]["straggler_device"].startswith("rank-1/")
    assert finding["metrics"]["active_gpus"] == 2
    assert finding["metrics"]["imbalance_percent"] == pytest.approx(25, abs=2)


def _replicas(busy_ms: list[float], collective_ms: list[float], idle_ms: list[float]):
    from tb_gpuadvisor.checks.multi_gpu_imbalance import Replicas
    steps = 3
    table = lambda values: np.array([[v * PS_PER_MS] * steps for v in values])  # noqa: E731
    n = len(busy_ms)
    return Replicas([f"rank-{i}/GPU:0" for i in range(n)], [("/device:GPU:0", f"rank-{i}") for i in range(n)],
                    table(busy_ms), np.arange(steps) * 100 * PS_PER_MS, (np.arange(steps) + 1) * 100 * PS_PER_MS,
                    90.0, [], 0, [], n, [], table(collective_ms), table(idle_ms))


def test_a_rank_late_for_its_host_is_named_with_that_reason():
    """Steps of 100 ms. Ranks 0 and 2 compute 60 ms, idle 5 ms and wait 35 ms in the all-reduce;
    rank 1 computes 62 ms but its GPU idles 28 ms waiting on its host, so it reaches the
    all-reduce last and waits only 10 ms there: late because of its host, not its compute."""
    from tb_gpuadvisor.checks.multi_gpu_imbalance import _late_arrival
    r = _replicas([60, 62, 60], [35, 10, 35], [5, 28, 5])
    means = r.per_step.mean(axis=1)
    late = _late_arrival(r, means)
    assert late.index == 1 and late.reason == "host"
    assert "idle 28.00 ms per step" in late.sentence and "waiting on its host" in late.sentence


def test_a_rank_late_for_its_compute_is_named_with_that_reason():
    """Rank 1 computes 80 ms against 60 and so waits 15 ms in the all-reduce against 35."""
    from tb_gpuadvisor.checks.multi_gpu_imbalance import _late_arrival
    r = _replicas([60, 80], [35, 15], [5, 5])
    means = r.per_step.mean(axis=1)
    late = _late_arrival(r, means)
    assert late.index == 1 and late.reason == "compute" and "computes 20.00 ms per step more" in late.sentence


def test_ranks_that_wait_alike_name_no_late_rank():
    from tb_gpuadvisor.checks.multi_gpu_imbalance import _late_arrival
    r = _replicas([60, 61], [35, 34], [5, 5])
    means = r.per_step.mean(axis=1)
    assert _late_arrival(r, means) is None


# An FSDP-like job of 4 ranks (tests/synth_kineto.kineto_ranks): per step 8 layers of forward (an
# all-gather, then a 1.5 ms kernel) and backward (a 1.5 ms kernel, a reduce-scatter), a sync, then
# the optimizer step on the host: 8 ms, launching kernels the GPU keeps up with.
RANKS = dict(ranks=4, steps=4, layers=8, kernel_us=1500.0, optimizer_us=8000.0, gather_us=400.0, scatter_us=800.0)


def _session(tmp_path, workers: int = 1, **params) -> dict:
    from synth_kineto import kineto_ranks
    for rank, trace in enumerate(kineto_ranks(**dict(RANKS, **params))):
        write_trace(tmp_path / "run" / f"rank-{rank}.pt.trace.json", trace)
    refs = find_sessions(str(tmp_path))
    assert len(refs) == 1 and len(refs[0].hosts) == RANKS["ranks"]
    with LocalEngine(workers=workers) as engine:
        return analyze_session(refs[0], engine)


def _finding(session: dict, check: str) -> dict:
    return next(f for f in session["findings"] if f["check"] == check)


def test_a_rank_whose_host_is_slow_is_named_with_its_optimizer_step(tmp_path):
    """Rank 2's optimizer step takes 16 ms on its host against 8 ms on the others, so from the
    second step on its first all-gather is launched 8 ms after theirs: they wait 8 ms inside it
    (3 of 4 steps: 6.0 ms per step mean), every GPU does the same work (imbalance 0%). By hand:
    fixing the op lets rank 2 arrive 8 ms earlier, and then nobody waits: 6.0 ms per step; the
    collective time splits into waiting (3 ranks x 8 ms x 3 steps / 4 ranks / 4 steps = 4.5 ms
    per rank and step) and exposed transfer (the 8 exposed reduce-scatters, 6.4 ms, plus the
    first all-gather's 0.4 ms and the exposed ends of the others). The hosts' clocks are shifted by
    0, +5, -3 and +0.2 ms and the ranks are mapped in two processes: the merge aligns them
    from the per-host summaries alone."""
    session = _session(tmp_path, workers=2, slow_rank=2, clock_offsets_us=(0.0, 5000.0, -3000.0, 200.0))
    first = session["findings"][0]
    assert first["check"] == "multi_gpu_imbalance" and first["severity"] in ("warning", "critical")
    m = first["metrics"]
    assert m["late_device"].startswith("rank-2/") and m["straggler_reason"] == "host"
    assert m["straggler_host_op"] == "Optimizer.step#AdamW.step"
    assert m["straggler_op_ms_per_step"] == pytest.approx(16.0, abs=0.05)
    assert m["others_op_ms_per_step"] == pytest.approx(8.0, abs=0.05)
    assert m["others_wait_ms_per_step"] == pytest.approx(6.0, abs=0.05)
    assert m["collective_wait_ms_per_step"] == pytest.approx(4.5, abs=0.05)
    assert m["max_clock_offset_ms"] == pytest.approx(8.0, abs=0.01)
    assert m["imbalance_percent"] == 0.0 and m["straggler_device"] == m["late_device"]
    assert first["estimated_savings_ms_per_step"] == pytest.approx(6.0, abs=0.1)
    assert "rank-2" in first["title"] and "Optimizer.step#AdamW.step" in first["title"]
    codes = [f["code"] for f in first["fixes"]]
    assert "fused=True" in codes[0] and "sched_setaffinity" in codes[1] and len(codes) == 2
    coll = _finding(session, "collectives")["metrics"]
    # One cause per microsecond: the exposed time is waiting plus transfer, never both.
    assert coll["collective_wait_ms_per_step"] == pytest.approx(4.5, abs=0.05)
    assert coll["exposed_collective_ms_per_step"] == pytest.approx(
        coll["collective_wait_ms_per_step"] + coll["collective_transfer_ms_per_step"], abs=0.01)
    # The breakdown (rank 0's) splits its collective time the same way: 8 ms waiting from step 6 on.
    steps = session["breakdown"]["steps"]
    assert [s["collective_wait_ms"] for s in steps] == pytest.approx([0.0, 8.0, 8.0, 8.0], abs=0.01)
    device = session["breakdown"]["per_device"][0]
    assert device["collective_wait_ms"] == pytest.approx(6.0, abs=0.01)
    split = device["collective_wait_ms"] + device["collective_transfer_ms"]
    assert split == pytest.approx(device["collective_ms"], abs=0.01)


def test_ranks_that_keep_pace_name_no_host_straggler(tmp_path):
    """Every host takes 8 ms for its optimizer step: no rank waits for another (calls match, no
    waiting), so nothing is blamed on a host and no saving is claimed for imbalance."""
    session = _session(tmp_path)
    imbalance = _finding(session, "multi_gpu_imbalance")
    assert "straggler_host_op" not in imbalance["metrics"]
    assert imbalance["estimated_savings_ms_per_step"] == pytest.approx(0.0, abs=0.01)
    assert _finding(session, "collectives")["metrics"]["collective_wait_ms_per_step"] == pytest.approx(0.0, abs=0.01)


def test_overlap_saving_predicts_the_step_with_reduce_scatters_in_backward(tmp_path):
    """The same job with its 8 reduce-scatters after backward (each 0.8 ms, nothing alongside) and
    with each issued beside the next layer's backward kernel (as a gradient hook does), only the
    last one left exposed. By hand the second is 7 x 0.8 = 5.6 ms per step shorter; the first's
    collectives finding predicts its overlap saving from the first alone, within 25%, and names
    FSDP's prefetch; the overlapped run has nothing left to gain."""
    exposed = _session(tmp_path / "exposed", overlap=False)
    overlapped = _session(tmp_path / "overlapped", overlap=True)
    measured = exposed["steps"]["mean_ms"] - overlapped["steps"]["mean_ms"]
    assert measured == pytest.approx(5.6, abs=0.05)
    finding = _finding(exposed, "collectives")
    assert finding["severity"] in ("warning", "critical")
    predicted = finding["metrics"]["overlap_saving_ms_per_step"]
    assert abs(predicted - measured) <= 0.25 * measured
    assert finding["estimated_savings_ms_per_step"] == pytest.approx(predicted, abs=0.01)
    assert any("backward_prefetch" in fix["code"] for fix in finding["fixes"])
    after = _finding(overlapped, "collectives")
    assert after["metrics"]["overlap_saving_ms_per_step"] < 0.1 * measured
    assert after["severity"] not in ("warning", "critical")


def test_hta_ranks_calls_are_not_matched_where_they_do_not_end_together(corpus):
    """pytorch-hta-2ranks: 2 of 128 ranks; their NCCL kernels are SendRecv ones under
    all-to-all/all-reduce/all-gather calls. Hand check from the raw JSON: rank 0's first
    all-to-all kernel ends at ts 1682725898125046 us, rank 1's first at ...98187835, which is rank
    0's second's end: the n-th call is not the same collective on both (other groups), so the
    ranks are not matched, no straggler is named and no waiting split is claimed from them."""
    folder = corpus / "pytorch-hta-2ranks"
    session = analyze_session(find_sessions(str(folder))[0], LocalEngine(workers=1))
    imbalance = _finding(session, "multi_gpu_imbalance")
    assert not {"straggler_host_op", "aligned_collectives_per_step"} & imbalance["metrics"].keys()
    assert "cannot be told apart from transfer" in _finding(session, "collectives")["summary"]


def test_compare_shows_the_exposed_collectives_an_overlap_fix_moved(tmp_path):
    """The overlap pair compared: the collectives' whole time stays (8 x 0.8 ms reduce-scatters and
    8 x 0.4 ms gathers either way, 9.6 ms per step) while the part with no compute alongside falls
    by the 7 reduce-scatters now beside backward kernels, 5.6 ms per step."""
    from tb_gpuadvisor.compare import _device_deltas
    before = _session(tmp_path / "exposed", overlap=False)
    after = _session(tmp_path / "overlapped", overlap=True)
    rows = {row["part"]: row for row in _device_deltas(before, after, (1.0, 1.0))}
    assert rows["collectives with no compute alongside"]["delta_ms"] == pytest.approx(-5.6, abs=0.05)
    assert abs(rows["collectives (NCCL/RCCL)"]["delta_ms"]) < 0.1


def _calls(starts_ms: list[float], ends_ms: list[float], ops: dict[str, float] | None = None):
    """One rank's calls, all one all-reduce class in session step 0, and its host ops (ms in step 0)."""
    from tb_gpuadvisor.checks._ranks import RankCalls
    n = len(starts_ms)
    start = (np.array(starts_ms) * PS_PER_MS).astype(np.int64)
    end = (np.array(ends_ms) * PS_PER_MS).astype(np.int64)
    ops = ops or {}
    table = (np.array([[v] for v in ops.values()]) * PS_PER_MS).astype(np.int64).reshape(len(ops), 1)
    return RankCalls(["all-reduce group 0"], np.zeros(n, np.int32), start, end, np.zeros(n, np.int32), end - start,
                     list(ops), table)


def test_calls_split_on_their_ends_whatever_the_clocks():
    """Rank 1's clock runs 100 ms ahead. Call 1: rank 0 starts at 10, rank 1 at 115 (15 on rank 0's
    clock); both end at 20: rank 1 arrived last, its 5 ms kernel is the transfer and rank 0 waited
    5 ms. Call 2: both start 30 and end 32 (no waiting). Rank 1's backward op took 9 ms against 4."""
    from tb_gpuadvisor.checks._ranks import host_reason, late_host_gain, split
    ranks = [_calls([10, 30], [20, 32], {"aten::mm": 4.0, "autograd::engine::evaluate_function: MmBackward0": 4.0}),
             _calls([115, 130], [120, 132], {"aten::mm": 4.0, "autograd::engine::evaluate_function: MmBackward0": 9.0})]
    found = split(ranks, 1)
    assert found.calls == 2 and found.straggler == 1
    assert found.wait[:, 0] / PS_PER_MS == pytest.approx([5.0, 0.0])
    assert found.transfer[:, 0] / PS_PER_MS == pytest.approx([7.0, 7.0])
    assert (found.offsets[1] - found.offsets[0]) / PS_PER_MS == pytest.approx(100.0)
    reason = host_reason(ranks, 1)
    assert reason.op == "autograd::engine::evaluate_function: MmBackward0" and reason.others_ms == pytest.approx(4.0)
    # Its 5 ms of extra host time would let rank 1 arrive 5 ms earlier: rank 0 waited 5 ms, so all of it.
    assert late_host_gain(ranks, 1)[3] / PS_PER_MS == pytest.approx([5.0])


def test_calls_that_do_not_end_together_are_not_matched():
    """Same count of calls, but rank 1's end 7, 12 and 1 ms after rank 0's: with the median offset
    (7 ms) out, two of the three still end 5 and 6 ms apart, so the n-th call is not the same
    collective on both and nothing is split."""
    from tb_gpuadvisor.checks._ranks import split
    ranks = [_calls([10, 30, 50], [20, 32, 60]), _calls([10, 40, 52], [27, 44, 61])]
    assert split(ranks, 1) is None


def test_calls_outside_the_session_steps_are_never_matched():
    """Each rank's second call lies outside every session step (step -1): only the first ones,
    both in step 0, are one collective."""
    from tb_gpuadvisor.checks._ranks import split
    ranks = [_calls([10, 30], [20, 32]), _calls([12, 31], [20, 32])]
    for r in ranks:
        r.step[1] = -1
    found = split(ranks, 1)
    assert found.calls == 1 and found.wait[:, 0] / PS_PER_MS == pytest.approx([2.0, 0.0])


def _gloo_rank(late: bool, steps: int = 4) -> dict:
    """One CPU rank of a 2-rank gloo DDP job, 10 ms steps (ms from the step's start): the batch
    (0-0.2), forward and backward ops (3 ms), the gradient all-reduce on gloo's thread, the optimizer
    (9-10). The LATE rank idles 5 ms after its batch (0.2-5.2, no op: host overhead), computes
    5.2-8.2 and reaches the all-reduce last (8.2-9.0: the transfer); the other computes 0.2-3.2 and
    waits in it from 3.2 to 9.0."""
    ops = [("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation", 7, 0.0, 0.2),
           ("aten::addmm", "cpu_op", 7, 5.2 if late else 0.2, 3.0),
           ("gloo:all_reduce", "user_annotation", 9, 8.2 if late else 3.2, 0.8 if late else 5.8),
           ("Optimizer.step#SGD.step", "cpu_op", 7, 9.0, 1.0)]
    events = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "python"}}]
    for n in range(steps):
        t0 = 1000.0 + 10_000.0 * n
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n + 2}", "pid": 1, "tid": 7,
                       "ts": t0, "dur": 10_000.0})
        events += [{"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": t0 + 1000 * at, "dur": 1000 * dur}
                   for name, cat, tid, at, dur in ops]
    return {"schemaVersion": 1, "traceEvents": events, "baseTimeNanoseconds": 1_700_000_000_000_000_000}


def test_a_cpu_ranks_host_overhead_gives_the_others_back_their_wait(tmp_path):
    """Hand check of the traces written: per 10 ms step rank 0 idles 5 ms with no op (its host
    overhead: fixed, it reaches the all-reduce 5 ms earlier), and rank 1 spends 5.8 ms in
    gloo:all_reduce against rank 0's 0.8 ms (the transfer), so it waits 5.0 ms there for rank 0.
    Fixed on every rank, rank 0 gains its 5 ms and rank 1 its 5 ms of waiting: 5.0 ms per step, half
    the step (critical), whichever rank is the primary; rank 1 alone has no host overhead to gain,
    which the rule before (the least any host gains alone) gave as the saving."""
    for rank in (0, 1):
        write_trace(tmp_path / "run" / f"rank{rank}.1.pt.trace.json", _gloo_rank(late=rank == 0))
    (ref,) = find_sessions(str(tmp_path))
    for hosts in (ref.hosts, ref.hosts[::-1]):
        session = analyze_session(replace(ref, hosts=hosts))
        overhead = _finding(session, "host_overhead")
        assert overhead["estimated_savings_ms_per_step"] == pytest.approx(5.0, abs=0.05), hosts
        assert overhead["severity"] == "critical"
        # Told with the numbers of rank 0, whose overhead the other waits for, whichever is the primary.
        assert overhead["metrics"]["other_idle_ms_per_step"] == pytest.approx(5.0, abs=0.05)
    assert "These numbers are rank0.1's; the saving shown, 5.00 ms per step" in overhead["summary"]
    alone = analyze_session(replace(ref, hosts=("rank1",)))
    assert _finding(alone, "host_overhead")["estimated_savings_ms_per_step"] < 0.1
