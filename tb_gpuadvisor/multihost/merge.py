"""The merge of a many-host session: host summaries in, one session report out.

Steps are aligned across hosts by their numbers (the same training step on every host),
else by position. The primary host (the first with a GPU that ran kernels, as in a
one-process analysis) gives the per-host findings; the cross-host ones (imbalance,
launch skew, collectives) are judged again over every host's GPUs by the checks' own
``judge`` functions, and every replayed saving becomes the gain all hosts allow: a step
of synchronous training ends when its slowest host does, so per step the smallest gain
of any host, plus the straggler's balance across all replicas.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np

from tb_gpuadvisor.attribution.breakdown import collective_wait
from tb_gpuadvisor.attribution.replay import balance_gain
from tb_gpuadvisor.attribution.whatif import Savings
from tb_gpuadvisor.checks import (
    Finding, Severity, collectives, fixes, launch_skew, multi_gpu_imbalance, precision, profile_quality,
    tensor_core,
)
from tb_gpuadvisor.checks.context import StepScale
from tb_gpuadvisor.discovery import SessionRef
from tb_gpuadvisor.adapters import host_of
from tb_gpuadvisor.model.timeline import PS_PER_MS
from tb_gpuadvisor.multihost.mapper import BALANCE, HostSummary
from tb_gpuadvisor.report import finish


@dataclass
class Alignment:
    """Which step window of each host is which session step (hosts without windows left out),
    and the session's clock: the earliest host origin."""

    hosts: list[HostSummary]
    index: dict[str, np.ndarray]     # host -> its window of each session step
    numbers: np.ndarray
    origin_ns: int

    @classmethod
    def of(cls, summaries: list[HostSummary]) -> "Alignment":
        origin = min((s.origin_ns for s in summaries), default=0)
        hosts = [s for s in summaries if s.numbers is not None and s.numbers.size]
        if not hosts:
            return cls([], {}, np.empty(0, np.int64), origin)
        common = hosts[0].numbers
        for host in hosts[1:]:
            common = np.intersect1d(common, host.numbers)
        if common.size:
            index = {}
            for h in hosts:         # the first window of each common number
                order = np.argsort(h.numbers, kind="stable")
                index[h.host] = order[np.searchsorted(h.numbers[order], common)]
            return cls(hosts, index, common, origin)
        # Numbers that never meet (each host counts its own way): line the windows up in order.
        n = min(h.numbers.size for h in hosts)
        return cls(hosts, {h.host: np.arange(n) for h in hosts}, hosts[0].numbers[:n], origin)

    def take(self, host: HostSummary, table: np.ndarray) -> np.ndarray:
        """TABLE's columns (host windows) in session-step order."""
        return table[..., self.index[host.host]]

    def on_session_clock(self, host: HostSummary, times: np.ndarray) -> np.ndarray:
        """HOST's times (ps from its own origin) from the session's origin."""
        return times + (host.origin_ns - self.origin_ns) * 1000

    def windows(self, host: HostSummary, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """HOST's step windows [lo, hi) as the session's steps, on the session's clock."""
        return self.on_session_clock(host, self.take(host, lo)), self.on_session_clock(host, self.take(host, hi))


class MergedWhatIf(Savings):
    """The what-if of all hosts: per step the smallest gain any host allows, plus balancing
    the straggler across every host's replicas."""

    def __init__(self, alignment: Alignment, durations: np.ndarray, mean_step_ms: float) -> None:
        self.checks = frozenset(c for host in alignment.hosts for c in host.standalone_ms)
        self.mean_step_ms = mean_step_ms
        self.alignment = alignment
        self.durations = durations.astype(np.float64)
        self._known: dict[frozenset[str], float] = {}    # reconcile asks for each prefix again

    @functools.cached_property
    def _balance(self) -> np.ndarray:
        return balance_gain(*_balance_inputs(self.alignment))

    def _gains(self, checks: frozenset[str]) -> np.ndarray:
        hosts = [h for h in self.alignment.hosts if h.combined]
        if not hosts or not self.durations.size:
            return np.zeros(self.durations.size)
        wanted = checks - {BALANCE}
        # Per host the combination itself, else the largest one it replayed that it contains.
        gain = np.vstack([self.alignment.take(h, h.combined[max((k for k in h.combined if k <= wanted), key=len)])
                          for h in hosts]).min(axis=0)
        if BALANCE in checks:
            gain = gain + self._balance
        return np.minimum(gain, self.durations)

    def combined_ms(self, check_ids: list[str]) -> float:
        known = frozenset(c for c in check_ids if c in self.checks)
        if not known:
            return 0.0
        if known not in self._known:
            gains = self._gains(known)
            self._known[known] = float(gains.mean()) / PS_PER_MS if gains.size else 0.0
        return self._known[known]


def _balance_inputs(alignment: Alignment) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every host's replicas, stacked, their work ends moved onto the session clock."""
    parts = [(alignment.take(h, busy), alignment.take(h, coll),
              np.where(ends >= 0, alignment.on_session_clock(h, alignment.take(h, ends)), -1.0))
             for h in alignment.hosts if h.balance is not None
             for busy, coll, ends in [h.balance]]
    if not parts:
        return np.zeros((0, 0)), np.zeros((0, 0)), np.zeros((0, 0))
    return tuple(np.vstack([p[i] for p in parts]) for i in range(3))   # type: ignore[return-value]


@dataclass
class MergedAnalysis(StepScale):
    """What report.finish needs of a session, for hosts joined by their summaries."""

    what_if: MergedWhatIf
    mean_step_ms: float
    steps_count: int


def _join_imbalance(alignment: Alignment, parts: list) -> multi_gpu_imbalance.Replicas | None:
    measured = [(h, r) for h, r in parts if isinstance(r, multi_gpu_imbalance.Replicas)]
    if not measured:
        return None
    first_host, first = measured[0]
    serial, offset = [], 0
    for _, r in measured:
        serial += [(a + offset, b + offset, share) for a, b, share in r.serial_pairs]
        offset += len(r.labels)
    return multi_gpu_imbalance.Replicas(
        [label for _, r in measured for label in r.labels], [d for _, r in measured for d in r.devices],
        np.vstack([alignment.take(h, r.per_step) for h, r in measured]),
        *alignment.windows(first_host, first.lo, first.hi),
        min(r.min_overlap for _, r in measured), serial, max(r.combined_busy_ps for _, r in measured),
        [item for _, r in measured for item in r.idle], sum(r.planes for _, r in measured),
        [d for _, r in measured for d in r.partial_used])


def _join_skew(alignment: Alignment, parts: list) -> launch_skew.StepStarts | None:
    measured = [(h, s) for h, s in parts if isinstance(s, launch_skew.StepStarts)]
    if not measured:
        return None
    first_host, first = measured[0]
    firsts = [np.where(s.firsts != launch_skew.NO_KERNEL,
                       alignment.on_session_clock(h, alignment.take(h, s.firsts)), launch_skew.NO_KERNEL)
              for h, s in measured]
    threads = [item for _, s in measured for item in s.threads]
    labels = [label for _, s in measured for label in s.labels]
    return launch_skew.StepStarts(
        labels, [d for _, s in measured for d in s.devices], np.vstack(firsts),
        *alignment.windows(first_host, first.lo, first.hi),
        launch_skew.top_threads(threads, len(labels)))


def _replica_parts_ms(alignment: Alignment, steps: int) -> tuple[float, float] | None:
    """Collective transfer and waiting, ms per step, mean over every host's replicas: waiting is
    measured against the fastest replica of the whole session (breakdown.collective_wait)."""
    if not steps or any(h.balance is None for h in alignment.hosts):
        return None
    coll = np.vstack([alignment.take(h, h.balance[1]) for h in alignment.hosts])
    wait = collective_wait(coll)
    return (float((coll - wait).sum(axis=1).mean()) / PS_PER_MS / steps,
            float(wait.sum(axis=1).mean()) / PS_PER_MS / steps)


def _join_collectives(alignment: Alignment, parts: list, steps: int) -> collectives.Collectives | None:
    measured = [(h, c) for h, c in parts if isinstance(c, collectives.Collectives)]
    if not measured:
        return None
    # Each host's longest call onto the session clock (its evidence links into the trace).
    shifted = [row if row.longest is None else replace(row, longest=(
                   *row.longest[:2], *map(int, alignment.on_session_clock(h, np.array(row.longest[2:])))))
               for h, c in measured for row in c.rows]
    measured = [c for _, c in measured]
    transfer_ms, waiting_ms = _replica_parts_ms(alignment, steps) or (
        sum(c.transfer_ms * len(c.rows) for c in measured) / len(shifted),
        sum(c.waiting_ms * len(c.rows) for c in measured) / len(shifted))
    return collectives.Collectives(shifted, measured[0].windows, measured[0].step_ps, transfer_ms, waiting_ms,
                                   next((c.param_bytes for c in measured if c.param_bytes), None))


def _per_primary_windows(primary: HostSummary, parts: list, kind: type) -> tuple[int, list[tuple[float, HostSummary, object]]]:
    """The primary host's number of step windows, and the measured parts of KIND with the factor
    that brings each host's totals to it (hosts may have captured different numbers of steps)."""
    measured = [(h, p) for h, p in parts if isinstance(p, kind)]
    windows = next((p.windows for h, p in measured if h is primary), measured[0][1].windows if measured else 1)
    return windows, [(windows / p.windows, h, p) for h, p in measured]


def _join_precision(primary: HostSummary, parts: list) -> precision.Precision | None:
    windows, scaled = _per_primary_windows(primary, parts, precision.Precision)
    if not scaled:
        return None
    gpus = [replace(g, total_ps=round(g.total_ps * k), low_ps=round(g.low_ps * k),
                    eligible32_ps=round(g.eligible32_ps * k),
                    offenders=[(name, round(ps * k), n) for name, ps, n in g.offenders])
            for k, _, p in scaled for g in p.gpus]
    return precision.Precision(gpus, windows)


def _join_tensor_cores(alignment: Alignment, primary: HostSummary, parts: list) -> tensor_core.TensorCores | None:
    windows, scaled = _per_primary_windows(primary, parts, tensor_core.TensorCores)
    if not scaled:
        return None
    gpus = [replace(g, eligible_ps=round(g.eligible_ps * k), tc_ps=round(g.tc_ps * k),
                    missing_ps=round(g.missing_ps * k), compute_ps=round(g.compute_ps * k),
                    layout_ps=round(g.layout_ps * k),
                    layout_first_ps=int(alignment.on_session_clock(h, np.int64(g.layout_first_ps))),
                    ops={name: replace(op, time_ps=round(op.time_ps * k)) for name, op in g.ops.items()})
            for k, h, p in scaled for g in p.gpus]
    return tensor_core.TensorCores(gpus, windows)


def _cross_host(alignment: Alignment, primary: HostSummary, scale: MergedAnalysis,
                framework: str) -> dict[str, Finding]:
    """The cross-host checks judged over every host's GPUs, with the primary's confidence."""
    hosts = alignment.hosts
    imbalance = _join_imbalance(alignment, [(h, h.imbalance) for h in hosts])
    skew = _join_skew(alignment, [(h, h.skew) for h in hosts])
    coll = _join_collectives(alignment, [(h, h.collectives) for h in hosts], scale.steps_count)
    kinds = _join_precision(primary, [(h, h.precision) for h in hosts])
    cores = _join_tensor_cores(alignment, primary, [(h, h.tensor_cores) for h in hosts])
    out: dict[str, Finding] = {}
    if imbalance is not None and len(imbalance.labels) >= 2:
        out[multi_gpu_imbalance.CHECK_ID] = multi_gpu_imbalance.judge(
            imbalance, scale.what_if.saving_ms(BALANCE), scale)
    if skew is not None and len(skew.labels) >= 2:
        out[launch_skew.CHECK_ID] = launch_skew.judge(skew)
    if coll is not None and len(coll.rows) >= 2:
        out[collectives.CHECK_ID] = collectives.judge(coll, scale)
    shared = scale.what_if.saving_ms(precision.CHECK_ID)
    if kinds is not None:
        out[precision.CHECK_ID] = precision.judge(kinds, shared, scale)
    if cores is not None:
        out[tensor_core.CHECK_ID] = tensor_core.judge(cores, scale.what_if.saving_ms(tensor_core.CHECK_ID), shared, scale)
    own = {f.check: f for f in primary.findings}
    for check, finding in out.items():
        finding.fixes = fixes.for_framework(finding.fixes, framework)
        mine = own.get(check)
        if mine is not None and mine.severity is not Severity.NOT_APPLICABLE:
            finding.confidence, finding.confidence_reasons = mine.confidence, list(mine.confidence_reasons)
        else:
            finding.confidence = "medium"
            finding.confidence_reasons = ["compared across hosts from per-host summaries; each host's own "
                                          "GPUs could not be compared with each other"]
    return out


def _rescaled(finding: Finding, host: HostSummary, merged: MergedWhatIf, scale: MergedAnalysis) -> Finding:
    """A primary-host finding with its saving as all hosts allow it (a replayed cause gains only
    what the slowest host gains) and its severity judged on that saving."""
    check = finding.check
    if check not in host.standalone_ms or check == BALANCE:
        return finding
    lost = host.standalone_ms[check] - merged.saving_ms(check)
    saving = max(0.0, finding.estimated_savings_ms_per_step - max(lost, 0.0))
    return replace(finding, estimated_savings_ms_per_step=saving, severity=scale.gated(finding.severity, saving))


def _shift_evidence(finding: Finding, delta_ms: float) -> Finding:
    """Evidence times from the primary host's clock onto the session's."""
    if not delta_ms:
        return finding
    evidence = [replace(item, start_ms=None if item.start_ms is None else round(item.start_ms + delta_ms, 3),
                        end_ms=None if item.end_ms is None else round(item.end_ms + delta_ms, 3))
                for item in finding.evidence]
    return replace(finding, evidence=evidence)


def failed_session(ref: SessionRef, errors: list[dict]) -> dict:
    """The contract session object of a session nothing could be learnt from."""
    return {"run": ref.run, "session": ref.session, "hosts": list(ref.hosts), "framework": "unknown",
            "devices": [], "steps": {"count": 0, "source": "none"}, "findings": [], "first_fix": None,
            "errors": errors, "warnings": []}


# The session is as bad as its worst host for these: each host judges its own devices and capture.
WORST_HOST = ("memory", profile_quality.CHECK_ID)
# Counts of the capture that add up over hosts.
SUMMED_METRICS = ("gpu_count", "active_gpu_count", "dropped_events")


def _per_host(check: str, primary: HostSummary, good: list[HostSummary], failed: list[dict]) -> Finding | None:
    """A check judged on each host alone: the primary host's finding (the worst host's where the
    session is as bad as its worst host), with every other host's per-device evidence."""
    found = [(s, f) for s in good for f in s.findings if f.check == check]
    if not found:
        return None
    mine = next(f for s, f in found if s is primary) if any(s is primary for s, _ in found) else found[0][1]
    base = mine
    if check in WORST_HOST:
        base = max((f for _, f in found), key=lambda f: f.severity.weight)   # the first of the worst
        if base.severity.weight == mine.severity.weight:
            base = mine
    evidence = list(base.evidence) + [e for _, f in found if f is not base for e in f.evidence if e.kind == "device"]
    finding = replace(base, evidence=evidence)
    if check == profile_quality.CHECK_ID:
        finding.metrics = dict(base.metrics, **{k: sum(f.metrics.get(k) or 0 for _, f in found)
                                               for k in SUMMED_METRICS if k in base.metrics})
        if failed:
            issue = profile_quality.unreadable(failed)
            finding.summary += " " + issue.text
            if finding.severity.weight < issue.severity.weight:
                finding.severity, finding.title = issue.severity, issue.title
    return finding


def merge(ref: SessionRef, summaries: list[HostSummary]) -> dict:
    """The session report of REF from its hosts' summaries (in REF's host order)."""
    errors = [{"host": host_of(name), "file": name, "message": why} if name else {"message": why}
              for name, why in ref.skipped]
    for summary in summaries:
        errors += [dict(e, host=e.get("host", summary.host)) for e in summary.errors]
    good = [s for s in summaries if s.analysed]
    if not good:
        return failed_session(ref, errors or [{"message": "no host of this session could be analysed"}])
    primary = next((s for s in good if any(d.get("active") for d in s.out["devices"])), good[0])
    out = dict(primary.out)
    out["hosts"] = [s.host for s in good]
    out["devices"] = [d for s in good for d in s.out["devices"]]
    out["warnings"] = [w for s in good for w in s.out["warnings"]]
    alignment = Alignment.of(good)
    durations = (alignment.take(primary, primary.durations)
                 if primary.host in alignment.index and primary.durations is not None else np.empty(0))
    mean_ms = float(durations.mean()) / PS_PER_MS if durations.size else 0.0
    if primary.durations is not None and durations.size < primary.durations.size:
        out["warnings"].append(f"{durations.size} of the primary host's {primary.durations.size} steps ran on "
                               "every host; the cross-host findings compare those")
    merged = MergedWhatIf(alignment, durations, mean_ms)
    per_marker = primary.training_steps / primary.durations.size if primary.durations is not None else 1
    scale = MergedAnalysis(merged, mean_ms, round(durations.size * per_marker))
    delta_ms = (primary.origin_ns - alignment.origin_ns) / 1e6
    failed = [e for s in summaries if not s.analysed for e in s.errors]
    findings = [_per_host(f.check, primary, good, failed) or f for f in primary.findings]
    findings = [_shift_evidence(_rescaled(f, primary, merged, scale), delta_ms) for f in findings]
    joined = _cross_host(alignment, primary, scale, out["framework"]) if len(alignment.hosts) > 1 else {}
    findings = [joined.get(f.check, f) for f in findings]
    return finish(out, findings, errors, scale)   # type: ignore[arg-type]
