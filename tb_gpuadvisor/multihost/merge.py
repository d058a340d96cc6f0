"""The merge of a many-host session: host summaries in, one session report out.

Steps are aligned across hosts by their numbers (the same training step on every host),
else by position. The primary host (the first with a GPU that ran kernels, as in a
one-process analysis) gives the per-host findings; the cross-host ones (imbalance,
launch skew, collectives...) are judged again over every host's GPUs by each check's declared
join and judge (``CrossHost`` in checks/base.py), and every replayed saving becomes the gain all hosts allow: a step
of synchronous training ends when its slowest host does, so per step the smallest gain
of any host, or more where the fix speeds the host the others wait for at their collectives (their
waiting goes, up to its gain), plus the straggler's balance across all replicas. Where the hosts' traces name
their collective calls (PyTorch ranks), the calls are matched across hosts (checks/_ranks.py):
the straggler's balance also counts its host arriving late, and the primary host's breakdown
splits its collective time into waiting and transfer as the matched calls do.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, replace

import numpy as np

from tb_gpuadvisor.attribution.breakdown import collective_wait
from tb_gpuadvisor.attribution.replay import balance_gain
from tb_gpuadvisor.attribution.whatif import Savings
from tb_gpuadvisor.checks import Finding, Severity, _ranks, all_checks, declared, fixes
from tb_gpuadvisor.checks.context import StepScale
from tb_gpuadvisor.input.discovery import SessionRef
from tb_gpuadvisor.input import host_of
from tb_gpuadvisor.timeline import PS_PER_MS
from tb_gpuadvisor.multihost.mapper import HostSummary, replayed_across_hosts
from tb_gpuadvisor.report import finish, time_origin_ms


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

    def collective_times(self) -> np.ndarray | None:
        """Every host's replicas' collective time (ps), replicas (in host order) x session steps;
        None when a host did not measure it."""
        if not self.hosts or any(h.balance is None for h in self.hosts):
            return None
        return np.vstack([self.take(h, h.balance[1]) for h in self.hosts])

    def collective_parts_ms(self, steps: int) -> tuple[float, float] | None:
        """Collective transfer and waiting, ms per step, mean over every host's replicas: waiting is
        measured against the fastest replica of the whole session (breakdown.collective_wait)."""
        coll = self.collective_times() if steps else None
        if coll is None:
            return None
        wait = collective_wait(coll)
        return (float((coll - wait).sum(axis=1).mean()) / PS_PER_MS / steps,
                float(wait.sum(axis=1).mean()) / PS_PER_MS / steps)


class MergedWhatIf(Savings):
    """The what-if of all hosts: per step the smallest gain any host allows, or the waiting at the
    collectives a fix removes where that is more, plus balancing the straggler across every
    host's replicas."""

    def __init__(self, alignment: Alignment, durations: np.ndarray, mean_step_ms: float) -> None:
        self.checks = frozenset(c for host in alignment.hosts for c in host.standalone_ms)
        self.mean_step_ms = mean_step_ms
        self.alignment = alignment
        self.durations = durations.astype(np.float64)
        self._known: dict[frozenset[str], float] = {}    # reconcile asks for each prefix again

    @functools.cached_property
    def _balance(self) -> np.ndarray:
        """Per step the larger of two ways the straggler stops holding the others: its GPU's work
        evened out, or the op that makes its host late at the collectives brought to the others'."""
        gain = balance_gain(*_balance_inputs(self.alignment))
        late = _late_host_gain(self.alignment, gain.size)
        return gain if late is None else np.maximum(gain, late)

    @functools.cached_property
    def _waits(self) -> tuple[list[str], np.ndarray] | None:
        """Each replica's host and its waiting at the collectives per session step (ps): its exposed
        collective time beyond the least of any replica's. The hosts are ranks of one synchronous job,
        so every replica takes part in the step's collectives; one that shows none exposed hid them
        behind its own work (DDP's all-reduce beside the backward pass of the rank that came last)
        and waited nothing. None where a host did not measure its collectives."""
        coll = self.alignment.collective_times()
        if coll is None:
            return None
        owners = [h.host for h in self.alignment.hosts for _ in range(h.balance[1].shape[0])]  # type: ignore[index]
        return owners, (coll - coll.min(axis=0)).astype(np.float64)

    def _waiting_removed(self, per_host: dict[str, np.ndarray]) -> np.ndarray:
        """Per step, what every host gains when the fix (PER_HOST: each host's own gain per step) lets
        the replicas the others wait for at their collectives (those with no waiting: they arrived
        last) arrive earlier by their host's gain: the others' waiting goes, up to that gain and
        until the least-waiting of them is the last. Their own gain is not added to it: where it lies
        before their collective it only becomes more waiting, which a host's summary cannot tell."""
        zeros = np.zeros(self.durations.size)
        if self._waits is None:
            return zeros
        owners, wait = self._waits
        gain = np.vstack([per_host.get(host, zeros) for host in owners])
        return np.where(wait > 0, wait, gain).min(axis=0)

    def _gains(self, checks: frozenset[str]) -> np.ndarray:
        hosts = [h for h in self.alignment.hosts if h.combined]
        if not hosts or not self.durations.size:
            return np.zeros(self.durations.size)
        across = replayed_across_hosts()
        wanted = checks - across
        # Per host the combination itself, else the largest one it replayed that it contains.
        per_host = {h.host: self.alignment.take(h, h.combined[max((k for k in h.combined if k <= wanted), key=len)])
                    for h in hosts}
        gain = np.vstack(list(per_host.values())).min(axis=0)
        freed = np.clip(self._waiting_removed(per_host) - gain, 0.0, None)
        if checks & across:     # both are the others' waiting: the larger counts, never their sum
            gain = gain + np.maximum(freed, self._balance)
        else:                   # what the cross-host checks claim of it stays theirs
            gain = gain + np.clip(freed - self._claimed, 0.0, None)
        return np.minimum(gain, self.durations)

    @functools.cached_property
    def _claimed(self) -> np.ndarray:
        """Per step, the others' waiting the cross-host checks claim (the straggler's balance, and its
        late host op), where they judge the replicas: GPUs. CPU ranks have no such finding, so the
        waiting a fix of theirs frees is that fix's."""
        if any(h.primary_gpu is not None for h in self.alignment.hosts):
            return self._balance
        return np.zeros(self.durations.size)

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


