"""Interval algebra on numpy arrays of [start, end) picosecond intervals.

Busy time, idle gaps and overlaps are all unions, intersections and
differences of interval sets; doing them with sorted arrays keeps the
analyses linear in the number of events.
"""

from __future__ import annotations

import numpy as np

try:        # the one-pass C versions (optional: without a compiler the numpy ones below run)
    from tb_gpuadvisor.model import _intervals as _fast
except ImportError:
    _fast = None

Intervals = tuple[np.ndarray, np.ndarray]   # (starts, ends), sorted and disjoint after union()

EMPTY: Intervals = (np.empty(0, np.int64), np.empty(0, np.int64))

# An end before every time a capture holds (and far from overflowing when a time is subtracted).
_NEVER = np.int64(-(1 << 62))


def _fitted(out: np.ndarray, count: int) -> np.ndarray:
    """The first COUNT entries of a fresh output buffer, shrunk in place (no copy)."""
    out.resize(count, refcheck=False)
    return out


def _in_c(operation, a: Intervals, b: Intervals) -> Intervals | None:
    """A binary OPERATION of the C module on A and B, or None where it cannot run (not built,
    or inputs it does not take: the numpy path then gives the answer)."""
    if _fast is None:
        return None
    columns = [np.ascontiguousarray(x, np.int64) for x in (*a, *b)]
    size = columns[0].size + columns[2].size
    out_s, out_e = np.empty(size, np.int64), np.empty(size, np.int64)
    count = operation(*columns, out_s, out_e)
    return None if count < 0 else (_fitted(out_s, count), _fitted(out_e, count))


def union(starts: np.ndarray, ends: np.ndarray, keep: np.ndarray | None = None) -> Intervals:
    """Merge possibly overlapping intervals (the rows the boolean mask KEEP selects, when given)
    into a sorted disjoint set."""
    if _fast is not None and starts.size and (keep is None or keep.dtype == bool):
        s, e = np.ascontiguousarray(starts, np.int64), np.ascontiguousarray(ends, np.int64)
        mask = None if keep is None else np.ascontiguousarray(keep).view(np.uint8)
        size = s.size if keep is None else int(np.count_nonzero(keep))     # the most it can give
        out_s, out_e = np.empty(size, np.int64), np.empty(size, np.int64)
        count = _fast.union(s, e, mask, out_s, out_e)
        if count >= 0:          # -1: not sorted by start
            return _fitted(out_s, count), _fitted(out_e, count)
    if keep is not None:
        starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return EMPTY
    s = starts.astype(np.int64, copy=False)
    e = ends.astype(np.int64, copy=False)
    if np.any(s[1:] < s[:-1]):          # event tables are already sorted by start: skip the sort
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
    running_end = np.maximum.accumulate(e)
    # A new block starts where an interval begins after everything before it ended;
    # a block ends at the running end of its last interval.
    new_block = np.empty(s.size, bool)
    new_block[0] = True
    np.greater(s[1:], running_end[:-1], out=new_block[1:])
    first = np.flatnonzero(new_block)
    last = np.append(first[1:] - 1, s.size - 1)
    return s[first], running_end[last]


def union_of(a: Intervals, b: Intervals) -> Intervals:
    """The union of two sets sorted by start (B's intervals are merged into A's order, so
    nothing is sorted again)."""
    found = _in_c(_fast.merge_union, a, b) if _fast is not None else None
    if found is not None:
        return found
    at = np.searchsorted(a[0], b[0])
    return union(np.insert(a[0], at, b[0]), np.insert(a[1], at, b[1]))


def cut(a: Intervals, b: Intervals) -> Intervals:
    """A sorted set minus a sorted subset of it: B's ends start pieces, B's starts end them.

    Each side is a merge of two sorted runs, which the stable sort (timsort) does in one
    linear pass."""
    if not b[0].size:
        return a
    found = _in_c(_fast.cut, a, b) if _fast is not None else None
    if found is not None:
        return found
    starts = np.sort(np.concatenate((a[0], b[1])), kind="stable")
    ends = np.sort(np.concatenate((a[1], b[0])), kind="stable")
    keep = ends > starts
    return starts[keep], ends[keep]


def total(intervals: Intervals) -> int:
    starts, ends = intervals
    return int(np.sum(ends - starts))


def overlap(a: Intervals, b: Intervals) -> int:
    """Length of the intersection of two disjoint sets, without building it."""
    return int(per_bin_total(b, a[0], a[1]).sum()) if a[0].size else 0


# Up to this many sets, pairwise overlaps come from one sweep with a bitmask per time segment:
# each boundary is one int64 key, its time shifted left by _CODE_BITS and a code below (set i's
# start is i, its end 16 + i, so starts sort before ends at one time); times must fit the rest.
_SWEEP_MAX_SETS = 16
_CODE_BITS = 5
_SWEEP_MAX_TIME = 1 << (62 - _CODE_BITS)
# Passes over millions of rows run in blocks of this many, so their temporaries (8 MB) are reused
# from the heap instead of being fresh mappings whose first touch costs more than the arithmetic.
BLOCK = 1 << 20
# The change of the bitmask at each code: set i's start adds bit i, its end removes it.
_MASK_STEP = np.array([1 << i for i in range(_SWEEP_MAX_SETS)] + [-(1 << i) for i in range(_SWEEP_MAX_SETS)],
                      np.int32)


