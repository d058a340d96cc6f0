"""Ranks set side by side on their collective calls (shared by multi_gpu_imbalance and collectives).

Each rank of a data-parallel job is one host of the session (one trace file), so its clock may
differ from the others' by an offset, and the merge sees only small per-host summaries. What a
host keeps of each GPU (``RankCalls``) is every collective call that the whole group runs (kind
and process group as the trace names them; point-to-point send/recv left out, since its peers are
not every rank), with its kernel's start and end on the host clock, and the host's busiest ops
per step. The n-th call of one kind and group in one session step is the same collective on
every rank. An NCCL collective ends at about the same moment on every rank, so:

- the clock offset of a rank is the median, over matched calls, of its end time less the
  calls' median end; with the offsets out, calls that still end apart are not one collective
  (other groups, a point-to-point schedule), and ranks whose calls mostly do not are not matched;
- the rank whose kernel of a call is shortest arrived last: the others launched theirs earlier
  and waited. The shortest kernel is the call's transfer; what each rank spent beyond it is
  waiting for the last rank. As in the breakdown, only time with no compute alongside is
  counted, once: exposed waiting, and exposed transfer (the rest of the exposed time).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from tb_gpuadvisor.model import intervals, kernels
from tb_gpuadvisor.kinds import HostEventKind
from tb_gpuadvisor.stages import Memo
from tb_gpuadvisor.timeline import PS_PER_US, DeviceActivity, SessionModel

# What the rank measurement derives from a device table and asks for again (see stages.Memo).
_MEMO = Memo()

# Kinds of call that join every rank of their group (a send/recv joins two).
GROUP_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "broadcast", "reduce")
# Matched calls are one collective when their ends, clock offsets taken out, lie within this (or this
# share of the call's shortest kernel); the ranks are matched when this share of their calls is.
END_TOLERANCE_PS, END_TOLERANCE_SHARE, MATCHED_SHARE = 50 * PS_PER_US, 0.1, 0.8
# Spans of the packed call ids: steps per class, calls of one class per step.
CLASSES_SPAN, CALLS_SPAN = 1 << 24, 1 << 24
# Host ops kept per host: the busiest names, enough that a straggler's slow op is on every rank's list.
TOP_OPS = 48


@dataclass
class RankCalls:
    """One GPU's group collectives in run order, and its host's busiest framework ops per step."""

    keys: list[str]             # "kind group" of each distinct call class
    key: np.ndarray             # int32 per call: index into keys
    start_ps: np.ndarray        # int64 kernel start, host clock
    end_ps: np.ndarray          # int64 kernel end, host clock
    step: np.ndarray            # int32 step window of the call (a session step after the merge's join)
    exposed_ps: np.ndarray      # int64 of its kernel time, the part with no compute kernel alongside
    ops: list[str]              # host op names
    op_ps: np.ndarray           # ops x step windows: time in each op per step


def measure(dev: DeviceActivity, model: SessionModel) -> RankCalls | None:
    """DEV's group collective calls inside the steps (None when the trace does not name its calls'
    kinds, as TensorFlow's and JAX's do not, or it has none); measured once per device (both
    multi_gpu_imbalance and collectives ask)."""
    memo = _MEMO.of(dev)
    if "rank_calls" not in memo:
        memo["rank_calls"] = _measure(dev, model)
    return memo["rank_calls"]


def _measure(dev: DeviceActivity, model: SessionModel) -> RankCalls | None:
    if not dev.collectives or not len(model.steps) or dev.step.size != len(dev):
        return None
    classes = [(c.kind, f"{c.kind} {c.group or ''}".strip()) for c in dev.collectives]
    group_call = np.array([kind in GROUP_KINDS for kind, _ in classes], bool)
    rows = kernels.classify(dev).collective & (dev.step >= 0) & (dev.collective >= 0)
    rows &= group_call[np.maximum(dev.collective, 0)]
    if not rows.any():
        return None
    order = np.flatnonzero(rows)[np.argsort(dev.start_ps[rows], kind="stable")]
    compute = kernels.classify(dev).kernel & (dev.step >= 0)
    alongside = intervals.union(dev.start_ps[compute], dev.end_ps[compute])
    calls = intervals.union(dev.start_ps[order], dev.end_ps[order])
    exposed = intervals.per_bin_total(intervals.subtract(calls, alongside), dev.start_ps[order], dev.end_ps[order])
    ops, op_ps = _host_ops(model, dev.device.host)
    return RankCalls([key for _, key in classes], dev.collective[order].astype(np.int32),
                     dev.start_ps[order].astype(np.int64), dev.end_ps[order].astype(np.int64),
                     dev.step[order].astype(np.int32), exposed.astype(np.int64), ops, op_ps)


def _host_ops(model: SessionModel, host_name: str) -> tuple[list[str], np.ndarray]:
    """The TOP_OPS framework ops of the host with the most time inside steps, per step (ps)."""
    steps = len(model.steps)
    host = next((h for h in model.hosts if h.name == host_name), None)
    act = host.activity if host is not None else None
    if act is None or act.step.size != len(act):
        return [], np.zeros((0, steps), np.int64)
    rows = (act.kind == HostEventKind.FRAMEWORK_OP) & (act.step >= 0)
    if not rows.any():
        return [], np.zeros((0, steps), np.int64)
    names, steps_of, dur = act.name[rows].astype(np.int64), act.step[rows].astype(np.int64), act.dur_ps[rows]
    totals = np.bincount(names, weights=dur, minlength=len(act.names))
    top = np.argsort(-totals, kind="stable")[:TOP_OPS]
    top = top[totals[top] > 0]
    slot = np.full(len(act.names), -1, np.int64)
    slot[top] = np.arange(top.size)
    keep = slot[names] >= 0
    table = np.bincount(slot[names][keep] * steps + steps_of[keep], weights=dur[keep], minlength=top.size * steps)
    return [act.names[int(i)] for i in top], table.reshape(top.size, steps).astype(np.int64)


def on_session_steps(calls: RankCalls, windows: np.ndarray) -> RankCalls:
    """CALLS with their steps renumbered as session steps (WINDOWS: the host window of each
    session step; calls in other windows get -1) and the op table's columns in that order."""
    session_of = np.full(int(max(calls.step.max(initial=-1), windows.max(initial=-1))) + 2, -1, np.int64)
    session_of[windows] = np.arange(windows.size)
    step = np.where(calls.step >= 0, session_of[calls.step], -1).astype(np.int32)
    return replace(calls, step=step, op_ps=calls.op_ps[:, windows] if calls.op_ps.size else
                   np.zeros((len(calls.ops), windows.size), np.int64))


