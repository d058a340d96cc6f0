"""What-if replay: the step time predicted with one cause removed or shrunk.

Each device's in-step events form a dependency chain, rebuilt from the capture:

- **device order**: an event starts when the device has finished what came before it
  (all streams merged; an event's share of busy time is the part no earlier event
  covered, so overlapping streams replay to the same busy time);
- **host release**: an event that started after the device had gone idle waited for
  something on the host (its launch returned late, the input arrived, Python ran): it
  is *anchored* at its observed start, shifted by the host time a scenario removes
  before it in the step (a time warp of the host's timeline). An event whose launch
  (joined by ``correlation_id``) returned before the device was free is only held back
  by that launch; one whose launch returned later, or without a launch, by nothing
  but device order. Without launch records, a device gap longer than
  ``ANCHOR_GAP_PS`` anchors the event;
- **synchronisation**: the host waits for the device in synchronize calls (not in a
  stream's wait for an event, which holds only that stream), in PyTorch's blocking copies
  (``.item()``, ``.cpu()``, pageable ``.to(device)``: a copy whose call returned only once it
  had begun) and for device-to-host copies; what it releases after such a wait moves with
  the device: it resumes when both it reached the wait and the device reached the point
  waited for. A call that launched several events (a CUDA graph replay, which the adapter
  marks as first use when it takes a millisecond or more) released them as it began;
- **replicas**: collectives join the replicas of a step, so a step ends when its
  slowest device ends (the gain of a step is the smallest gain of its devices), and
  a straggler's extra work is what the others wait for inside their collectives.

The chain is the max-plus recurrence ``end[i] = max(release[i], end[i-1]) + d[i]``,
solved in one pass over the events (``intervals.chain_ends``; in numpy, with ``S`` the
running sum of ``d``, ``end[i] = S[i] + max(release[j] - S[j-1] for j <= i)``).
Replayed unchanged it reproduces the observed busy time exactly; a scenario changes
durations (faster kernels, hidden copies) or releases (host time removed), and the
gain of each step is how much earlier its last event ends, plus the host time removed
after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from tb_gpuadvisor import cores
from tb_gpuadvisor.arrays import Runs, kept_mask, reduce_by_key
from tb_gpuadvisor.vocab import pytorch
from tb_gpuadvisor.attribution.breakdown import Breakdown, DeviceBreakdown, collective_wait, fp32_eligible
from tb_gpuadvisor.model import intervals as iv
from tb_gpuadvisor.model.intervals import Intervals
from tb_gpuadvisor.model import kernels
from tb_gpuadvisor.model.steps import launch_rows
from tb_gpuadvisor.timeline import PS_PER_MS, PS_PER_US, DeviceActivity, HostModel, SessionModel
from tb_gpuadvisor.kinds import COPY_KINDS, DeviceEventKind, HostEventKind
from tb_gpuadvisor.vocab.gpu import HOST_WAIT_CALL
from tb_gpuadvisor.stages import Memo

# What this stage derives from the tables and asks for again (see stages.Memo).
_MEMO = Memo()

ANCHOR_GAP_PS = 5 * PS_PER_US
# Each round of the replay carries a gain across one more wait (host -> device -> host ...); a step
# with N waits needs up to N + 1 rounds (an eager PyTorch step can sync a hundred times). Rounds stop
# when nothing moves; this bounds a pathological capture.
MAX_SYNC_ROUNDS = 4096
_FREE = np.int64(-(1 << 60))     # release of an event held back by nothing but device order


@dataclass(frozen=True)
class Scenario:
    """One cause removed or shrunk.

    ``idle``: device-idle category -> fraction of its time the fix removes from the host's
    timeline; ``faster``: kernel class -> speed-up of its kernels ("fp32_eligible",
    "off_tensor_core", "fp64", "cuda_core_fp32", "tf32", "unfused"; 0 means each device's own Tensor Core speed-up); ``hide_copies``: copies overlap compute (their exposed time goes);
    ``balance``: the straggler's work brought to the median replica.
    """

    idle: dict[str, float] = field(default_factory=dict)
    faster: dict[str, float] = field(default_factory=dict)
    hide_copies: bool = False
    balance: bool = False

    def __add__(self, other: "Scenario") -> "Scenario":
        idle = dict(self.idle)
        for key, fraction in other.idle.items():
            idle[key] = max(idle.get(key, 0.0), fraction)
        faster = dict(self.faster)
        for key, speedup in other.faster.items():
            faster[key] = max(faster[key], speedup) if key in faster else speedup
        return Scenario(idle, faster, self.hide_copies or other.hide_copies, self.balance or other.balance)


@dataclass
class _Chain:
    """One device's in-step events in start order, ready to replay."""

    step: np.ndarray            # int32 step index per event
    release: np.ndarray         # int64: the observed start of an event the host released after the
                                # device went idle, its launch's end, or _FREE (device order only)
    d: np.ndarray               # int64 duration in the chain: the event's own share plus the device-side
                                # gap folded into it when the host did not hold it back (what no scenario
                                # changes); OWN itself when no gap is folded (the host holds every event back)
    own: np.ndarray             # the event's exclusive share of busy time
    classes: dict[str, np.ndarray]
    speedup: float
    running_end: np.ndarray | None  # observed end of the device's work up to each event, where the
                                    # rounds of a replay start; None when no held event follows a wait
    sync_index: np.ndarray      # int32 per event: the wait the host last returned from before releasing it, -1
                                # (a read-only -1 for every event when none follows a wait)
    sync_start: np.ndarray      # per wait: when the host reached it
    sync_end: np.ndarray        # per wait: when it returned
    sync_event: np.ndarray      # per wait: the last event finished by then (what the host waited for)
    base_end: np.ndarray        # per step, the replayed end of its last event (-1 without events)


@dataclass
class _Held:
    """A chain's events the host holds back, and its waits (scenario-independent)."""

    anchored: np.ndarray | None  # int32 indices of the held events; None when the host holds every event
    observed: np.ndarray        # their observed releases
    wait: np.ndarray            # int32: the wait each last returned from in its step, -1
    after: np.ndarray           # wait >= 0
    resume: np.ndarray          # int32: when the host last resumed before each: an index into the step
                                # starts followed by the wait ends (the chain's steps when none follows a wait)
    # Only when some held event follows a wait, per wait:
    previous: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # the step's previous wait, -1
    waits: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))     # waits inside a step
    runs: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))      # where each step's waits begin
    since: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))     # host resumed (step start or previous wait)
    reached: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))   # host reached the wait
    event: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))     # last event finished by then
    base_resume: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    rounds: int = 1             # replay rounds that carry a gain across every wait of a step