def pairwise_overlaps(sets: list[Intervals]) -> np.ndarray:
    """overlaps[i, j] = length of sets[i] & sets[j] (each set disjoint), for all pairs at once.

    One sweep over every boundary tracks which sets cover each elementary segment as a
    bitmask; the length covered by each bitmask then gives every pair's overlap.
    """
    k = len(sets)
    out = np.zeros((k, k), np.int64)
    sizes = [2 * s[0].size for s in sets]
    if not sum(sizes):
        return out
    if _fast is not None and k <= _SWEEP_MAX_SETS:     # the same sweep in one C pass, in int64
        _fast.pairwise_overlaps([(np.ascontiguousarray(a, np.int64), np.ascontiguousarray(b, np.int64))
                                 for a, b in sets], out)
        return out
    if k > _SWEEP_MAX_SETS or max(max(-int(a[0]), int(b[-1])) for a, b in sets if a.size) >= _SWEEP_MAX_TIME:
        for i in range(k):
            for j in range(i, k):
                out[i, j] = out[j, i] = overlap(sets[i], sets[j])
        return out
    # A set's touching pieces are merged first (at their shared time the next start would add
    # its bit before the end removed it). Each set's keys interleaved (start, end, start, ...)
    # then form one sorted run, so the stable sort merges k runs in place.
    sets = [union(*s) for s in sets]
    sizes = [2 * s[0].size for s in sets]
    keys = np.empty(sum(sizes), np.int64)
    first = 0
    for i, ((starts, ends), size) in enumerate(zip(sets, sizes)):
        np.bitwise_or(np.left_shift(starts, _CODE_BITS), i, out=keys[first:first + size:2])
        np.bitwise_or(np.left_shift(ends, _CODE_BITS), _SWEEP_MAX_SETS + i, out=keys[first + 1:first + size:2])
        first += size
    keys.sort(kind="stable")
    # The sweep runs over blocks of keys (see BLOCK); every total is a sum of integer lengths,
    # exact in float64, so the blocks' sums are the whole sweep's.
    by_mask = np.zeros(1 << k, np.float64)
    mask, time = np.int32(0), keys[0] >> _CODE_BITS
    for first in range(0, keys.size, BLOCK):
        block = keys[first:first + BLOCK]
        masks = np.cumsum(_MASK_STEP[block & ((1 << _CODE_BITS) - 1)], dtype=np.int32)
        masks += mask
        times = block >> _CODE_BITS
        by_mask += np.bincount(np.concatenate(([mask], masks[:-1])),
                               weights=np.diff(times, prepend=time), minlength=1 << k)
        mask, time = masks[-1], times[-1]
    bits = (np.arange(1 << k)[:, None] >> np.arange(k)) & 1        # which sets each mask holds
    return np.rint((bits * by_mask[:, None]).T @ bits).astype(np.int64)