@dataclass
class Split:
    """Collective calls matched on every rank, and what they say about each rank (ps)."""

    calls: int                  # calls matched on every rank
    steps: int
    transfer: np.ndarray        # ranks x steps: exposed kernel time that is not waiting (the transfer)
    wait: np.ndarray            # ranks x steps: exposed kernel time beyond the call's shortest kernel
                                # (waiting for the last rank; what compute hides is not counted)
    last: np.ndarray            # int per matched call: the rank that arrived last
    caused: np.ndarray          # per matched call: the others' mean wait for the last rank
    offsets: np.ndarray         # per rank: its clock less the session's, from the calls' ends
    others_wait: np.ndarray     # per rank x step: the least any other rank waited (what arriving earlier gives)
    call_key: list[str]         # per matched call: its class ("kind group")
    call_step: np.ndarray       # per matched call: its session step
    call_wait: np.ndarray       # ranks x calls: kernel time beyond the call's transfer
    call_exposed: np.ndarray    # ranks x calls: kernel time with no compute alongside

    @property
    def blame(self) -> np.ndarray:
        """Per rank, the others' wait at the calls it arrived last to."""
        return np.bincount(self.last, weights=self.caused, minlength=self.wait.shape[0])

    @property
    def straggler(self) -> int | None:
        """The rank the others waited for longest over all calls (None: nobody waited)."""
        blame = self.blame
        return int(np.argmax(blame)) if blame.max() > 0 else None

    def last_share(self, rank: int) -> tuple[int, int]:
        """(calls RANK arrived last to while the others waited, calls where anyone waited)."""
        waited = self.caused > 0
        return int(np.count_nonzero(waited & (self.last == rank))), int(np.count_nonzero(waited))


def split(ranks: list[RankCalls | None], steps: int) -> Split | None:
    """The calls every rank ran (same class, session step and order within it) that end together
    once the clocks' offsets are out, split into transfer and waiting; None when fewer than two
    ranks share any call, or too few of the shared ones end together to be the same collectives."""
    if len(ranks) < 2 or not steps or any(r is None for r in ranks):
        return None
    names: dict[str, int] = {}
    ids = [_call_ids(r, names) for r in ranks]
    common = ids[0]
    for table in ids[1:]:
        common = np.intersect1d(common, table)
    common = common[common >= 0]
    if not common.size:
        return None
    # ranks x calls: each common call's index in the rank's calls; the calls in step, then run order
    rows = np.vstack([np.argsort(table, kind="stable")[np.searchsorted(np.sort(table), common)] for table in ids])
    order = np.argsort(ranks[0].start_ps[rows[0]], kind="stable")
    rows = rows[:, order]
    start = np.vstack([r.start_ps[i] for r, i in zip(ranks, rows)]).astype(np.int64)
    end = np.vstack([r.end_ps[i] for r, i in zip(ranks, rows)]).astype(np.int64)
    offsets = np.median(end - np.median(end, axis=0), axis=1)
    # Calls that are one collective end together once the clocks' offsets are taken out; where they
    # do not, the n-th call is not the same one on every rank (other groups, point-to-point peers).
    ends = end - offsets[:, None]
    spread = ends.max(axis=0) - ends.min(axis=0)
    same = spread <= np.maximum(END_TOLERANCE_PS, END_TOLERANCE_SHARE * (end - start).min(axis=0))
    if same.mean() < MATCHED_SHARE:
        return None
    rows, start, end = rows[:, same], start[:, same], end[:, same]
    step = ranks[0].step[rows[0]].astype(np.int64)
    calls = rows.shape[1]
    dur = end - start
    exposed = np.vstack([r.exposed_ps[i] for r, i in zip(ranks, rows)]).astype(np.int64)
    # Waiting that compute hides costs nothing: only the exposed part counts (as in the breakdown).
    wait = np.minimum(dur - dur.min(axis=0), exposed)
    last = np.argmin(dur, axis=0)
    n = len(ranks)
    caused = (wait.sum(axis=0) - wait[last, np.arange(calls)]) / (n - 1)
    per_step = lambda table: np.vstack([np.bincount(step, weights=row, minlength=steps)  # noqa: E731
                                        for row in table.astype(np.float64)])
    wait_steps = per_step(wait)
    others = np.vstack([np.delete(wait_steps, r, axis=0).min(axis=0) for r in range(n)])
    keys = ranks[0].keys
    return Split(calls, steps, per_step(exposed - wait), wait_steps, last, caused,
                 offsets, others, [keys[k] for k in ranks[0].key[rows[0]].tolist()], step, wait, exposed)