def _sync_calls(host: HostModel) -> np.ndarray:
    """The host's synchronize calls inside steps (those that hold the host), shared by every device
    of the host."""
    activity = host.activity
    calls = _MEMO.of(activity).get("host_wait_calls")
    if calls is None:
        calls = _MEMO.of(activity)["host_wait_calls"] = kept_mask(
            kernels.named_events(activity, "host_wait", HOST_WAIT_CALL.search) & (activity.step >= 0))
    return calls


_COPIES = np.array([kind for kind in COPY_KINDS if kind != DeviceEventKind.MEMSET], np.int8)


def shared_launches(call: np.ndarray) -> np.ndarray:
    """Per event, whether its launch call (CALL: a row, -1 for none) launched other events too: a
    CUDA graph replay. Sorted, not counted per row: the host table can be far longer than CALL.
    Calls usually come in launch order already, and then need no sort (0.1 s of CPU at 1 GB)."""
    ordered = call[call >= 0]
    if np.any(ordered[1:] < ordered[:-1]):
        ordered = np.sort(ordered)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    return np.isin(call, repeated) if repeated.size else np.zeros(call.shape, bool)


def _launch_calls(host: HostModel, dev: DeviceActivity, rows: slice | np.ndarray) -> np.ndarray:
    """For the events ROWS of ``dev``, the row of the host launch call with its correlation id
    (-1: none), from the join trust made (``steps.launch_rows``: the first host event with the id)."""
    activity = host.activity
    row = launch_rows(activity, dev)[rows]
    launched = row >= 0
    # Host calls that put device work on a stream: launches, and launch calls that took a millisecond
    # or more, which the adapters mark as set-up a warmed-up step does not pay (a first launch that
    # loaded its kernel) or as slow launches (a CUDA graph launched at once, a blocking copy), but
    # which still released that work. Compares: np.isin on int8 costs 15x more.
    kind = activity.kind[row[launched]]
    launched[launched] = ((kind == HostEventKind.LAUNCH) | (kind == HostEventKind.FIRST_USE)
                          | (kind == HostEventKind.SLOW_LAUNCH))
    return np.where(launched, row, -1)