def clip(intervals: Intervals, lo: int, hi: int) -> Intervals:
    """The part of a disjoint sorted set inside [lo, hi), empty intervals left out.

    The intervals that reach into [lo, hi) are one run, found by binary search, and only its first
    start and last end can lie outside: the run is returned as it is (views of INTERVALS) unless
    those move or it holds an empty interval. A whole capture's set clipped to its steps then
    costs no copy, where masks and copies of every interval made it several times its size."""
    starts, ends = intervals
    first = int(np.searchsorted(ends, lo, side="right"))
    last = int(np.searchsorted(starts, hi, side="left"))
    s, e = starts[first:last], ends[first:last]
    if not s.size:
        return s, e
    if s[0] < lo:
        s = s.copy()
        s[0] = lo
    if e[-1] > hi:
        e = e.copy()
        e[-1] = hi
    keep = e > s
    return (s, e) if keep.all() else (s[keep], e[keep])


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Intersection of two disjoint sorted sets."""
    a_s, a_e = a
    b_s, b_e = b
    if a_s.size == 0 or b_s.size == 0:
        return EMPTY
    found = _in_c(_fast.intersect, a, b) if _fast is not None else None
    if found is not None:
        return found
    # For each interval of a, the b intervals that can overlap it form a contiguous range.
    lo = np.searchsorted(b_e, a_s, side="right")
    hi = np.searchsorted(b_s, a_e, side="left")
    counts = np.maximum(hi - lo, 0)
    if counts.sum() == 0:
        return EMPTY
    a_idx = np.repeat(np.arange(a_s.size), counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    b_idx = np.repeat(lo, counts) + offsets
    s = np.maximum(a_s[a_idx], b_s[b_idx])
    e = np.minimum(a_e[a_idx], b_e[b_idx])
    keep = e > s
    return s[keep], e[keep]


def complement(intervals: Intervals, lo: int, hi: int) -> Intervals:
    """Gaps of a disjoint set inside [lo, hi)."""
    starts, ends = clip(intervals, lo, hi)
    gap_starts = np.concatenate(([lo], ends))
    gap_ends = np.concatenate((starts, [hi]))
    keep = gap_ends > gap_starts
    return gap_starts[keep].astype(np.int64), gap_ends[keep].astype(np.int64)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """Parts of disjoint set a not covered by disjoint set b."""
    if a[0].size == 0:
        return EMPTY
    found = _in_c(_fast.subtract, a, b) if _fast is not None else None
    if found is not None:
        return found
    lo, hi = int(a[0][0]), int(a[1][-1])
    return intersect(a, complement(b, lo, hi))


class _Covered:
    """The covered length of a disjoint set before any time: the cumulative length before
    interval i and the end of interval i - 1, both indexed by the count of intervals starting
    before t (entry 0: none, with an end that never overshoots), so each time costs one
    search and two gathers, with no clip or where."""

    def __init__(self, intervals: Intervals) -> None:
        self.starts, ends = np.ascontiguousarray(intervals[0], np.int64), intervals[1]
        self.cum = np.zeros(self.starts.size + 1, np.int64)
        np.cumsum(ends - self.starts, out=self.cum[1:])
        self.previous_end = np.empty(self.starts.size + 1, np.int64)
        self.previous_end[0] = _NEVER
        self.previous_end[1:] = ends

    def before(self, times: np.ndarray) -> np.ndarray:
        if _fast is not None:
            out = np.empty(times.shape, np.int64)
            _fast.covered_before(self.starts, self.cum, self.previous_end,
                                 np.ascontiguousarray(times, np.int64).reshape(-1), out.reshape(-1))
            return out
        i = np.searchsorted(self.starts, times, side="right")     # intervals starting before t
        overshoot = self.previous_end[i] - times                  # the last may extend past t
        np.maximum(overshoot, 0, out=overshoot)
        return self.cum[i] - overshoot


def covered_until(intervals: Intervals, times: np.ndarray) -> np.ndarray:
    """Length of the disjoint set before each time (a nondecreasing function of time)."""
    if intervals[0].size == 0:
        return np.zeros(times.shape, np.int64)
    return _Covered(intervals).before(times)


def edges_up_to(edges: np.ndarray, times: np.ndarray) -> np.ndarray:
    """``np.searchsorted(edges, times, side="right")``: how many sorted EDGES are <= each time.
    Times in order (an event table's starts) and many more than the edges are counted by
    searching the edges in the times and filling each run, instead of one search per time."""
    if times.size > 4 * edges.size and bool(np.all(times[1:] >= times[:-1])):
        first = np.searchsorted(times, edges, side="left")     # the first time at or past each edge
        return np.repeat(np.arange(edges.size + 1), np.diff(first, prepend=0, append=times.size))
    return np.searchsorted(edges, times, side="right")


def may_overlap(intervals: Intervals, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which events [starts, ends) may overlap the disjoint set: every one that does, and some
    that only touch it. Only the first interval ending after an event's start can be the first
    it overlaps, so one search per event finds them: a filter before measuring overlaps."""
    set_starts, set_ends = intervals
    if set_starts.size == 0:
        return np.zeros(starts.size, bool)
    limits = np.append(set_starts, np.iinfo(np.int64).max)
    out = np.empty(starts.size, bool)
    for first in range(0, starts.size, BLOCK):     # in blocks: small temporaries (see BLOCK)
        part = slice(first, first + BLOCK)
        # the first interval ending after each start
        np.less(limits[edges_up_to(set_ends, starts[part])], ends[part], out=out[part])
    return out


def per_bin_total(intervals: Intervals, edges_lo: np.ndarray, edges_hi: np.ndarray) -> np.ndarray:
    """Length of the disjoint set inside each window [edges_lo[i], edges_hi[i]).

    Windows are independent of each other: they may overlap and come in any order
    (step periods, or one window per event).
    """
    if intervals[0].size == 0 or edges_lo.size == 0:
        return np.zeros(edges_lo.size, np.int64)
    covered = _Covered(intervals)
    return (covered.before(edges_hi) - covered.before(edges_lo)).astype(np.int64, copy=False)


def chain_ends(release: np.ndarray, durations: np.ndarray) -> np.ndarray:
    """end[i] = max(release[i], end[i-1]) + durations[i]: when each event of a chain ends if it
    starts once released and once the one before it ended (the what-if replay's recurrence).
    Without the C loop, all at once: with S the running sum of the durations,
    end[i] = S[i] + max(release[j] - S[j-1] for j <= i)."""
    if _fast is not None:
        out = np.empty(release.size, np.int64)
        _fast.chain_ends(np.ascontiguousarray(release, np.int64), np.ascontiguousarray(durations, np.int64), out)
        return out
    total = np.cumsum(durations)
    return total + np.maximum.accumulate(release - (total - durations))