def _call_ids(calls: RankCalls, names: dict[str, int]) -> np.ndarray:
    """Per call of CALLS, one number for (class, session step, n-th of its class in the step), the
    same for the same call on every rank (NAMES numbers the classes across ranks); negative for
    calls outside the session's steps, which are never matched."""
    cls = np.array([names.setdefault(k, len(names)) for k in calls.keys], np.int64)[calls.key]
    step = calls.step.astype(np.int64)
    n = cls.size
    order = np.lexsort((np.arange(n), step, cls))
    group = cls[order] * (int(step.max(initial=0)) + 2) + step[order]
    first = np.r_[True, group[1:] != group[:-1]] if n else np.empty(0, bool)
    at = np.arange(n)
    nth = np.empty(n, np.int64)
    nth[order] = at - np.maximum.accumulate(np.where(first, at, 0))
    ids = (cls * CLASSES_SPAN + step) * CALLS_SPAN + nth
    return np.where(step >= 0, ids, -1 - at)


@dataclass
class HostReason:
    """The op on the late rank's host that the other ranks do not spend as long in."""

    op: str
    late_ms: np.ndarray         # per step, the late rank's time in it (ms)
    others_ms: float            # the other ranks' median per step (ms)
    excess_ps: np.ndarray       # per step, the late rank's time beyond the others' median (ps)


def host_reason(ranks: list[RankCalls], late: int) -> HostReason | None:
    """The framework op with the most time per step on rank LATE's host beyond the other ranks'
    median (an op missing from a rank's list counts 0 there); None when none exceeds it."""
    mine = ranks[late]
    if not mine.ops:
        return None
    others = [r for i, r in enumerate(ranks) if i != late]
    steps = mine.op_ps.shape[1]
    best: HostReason | None = None
    for name, row in zip(mine.ops, mine.op_ps):
        theirs = [r.op_ps[r.ops.index(name)] if name in r.ops else np.zeros(steps, np.int64) for r in others]
        median = np.median(np.vstack(theirs), axis=0) if theirs else np.zeros(steps)
        excess = np.clip(row - median, 0, None)
        if excess.sum() > 0 and (best is None or excess.sum() > best.excess_ps.sum()):
            best = HostReason(name, row / 1e9, float(median.mean()) / 1e9, excess)
    return best


def join_calls(alignment, hosts: list[tuple[object, list[RankCalls | None] | None, int]]
               ) -> list[RankCalls | None] | None:
    """Every host's GPUs' calls on the session's steps (HOSTS: host, its GPUs' calls, its number of
    step windows); None when a host does not name its calls (nothing to align)."""
    out: list[RankCalls | None] = []
    for host, calls, windows in hosts:
        if calls is None:
            return None
        where = alignment.take(host, np.arange(windows))
        out += [None if c is None else replace(on_session_steps(c, where),
                                               start_ps=alignment.on_session_clock(host, c.start_ps),
                                               end_ps=alignment.on_session_clock(host, c.end_ps)) for c in calls]
    return out


def late_host_gain(ranks: list[RankCalls | None] | None,
                   steps: int) -> tuple[Split, int, HostReason, np.ndarray] | None:
    """Per step (ps), what the step gains when the rank the others wait for at their calls brings the
    op that makes it late on its host to the other ranks' median: it arrives that much earlier, up to
    the least any other rank waits for it (then that rank is the last). With the split, the late rank
    and the op; None when the ranks cannot be matched, nobody waits, or no host op explains it."""
    if not ranks or any(r is None for r in ranks):
        return None
    found = split(ranks, steps)         # type: ignore[arg-type]
    if found is None:
        return None
    late = found.straggler
    if late is None:
        return None
    reason = host_reason(ranks, late)   # type: ignore[arg-type]
    if reason is None:
        return None
    return found, late, reason, host_gain(found, late, reason)


def host_gain(found: Split, late: int, reason: HostReason) -> np.ndarray:
    """Per step (ps): rank LATE arrives earlier by its op's excess, until another rank is the last."""
    return np.minimum(reason.excess_ps, found.others_wait[late]).astype(np.float64)