def _in_step_rows(dev: DeviceActivity) -> slice | np.ndarray:
    """The rows of DEV's events inside steps: a slice when they follow each other (the usual
    case), so that the chain's columns are views of the device's, not copies."""
    rows = np.flatnonzero(dev.step >= 0)
    if rows.size and int(rows[-1]) - int(rows[0]) + 1 == rows.size:
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return rows


def _chain(dev: DeviceActivity, host: HostModel, n_steps: int, torch_names: bool) -> _Chain:
    # Built for several devices at once, on threads: each part's temporaries go when it returns.
    rows = _in_step_rows(dev)
    step, start, end = dev.step[rows], dev.start_ps[rows], dev.end_ps[rows]
    running = np.maximum.accumulate(end)
    call = _launch_calls(host, dev, rows)
    release, d, own = _releases(host, call, step, start, running)
    sync_start, sync_end = _waits(host, start, end, dev.kind[rows],
                                  call if torch_names else np.broadcast_to(np.int64(-1), call.shape))
    # Each wait stands for the device work finished by its end; each anchored event for the last wait before it.
    sync_event = np.searchsorted(running, sync_end, side="right") - 1
    sync_index, follows_wait = _last_waits(release, step, sync_end, sync_event)
    chain = _Chain(step, release, d, own, _classes(dev, rows, torch_names), kernels.tensor_core_speedup(dev.device),
                   running if follows_wait else None, sync_index,
                   sync_start, sync_end, sync_event, np.empty(0, np.int64))
    chain.base_end = _last_end(chain, iv.chain_ends(release, chain.d), n_steps)
    return chain