def _rank_calls(alignment: Alignment) -> tuple[list, list] | None:
    """Every host's GPUs' collective calls on the session's steps (checks/_ranks), and each GPU's
    (device, host); None when a host did not measure them."""
    parts = [(h, h.ranks) for h in alignment.hosts]
    if not parts or any(p is None for _, p in parts):
        return None
    calls = _ranks.join_calls(alignment, [(h, p.calls, p.windows) for h, p in parts])
    if calls is None or any(c is None for c in calls):
        return None
    return calls, [d for _, p in parts for d in p.devices]


def _late_host_gain(alignment: Alignment, steps: int) -> np.ndarray | None:
    """Per session step, the gain of the late rank's host op at the others' median, from every
    host's collective calls; None when they cannot be matched."""
    joined = _rank_calls(alignment) if steps else None
    found = _ranks.late_host_gain(joined[0], steps) if joined is not None else None
    return None if found is None else found[3]


def _waiting_in_breakdown(out: dict, alignment: Alignment, primary: HostSummary) -> None:
    """The primary host's breakdown with its collective time split as the matched calls split it
    (waiting for the last rank, then transfer), where the ranks' calls match: alone, a host
    cannot tell its waiting from its transfer, and one microsecond has one cause."""
    joined = _rank_calls(alignment)
    if not (out.get("breakdown") or {}).get("steps") or joined is None:
        return
    calls, devices = joined
    found = _ranks.split(calls, alignment.numbers.size)
    mine = [i for i, (_, host) in enumerate(devices) if host == primary.host]
    if found is None or not mine:
        return
    breakdown = out["breakdown"] = copy.deepcopy(out["breakdown"])     # the host summary's stays as it was
    session_step = {int(n): i for i, n in enumerate(alignment.numbers.tolist())}
    by_device = {devices[i][0]: found.wait[i] / PS_PER_MS for i in mine}
    wait_ms = by_device.get(breakdown.get("device"), found.wait[mine[0]] / PS_PER_MS)
    for step in breakdown["steps"]:
        at = session_step.get(int(step["step"]))
        if at is not None:
            _move_to_waiting(step, float(wait_ms[at]))
    kept = [session_step[int(st["step"])] for st in breakdown["steps"] if int(st["step"]) in session_step]
    for row in breakdown.get("per_device", []):
        if row.get("host") == primary.host and row.get("device") in by_device and kept:
            _move_to_waiting(row, float(by_device[row["device"]][kept].sum()) / len(breakdown["steps"]))