def _releases(host: HostModel, call: np.ndarray, step: np.ndarray, start: np.ndarray,
              running: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(release, chained duration, own share) of each in-step event, CALL its launch call's row
    or -1 (see _Chain)."""
    before = np.empty_like(running)
    before[:1] = start[:1]
    before[1:] = running[:-1]
    gap = np.maximum(start - before, 0)
    own = running - np.maximum(start, before)       # the part of the event past what ran before it
    np.maximum(own, 0, out=own)
    linked = call >= 0
    # A call that put several events on the device (a CUDA graph replay) released them as it began:
    # its kernels start while it still runs, and after the first only device order holds them back.
    graph = shared_launches(call)
    # Indexed only where linked: a trace of device activity alone has no host rows to point at.
    # The shared calls' starts gathered only for them: most captures have none, and each gather
    # from the host table is a random read of it (0.07 s of CPU at 1 GB for both columns).
    launch_end = np.full(call.shape, -1, np.int64)
    launch_end[linked] = host.activity.end_ps[call[linked]]
    shared = np.flatnonzero(graph)      # linked, as their calls repeat
    launch_end[shared] = host.activity.start_ps[call[shared]]
    # Waited for the host: a gap opened and the launch (when known) returned after the device was free.
    anchored = np.where(linked, (gap > 0) & (launch_end > before), gap > ANCHOR_GAP_PS)
    del before
    # A step starts its own chain: the host hands each step its work (Keras and custom loops read
    # the step's results before starting the next), so no gain carries over into the next step.
    anchored[:1] = True
    anchored[1:] |= step[1:] != step[:-1]
    if anchored.all():
        release = start         # a view of the device's starts
    else:
        release = np.where(anchored, start, np.where(linked & (launch_end < start), launch_end, _FREE))
    folded = np.where(anchored, 0, gap)
    return release, own + folded if folded.any() else own, own


def _classes(dev: DeviceActivity, rows: slice | np.ndarray, torch_names: bool) -> dict[str, np.ndarray]:
    """The in-step events' kernel classes a scenario speeds up."""
    cls = kernels.classify(dev)
    classes = {
        "fp32_eligible": fp32_eligible(cls)[rows],
        "off_tensor_core": (cls.eligible & ~cls.tensor_core)[rows],
        "copy": dev.mask(*COPY_KINDS)[rows],
    }
    if torch_names:
        # Precision classes of PyTorch kernel names: float64, and fp32 GEMMs on CUDA cores of a GPU
        # with TF32 (TF32 left off); only PyTorch's precision scenario speeds them up.
        fp64, cuda_core, tf32 = kernels.torch_precision_masks(dev)
        classes.update(fp64=(cls.kernel & fp64)[rows], cuda_core_fp32=(cls.kernel & cuda_core)[rows],
                       tf32=tf32[rows])
        # Chains of small eager element-wise kernels (kernels.unfused_chains): what torch.compile fuses.
        classes["unfused"] = kernels.unfused_chains(dev)[rows]
    return classes


def _last_waits(release: np.ndarray, step: np.ndarray, sync_end: np.ndarray,
                sync_event: np.ndarray) -> tuple[np.ndarray, bool]:
    """(int32 per event: the wait of its own step the host last returned from before releasing
    it, else -1; whether any event follows a wait). Without one, a read-only -1 for every event."""
    if sync_end.size and step.size:
        last_wait = np.searchsorted(sync_end, release, side="right") - 1
        at = np.clip(last_wait, 0, None)
        same_step = (last_wait >= 0) & (sync_event[at] >= 0) & (step[np.clip(sync_event, 0, None)][at] == step)
        # Row numbers of one table fit int32 (as the launch table's rows do).
        index = np.where((release > _FREE) & same_step, last_wait, -1).astype(np.int32)
        if np.any(index >= 0):
            return index, True
    return np.broadcast_to(np.int32(-1), release.shape), False


def _waits(host: HostModel, begin: np.ndarray, end: np.ndarray, kind: np.ndarray,
           call: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of the host's waits for the device, in end order: synchronize calls, copies
    whose call returned only once they had begun, and the other device-to-host copies, among the
    events from BEGIN to END (CALL: their launch calls' rows, -1 where unknown). A blocking copy held
    the host for the whole call (``.item()``, ``.cpu()``, ``.to(device)`` from pageable memory: it
    waits for the work queued before it on its stream); the data of a D2H copy the host consumes
    when it lands. Only PyTorch's copy calls are known to block (TensorFlow's _Send/_Recv copies
    return at once, whatever their call overlaps): the others' CALL is all -1."""
    activity = host.activity
    calls = _sync_calls(host)
    # Whose launch call returned after the event began (indexed only where linked: a trace of
    # device activity alone has no host rows).
    linked = np.flatnonzero(call >= 0)
    late = np.zeros(call.shape, bool)
    late[linked] = activity.end_ps[call[linked]] > begin[linked]
    copy = np.flatnonzero(late)         # none where no call is known (TensorFlow, JAX): no isin over all
    copy = copy[np.isin(kind[copy], _COPIES)]
    landed = end[(kind == DeviceEventKind.MEMCPY_D2H) & ~late]
    start = np.concatenate((activity.start_ps[calls], activity.start_ps[call[copy]], landed))
    end = np.concatenate((activity.end_ps[calls], activity.end_ps[call[copy]], landed))
    order = np.argsort(end, kind="stable")
    return start[order], end[order]


def _released(chain: _Chain, held: _Held, shift: np.ndarray) -> np.ndarray:
    """CHAIN's releases with each held event released SHIFT (ps) earlier."""
    moved = held.observed - np.rint(shift).astype(np.int64)
    if held.anchored is None:      # every event is held
        return moved
    release = chain.release.copy()
    release[held.anchored] = moved
    return release


def _carried_min(cost: np.ndarray, cap: np.ndarray, runs: np.ndarray) -> np.ndarray:
    """shift[k] = min(shift[k-1] + cost[k], cap[k]) along each run of waits starting at RUNS
    (nothing carried into a run's first), one step's run at a time: unrolled, shift[k] is the
    run's sum of cost up to k plus the smallest of 0 and cap[j] - that sum at j, for j <= k."""
    out = np.empty(cost.size)
    bounds = np.append(runs, cost.size)
    for a, b in zip(bounds[:-1], bounds[1:]):
        total = np.cumsum(cost[a:b])
        out[a:b] = total + np.minimum(np.minimum.accumulate(cap[a:b] - total), 0.0)
    return out


def _last_end(chain: _Chain, ends: np.ndarray, n_steps: int) -> np.ndarray:
    return reduce_by_key(np.maximum, np.full(n_steps, -1, np.int64), chain.step, ends)


class Replay:
    """The dependency chains of every measured device, replayed per scenario."""

    def __init__(self, model: SessionModel, breakdown: Breakdown) -> None:
        self.steps = breakdown.steps
        self.breakdown = breakdown
        hosts = {host.name: host for host in model.hosts}
        by_name = {(dev.device.host, dev.device.name): dev for dev in model.devices}
        n = len(self.steps)
        torch_names = model.framework == pytorch.FRAMEWORK
        pairs = [(by_name.get((part.host, part.name)) if breakdown.device_kind != "cpu" else None, hosts[part.host])
                 for part in breakdown.devices]
        pairs = [(dev, host) if dev is not None and dev.step.size == len(dev) and bool(np.any(dev.step >= 0))
                 else (None, host) for dev, host in pairs]
        # Before the devices go on threads: each one's join to its launch calls (trust's step
        # columns made it already) and its host's synchronize calls, which they share.
        for dev, host in pairs:
            if dev is not None:
                launch_rows(host.activity, dev)
        for host in {id(host): host for dev, host in pairs if dev is not None}.values():
            _sync_calls(host)
        self.chains: list[_Chain | None] = cores.on_threads(
            lambda dev, host: _chain(dev, host, n, torch_names) if dev is not None else None, pairs)
        # Removable time per (device, category, kind of window): the windows of a chain do not
        # depend on the scenario, so each is measured once and scenarios only weigh them. A
        # window per held event mostly changes at few events (kept as Runs: 0.2 GB less at 1 GB).
        self._windows: dict[tuple[int, str, str], "Runs | np.ndarray"] = {}
        self._gains: dict[str, np.ndarray] = {}
        self._device_gains: dict[str, np.ndarray] = {}
        self._held_by: dict[int, _Held] = {}

    def _removed(self, part: DeviceBreakdown, scenario: Scenario, lo: np.ndarray, hi: np.ndarray,
                 tag: str) -> np.ndarray:
        """Host time the scenario removes inside each window [lo, hi); TAG names the (fixed)
        windows for the cache."""
        return self._removed_by(part, scenario, tag, lo.size,
                                lambda removable: iv.per_bin_total(removable, lo, np.maximum(hi, lo)))

    def _removed_by(self, part: DeviceBreakdown, scenario: Scenario, tag: str, size: int,
                    measure: Callable[[Intervals], np.ndarray]) -> np.ndarray:
        """Host time the scenario removes inside each of SIZE windows, which MEASURE gives for
        one removable set; TAG names the (fixed) windows for the cache."""
        out = np.zeros(size, np.float64)
        removable = dict(scenario.idle)
        if scenario.hide_copies:
            removable["copy"] = 1.0
        for key, fraction in removable.items():
            if fraction > 0 and key in part.sets:
                cached = self._windows.get((id(part), key, tag))
                if cached is None:
                    cached = self._windows[(id(part), key, tag)] = Runs.packed(measure(part.sets[key]))
                out += fraction * Runs.dense(cached)
        return out

    def _held_removed(self, part: DeviceBreakdown, chain: _Chain, held: _Held, scenario: Scenario) -> np.ndarray:
        """Host time the scenario removes between the host's last resume and each held event's
        release (windows [resumed, max(observed, resumed))). The resumes are step starts and wait
        ends, so the set's covered length is found at those few times and gathered."""
        resumes = np.concatenate((self.steps.start_ps, chain.sync_end))

        def measure(removable: Intervals) -> np.ndarray:
            covered = iv.covered_until(removable, held.observed)
            covered -= iv.covered_until(removable, resumes)[held.resume]
            return np.maximum(covered, 0, out=covered)
        return self._removed_by(part, scenario, "held", held.observed.size, measure)

    def _device_gain(self, part: DeviceBreakdown, chain: _Chain | None, scenario: Scenario) -> np.ndarray:
        a, b = self.steps.start_ps, self.steps.end_ps
        if chain is None:
            return self._removed(part, scenario, a, b, "step")
        ends = self._replay_chain(part, chain, scenario, self._durations(chain, scenario))
        last = _last_end(chain, ends, len(self.steps))
        has = chain.base_end >= 0
        tail_from = np.where(has, chain.base_end, a)
        gain = np.where(has, chain.base_end - last, 0).astype(np.float64)
        return np.maximum(gain + self._removed(part, scenario, np.minimum(tail_from, b), b, "tail"), 0.0)

    def _durations(self, chain: _Chain, scenario: Scenario) -> np.ndarray:
        """CHAIN's event durations under SCENARIO; a scenario that changes none (it only removes
        host time) replays the chain's own."""
        if not scenario.faster and not scenario.hide_copies:
            return chain.d
        own = chain.own.astype(np.float64)
        if scenario.faster:
            speedup = np.ones(own.size)        # a kernel in several sped-up classes is sped up once
            for key, value in scenario.faster.items():
                np.maximum(speedup, value if value > 0 else chain.speedup, out=speedup, where=chain.classes[key])
            own /= speedup
        gap = chain.d - chain.own
        if scenario.hide_copies:
            own[chain.classes["copy"]] = 0.0
            gap[chain.classes["copy"]] = 0
        own += gap
        return np.rint(own, out=own).astype(np.int64)

    def _held(self, chain: _Chain) -> "_Held":
        """CHAIN's held events and waits: what does not depend on the scenario, found once."""
        held = self._held_by.get(id(chain))
        if held is None:
            a = self.steps.start_ps
            held_back = chain.release > _FREE
            every = bool(held_back.all())       # the chain's own columns then, not copies
            anchored = None if every else np.flatnonzero(held_back).astype(np.int32)
            wait = chain.sync_index if every else chain.sync_index[anchored]
            after = wait >= 0
            # Stored only once complete: checks replay their scenarios from several threads.
            # The host last resumed at the step start, or at the end of its last wait in the step
            # (int32 as the step and wait indices are).
            steps = chain.step if every else chain.step[anchored]
            resume = np.where(after, len(self.steps) + wait, steps) if after.any() else steps
            held = _Held(anchored, chain.release if every else chain.release[anchored], wait, after, resume)
            if after.any():
                # Waits in step order: each one's predecessor in its step, and the host time removed between.
                event = chain.sync_event
                step = np.where(event >= 0, chain.step[np.clip(event, 0, None)], -1)
                previous = np.full(step.size, -1)
                same = np.flatnonzero(step[1:] == step[:-1]) + 1
                previous[same] = same - 1
                held.previous, held.waits = previous, np.flatnonzero(step >= 0)
                held.runs = np.flatnonzero(previous[held.waits] < 0)
                held.since = np.where(previous >= 0, chain.sync_end[np.clip(previous, 0, None)],
                                      a[np.clip(step, 0, None)])
                held.reached = np.maximum(chain.sync_start, held.since)
                held.event = np.clip(event, 0, None)
                held.base_resume = np.maximum(chain.sync_start, chain.running_end[held.event])
                held.rounds = min(int(np.bincount(step[step >= 0]).max(initial=0)) + 1, MAX_SYNC_ROUNDS)
            self._held_by[id(chain)] = held
        return held

    def _replay_chain(self, part: DeviceBreakdown, chain: _Chain, scenario: Scenario,
                      durations: np.ndarray) -> np.ndarray:
        """Replayed ends of CHAIN's events with DURATIONS; releases follow the host's timeline
        with the scenario's host time removed and, after a wait, the device's replayed progress."""
        held = self._held(chain)
        own_shift = self._held_removed(part, chain, held, scenario)
        if not held.after.any():
            return iv.chain_ends(_released(chain, held, own_shift), durations)
        removed = self._removed(part, scenario, held.since, held.reached, "waits")
        host_cost = held.base_resume - chain.sync_start + removed      # what an earlier arrival adds to the shift
        ends = chain.running_end
        wait_of = np.clip(held.wait, 0, None)
        waits, runs = held.waits, held.runs
        for _ in range(held.rounds):
            device = held.base_resume - ends[held.event]  # how much earlier the device got there
            shift = np.zeros(held.previous.size)
            shift[waits] = _carried_min(host_cost[waits], device[waits], runs)
            total = own_shift + np.where(held.after, shift[wait_of], 0.0)
            new_ends = iv.chain_ends(_released(chain, held, total), durations)
            if np.array_equal(new_ends, ends):
                break
            ends = new_ends
        return ends

    def balance_inputs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per replica and step: busy time outside collectives, collective time (transfer and
        waiting), and where its work ended (-1 where unknown); what ``balance_gain`` needs,
        small enough to send on."""
        devices = self.breakdown.devices
        n = len(self.steps)
        busy = np.vstack([dev.part("compute") + dev.part("copy") for dev in devices]).astype(np.float64)
        coll = np.vstack([dev.part("collective") for dev in devices]).astype(np.int64)
        ends = np.vstack([chain.base_end if chain is not None else np.full(n, -1) for chain in self.chains])
        return busy, coll, ends.astype(np.float64)

    def gains(self, scenario: Scenario) -> np.ndarray:
        """Per step, how much shorter the step is predicted to be under SCENARIO (ps)."""
        key = repr(scenario)
        if key not in self._gains:
            self._gains[key] = self._replay(scenario)
        return self._gains[key]

    def device_gains(self, scenario: Scenario) -> np.ndarray:
        """Per step, the gain every measured device allows (the smallest), before balancing."""
        key = repr(replace(scenario, balance=False))
        if key not in self._device_gains:
            per_device = np.vstack(cores.on_threads(lambda part, chain: self._device_gain(part, chain, scenario),
                                                    zip(self.breakdown.devices, self.chains)))
            self._device_gains[key] = per_device.min(axis=0)
        return self._device_gains[key]

    def _replay(self, scenario: Scenario) -> np.ndarray:
        n = len(self.steps)
        if not n or not self.breakdown.devices:
            return np.zeros(n)
        gain = self.device_gains(scenario)
        if scenario.balance and len(self.breakdown.devices) >= 2:
            gain = gain + balance_gain(*self.balance_inputs())
        return np.minimum(gain, self.steps.duration_ps.astype(np.float64))

    def gain_ms(self, scenario: Scenario) -> float:
        """The mean per-step gain of SCENARIO, in ms."""
        gains = self.gains(scenario)
        return float(gains.mean()) / PS_PER_MS if gains.size else 0.0


def balance_gain(busy: np.ndarray, coll: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per step: the stragglers brought to the median replica's work (replicas x steps inputs).

    The replica that waited least in its collectives arrived last; each other one arrived
    earlier by its wait. Evened out, every replica above the median does the median's
    non-collective work and arrives earlier by its work above the median; the step gains
    until the replica that now arrives last does, i.e. the smallest of wait + excess over
    the replicas. Several replicas carrying the extra work (a slower host's GPUs) all come
    down together; a replica late for another reason (a late launch) still caps the gain.
    """
    if busy.shape[0] < 2 or not busy.shape[1]:
        return np.zeros(busy.shape[1])
    wait = collective_wait(coll).astype(np.float64)
    if not wait.any():
        wait = ends.max(axis=0) - ends      # how long each replica's work ended before the last one's
    excess = np.clip(busy - np.median(busy, axis=0), 0.0, None)
    return np.clip((wait + excess).min(axis=0), 0.0, None)