def _move_to_waiting(row: dict, wait_ms: float) -> None:
    """Of ROW's collective transfer, WAIT_MS (at most all of it) becomes waiting."""
    moved = min(wait_ms, row.get("collective_transfer_ms", 0.0))
    row["collective_wait_ms"] = round(row.get("collective_wait_ms", 0.0) + moved, 3)
    row["collective_transfer_ms"] = round(row["collective_transfer_ms"] - moved, 3)


@dataclass
class MergedAnalysis(StepScale):
    """What report.finish needs of a session, for hosts joined by their summaries."""

    what_if: MergedWhatIf
    mean_step_ms: float
    steps_count: int


def _cross_host(alignment: Alignment, primary: HostSummary, scale: MergedAnalysis,
                framework: str) -> dict[str, Finding]:
    """The cross-host checks judged over every host's GPUs (each check's declared join and
    judge), with the primary's confidence."""
    out: dict[str, Finding] = {}
    for check in all_checks():
        if check.cross_host is None:
            continue
        parts = [(h, h.parts.get(check.id)) for h in alignment.hosts]
        joined = check.cross_host.join(alignment, primary, parts, scale.steps_count)
        finding = check.cross_host.judge(joined, scale) if joined is not None else None
        if finding is not None:
            out[check.id] = finding
    own = {f.check: f for f in primary.findings}
    for check_id, finding in out.items():
        finding.fixes = fixes.for_framework(finding.fixes, framework)
        mine = own.get(check_id)
        if mine is not None and mine.severity is not Severity.NOT_APPLICABLE:
            finding.confidence, finding.confidence_reasons = mine.confidence, list(mine.confidence_reasons)
        else:
            finding.confidence = "medium"
            finding.confidence_reasons = ["compared across hosts from per-host summaries; each host's own "
                                          "GPUs could not be compared with each other"]
    return out


# A saving that all hosts together allow this much less (or more) of than the primary host alone is
# said in the finding's text, beside the primary's own numbers.
SAID_LOSS_MS = 0.01


def _rescaled(finding: Finding, primary: HostSummary, hosts: list[HostSummary], merged: MergedWhatIf,
              scale: MergedAnalysis) -> tuple[Finding, HostSummary]:
    """A primary-host finding with its saving as all hosts allow it (a replayed cause gains only
    what the slowest host gains, or the others' waiting at the collectives it removes) and its
    severity judged on that saving: lowered when it is smaller, raised as far as it earns against
    the step when it is larger (an actionable finding only: an info one stays as its host judged it).
    Where all hosts gain more than the primary alone, the fix frees the others' waiting: the finding
    told is that of the host (of HOSTS) that gains most alone, whose cause they waited for. With the
    host whose numbers it tells."""
    check = finding.check
    if check not in primary.standalone_ms or check in replayed_across_hosts():
        return finding, primary
    host = primary
    if merged.saving_ms(check) - primary.standalone_ms[check] >= SAID_LOSS_MS:
        host = max((h for h in hosts if check in h.standalone_ms), key=lambda h: h.standalone_ms[check])
        if host is not primary:
            finding = next((f for f in host.findings if f.check == check), finding)
    own = finding.estimated_savings_ms_per_step
    lost = host.standalone_ms[check] - merged.saving_ms(check)
    saving = max(0.0, own - lost)
    summary = finding.summary
    said = abs(lost) >= SAID_LOSS_MS
    if (said or host is not primary) and max(own, saving) > 0:
        # The text measured host HOST alone; the saving shown beside it is what every host allows.
        why = ("the least any host gains" if lost >= SAID_LOSS_MS else
               "the other hosts stop waiting at their collectives for the hosts it speeds up")
        summary += (f" These numbers are {host.host}'s; the saving shown, {saving:.2f} ms per step, is what "
                    f"the fix replayed on every host allows ({why})"
                    + (f", not {own:.2f} ms as on {host.host} alone." if said else "."))
    severity = scale.gated(finding.severity, saving)
    if saving > own and severity in (Severity.WARNING, Severity.CRITICAL):
        severity = max(severity, scale.gated(Severity.CRITICAL, saving), key=lambda s: s.weight)
    return replace(finding, estimated_savings_ms_per_step=saving, summary=summary, severity=severity), host


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


def _per_host(check: str, primary: HostSummary, good: list[HostSummary], failed: list[dict]) -> Finding | None:
    """A check judged on each host alone: the primary host's finding (the worst host's where the
    session is as bad as its worst host), with every other host's per-device evidence."""
    found = [(s, f) for s in good for f in s.findings if f.check == check]
    if not found:
        return None
    mine = next(f for s, f in found if s is primary) if any(s is primary for s, _ in found) else found[0][1]
    base = mine
    declaration = declared(check)
    if declaration is not None and declaration.worst_host:
        base = max((f for _, f in found), key=lambda f: f.severity.weight)   # the first of the worst
        if base.severity.weight == mine.severity.weight:
            base = mine
    evidence = list(base.evidence) + [e for _, f in found if f is not base for e in f.evidence if e.kind == "device"]
    finding = replace(base, evidence=evidence)
    if declaration is None:
        return finding
    summed = {k: sum(f.metrics.get(k) or 0 for _, f in found) for k in declaration.per_host.summed if k in base.metrics}
    if summed:
        finding = replace(finding, metrics=dict(base.metrics, **summed))
    if failed and declaration.per_host.unreadable is not None:
        finding = declaration.per_host.unreadable(finding, failed)
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
    # The host of the session's primary GPU (SessionModel.primary_gpu: the first, in host order,
    # of each host's own); without GPUs (a TPU pod), the first host whose devices ran anything.
    primary = (next((s for s in good if s.primary_gpu is not None), None)
               or next((s for s in good if any(d.get("active") for d in s.out["devices"])), good[0]))
    out = dict(primary.out)
    out["hosts"] = [s.host for s in good]
    out["devices"] = [d for s in good for d in s.out["devices"]]
    out["warnings"] = [w for s in good for w in s.out["warnings"]]
    alignment = Alignment.of(good)
    out["time_origin_ms"] = time_origin_ms(alignment.origin_ns)   # evidence is shifted onto it below
    durations = (alignment.take(primary, primary.durations)
                 if primary.host in alignment.index and primary.durations is not None else np.empty(0))
    mean_ms = float(durations.mean()) / PS_PER_MS if durations.size else 0.0
    if primary.durations is not None and durations.size < primary.durations.size:
        out["warnings"].append(f"{durations.size} of the primary host's {primary.durations.size} steps ran on "
                               "every host; the cross-host findings compare those")
    merged = MergedWhatIf(alignment, durations, mean_ms)
    per_marker = primary.training_steps / primary.durations.size if primary.durations is not None else 1
    # The step the report's header and the primary's findings describe: all of its trusted steps, also
    # where fewer ran on every host (the cross-host gains are means over those).
    own_ms = (float(primary.durations.mean()) / PS_PER_MS if primary.durations is not None and primary.durations.size
              else mean_ms)
    scale = MergedAnalysis(merged, own_ms, round(durations.size * per_marker))
    failed = [e for s in summaries if not s.analysed for e in s.errors]
    findings = [_per_host(f.check, primary, good, failed) or f for f in primary.findings]
    # Evidence times from the clock of the host whose numbers the finding tells onto the session's.
    findings = [_shift_evidence(found, (host.origin_ns - alignment.origin_ns) / 1e6)
                for found, host in (_rescaled(f, primary, good, merged, scale) for f in findings)]
    joined = _cross_host(alignment, primary, scale, out["framework"]) if len(alignment.hosts) > 1 else {}
    if len(alignment.hosts) > 1:
        _waiting_in_breakdown(out, alignment, primary)
    findings = [joined.get(f.check, f) for f in findings]
    return finish(out, findings, errors, scale)   # type: ignore[arg-type]
