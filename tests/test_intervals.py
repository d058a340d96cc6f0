"""Interval algebra against a brute-force coverage mask on random interval sets."""

from __future__ import annotations

import numpy as np
import pytest

from tb_gpuadvisor.model import intervals as iv

SPAN = 300


def _mask(starts, ends) -> np.ndarray:
    covered = np.zeros(SPAN, bool)
    for a, b in zip(starts, ends):
        covered[a:b] = True
    return covered


def _random_set(rng, n):
    starts = rng.integers(0, SPAN - 40, n)
    return starts, starts + rng.integers(0, 40, n)


@pytest.mark.parametrize("seed", range(40))
def test_operations_match_coverage_masks(seed):
    rng = np.random.default_rng(seed)
    a = iv.union(*_random_set(rng, int(rng.integers(0, 30))))
    b = iv.union(*_random_set(rng, int(rng.integers(0, 30))))
    ma, mb = _mask(*a), _mask(*b)
    for starts, ends in (a, b):                       # sorted, disjoint, non-touching
        assert np.all(starts[1:] > ends[:-1]) and np.all(ends >= starts)
    assert np.array_equal(_mask(*iv.intersect(a, b)), ma & mb)
    assert np.array_equal(_mask(*iv.subtract(a, b)), ma & ~mb)
    assert np.array_equal(_mask(*iv.complement(a, 20, 250))[20:250], ~ma[20:250])
    assert iv.total(a) == ma.sum()
    assert iv.overlap(a, b) == (ma & mb).sum()
    lo = np.sort(rng.integers(0, SPAN, 5))
    hi = lo + rng.integers(1, 60, 5)
    expected = [ma[x:y].sum() for x, y in zip(lo, hi)]
    assert iv.per_bin_total(a, lo, hi).tolist() == expected


def test_union_of_unsorted_input():
    starts, ends = np.array([50, 0, 10, 45]), np.array([60, 5, 20, 52])
    assert [x.tolist() for x in iv.union(starts, ends)] == [[0, 10, 45], [5, 20, 60]]


@pytest.mark.parametrize("seed", range(10))
def test_pairwise_overlaps_match_coverage_masks(seed):
    rng = np.random.default_rng(100 + seed)
    sets = [iv.union(*_random_set(rng, int(rng.integers(0, 25)))) for _ in range(int(rng.integers(1, 6)))]
    masks = [_mask(*s) for s in sets]
    table = iv.pairwise_overlaps(sets)
    for i, a in enumerate(masks):
        for j, b in enumerate(masks):
            assert table[i, j] == (a & b).sum()



@pytest.mark.parametrize("seed", range(20))
def test_locate_in_sorted_times_matches_the_search(seed):
    """Times in order take the fill path of Steps.locate; it must agree with searching each time
    in the steps, also for touching, overlapping, nested and empty steps and repeated times."""
    from tb_gpuadvisor.timeline import Steps

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 15))
    start = np.sort(rng.integers(0, SPAN, n))
    end = start + rng.integers(0, 60, n)
    steps = Steps("test", np.arange(n), start, end, np.full(n, -1))
    times = np.sort(rng.integers(-20, SPAN + 80, int(rng.integers(5 * n, 300))))
    idx = np.searchsorted(start, times, side="right") - 1
    searched = np.where((idx >= 0) & (times < end[np.clip(idx, 0, None)]), idx, -1)
    located = steps.locate(times)
    assert located.dtype == np.int32 and np.array_equal(located, searched)


@pytest.mark.parametrize("seed", range(10))
def test_reduce_by_key_matches_ufunc_at(seed):
    from tb_gpuadvisor.arrays import reduce_by_key

    rng = np.random.default_rng(seed)
    keys = np.sort(rng.integers(0, 40, 200)).astype(np.int32)
    values = rng.integers(-1000, 1000, 200)
    for order in (keys, rng.permutation(keys)):      # the run path and the ufunc.at path
        for ufunc, initial in ((np.maximum, -1), (np.minimum, 10**6)):
            expected = np.full(50, initial, np.int64)
            ufunc.at(expected, order, values)
            assert np.array_equal(reduce_by_key(ufunc, np.full(50, initial, np.int64), order, values), expected)


@pytest.mark.parametrize("seed", range(10))
def test_last_at_or_before_matches_a_search_per_group(seed):
    """Each query's answer is searchsorted(..., "right") - 1 among its group's items in index order
    (ties in position included: the last of them), as an index into all items."""
    from tb_gpuadvisor.arrays import last_at_or_before

    rng = np.random.default_rng(seed)
    groups, positions = rng.integers(0, 4, 60), rng.integers(0, 30, 60)
    query_groups, query_positions = rng.integers(0, 5, 80), rng.integers(-2, 32, 80)
    expected = []
    for g, p in zip(query_groups.tolist(), query_positions.tolist()):
        mine = np.flatnonzero(groups == g)
        mine = mine[np.argsort(positions[mine], kind="stable")]
        at = int(np.searchsorted(positions[mine], p, "right")) - 1
        expected.append(int(mine[at]) if at >= 0 else -1)
    assert last_at_or_before(groups, positions, query_groups, query_positions).tolist() == expected
    assert last_at_or_before(groups[:0], positions[:0], query_groups, query_positions).tolist() == [-1] * 80


@pytest.mark.parametrize("seed", range(20))
def test_covered_until_edges_and_overlap_filter(seed):
    """covered_until against the coverage mask; edges_up_to (fill path for many sorted times,
    search path otherwise) against np.searchsorted; may_overlap keeps every event that overlaps
    the set (per_bin_total > 0)."""
    rng = np.random.default_rng(seed)
    a = iv.union(*_random_set(rng, int(rng.integers(0, 20))))
    covered = np.concatenate(([0], np.cumsum(_mask(*a))))
    times = np.sort(rng.integers(0, SPAN, 200))
    assert iv.covered_until(a, times).tolist() == covered[times].tolist()
    for t in (times, rng.permutation(times)):
        assert np.array_equal(iv.edges_up_to(a[1], t), np.searchsorted(a[1], t, side="right"))
    starts = np.sort(rng.integers(0, SPAN - 40, 200))
    ends = starts + rng.integers(0, 40, 200)
    kept = iv.may_overlap(a, starts, ends)
    assert not np.any((iv.per_bin_total(a, starts, ends) > 0) & ~kept)
    if a[0].size:       # and drops those wholly before or after it
        assert not np.any(kept & ((ends <= a[0][0]) | (starts >= a[1][-1])))


@pytest.mark.parametrize("block", [1, 3, 7])
def test_pairwise_overlaps_swept_in_blocks(monkeypatch, block):
    """The bitmask sweep carries its mask and time across blocks: small blocks give the table of
    one block, also with negative times and sets that share boundaries."""
    rng = np.random.default_rng(block)
    sets = []
    for _ in range(6):
        starts = rng.integers(-50, SPAN, 30)
        sets.append(iv.union(starts, starts + rng.integers(0, 40, 30)))
    whole = iv.pairwise_overlaps(sets)
    monkeypatch.setattr(iv, "BLOCK", block)
    monkeypatch.setattr(iv, "_fast", None)          # the numpy sweep, whichever ran above
    assert np.array_equal(iv.pairwise_overlaps(sets), whole)
    covered = np.zeros((len(sets), SPAN + 100), bool)     # times -50 .. SPAN + 50
    for row, (starts, ends) in zip(covered, sets):
        for a, b in zip(starts, ends):
            row[a + 50:b + 50] = True
    assert np.array_equal(whole, covered.astype(np.int64) @ covered.T.astype(np.int64))


def _shaped_set(rng, n, shape):
    """A set of one of the shapes the stages pass: disjoint (a union's output), touching pieces
    (a cut's output, empty pieces included), or raw events (overlapping, some empty, sorted by
    start), in a narrow time range so that ties are common."""
    starts, ends = _random_set(rng, n)
    if shape == "disjoint":
        return iv.union(starts, ends)
    if shape == "touching":
        points = np.sort(rng.integers(0, SPAN, 2 * n))
        return points[:-1:2].copy(), points[1::2].copy()
    order = np.argsort(starts, kind="stable")
    return starts[order], ends[order]


def _numpy(monkeypatch, operation, *args):
    """OPERATION's result from the numpy path alone."""
    with monkeypatch.context() as patch:
        patch.setattr(iv, "_fast", None)
        return operation(*args)


def _same(x, y) -> bool:
    return all(np.array_equal(p, q) and p.dtype == q.dtype == np.int64 for p, q in zip(x, y))


@pytest.mark.skipif(iv._fast is None, reason="the C interval module is not built")
@pytest.mark.parametrize("seed", range(200))
def test_c_interval_functions_give_the_numpy_intervals_exactly(seed, monkeypatch):
    """The one-pass C functions return the very intervals of the numpy formulas (not only the
    same coverage): the same pieces, touching pieces and empty ones alike, so a report never
    depends on which ran. Inputs they do not take (unsorted, overlapping where a set must be
    disjoint) fall back to numpy."""
    rng = np.random.default_rng(1000 + seed)
    shapes = ("disjoint", "touching", "events")
    a = _shaped_set(rng, int(rng.integers(0, 25)), shapes[seed % 3])
    b = _shaped_set(rng, int(rng.integers(0, 25)), shapes[(seed // 3) % 3])
    for operation in (iv.intersect, iv.subtract, iv.union_of):
        assert _same(operation(a, b), _numpy(monkeypatch, operation, a, b)), operation.__name__
    subset = iv.intersect(a, b)         # cut takes a subset of its first set
    assert _same(iv.cut(a, subset), _numpy(monkeypatch, iv.cut, a, subset))
    events = _shaped_set(rng, int(rng.integers(0, 40)), "events")
    keep = rng.random(events[0].size) < 0.6
    assert _same(iv.union(*events, keep), _numpy(monkeypatch, iv.union, events[0][keep], events[1][keep]))
    assert _same(iv.union(*events), _numpy(monkeypatch, iv.union, *events))
    shuffled = rng.permutation(events[0].size)
    unsorted = (events[0][shuffled], events[1][shuffled])
    assert _same(iv.union(*unsorted, keep), _numpy(monkeypatch, iv.union, *unsorted, keep))


@pytest.mark.skipif(iv._fast is None, reason="the C interval module is not built")
def test_c_masked_union_writes_no_more_than_its_outputs_hold():
    """A masked union's outputs are sized to the kept rows; outputs that cannot hold its blocks
    give -1 (numpy answers) instead of a write past them, and unmasked ones must hold every row."""
    starts, ends = np.arange(0, 100, 10, dtype=np.int64), np.arange(5, 105, 10, dtype=np.int64)
    keep = np.zeros(10, np.uint8)
    keep[[2, 5, 7]] = 1
    assert iv._fast.union(starts, ends, keep, np.empty(3, np.int64), np.empty(3, np.int64)) == 3
    for short in (2, 0):
        assert iv._fast.union(starts, ends, keep, np.empty(short, np.int64), np.empty(short, np.int64)) == -1
    with pytest.raises(ValueError):
        iv._fast.union(starts, ends, None, np.empty(9, np.int64), np.empty(9, np.int64))
    assert [x.tolist() for x in iv.union(starts, ends, keep.view(bool))] == [[20, 50, 70], [25, 55, 75]]


@pytest.mark.skipif(iv._fast is None, reason="the C interval module is not built")
def test_c_union_keeps_numpys_running_end_across_blocks():
    """An interval ending before it starts (a corrupt duration) does not lower a block's end:
    the running end covers every earlier interval, as numpy's maximum.accumulate does."""
    starts, ends = np.array([0, 11, 20], np.int64), np.array([10, 5, 30], np.int64)
    assert [x.tolist() for x in iv.union(starts, ends)] == [[0, 11, 20], [10, 10, 30]]
    assert [x.tolist() for x in iv.union_of((starts[:1], ends[:1]), (starts[1:], ends[1:]))] == \
        [[0, 11, 20], [10, 10, 30]]


@pytest.mark.skipif(iv._fast is None, reason="the C interval module is not built")
@pytest.mark.parametrize("seed", range(50))
def test_c_covered_lengths_and_chain_ends_match_numpy(seed, monkeypatch):
    """covered_until (times in order, out of order, repeated, before and after the set) and the
    replay's chain recurrence (releases held back by nothing, far in the past) give numpy's values."""
    rng = np.random.default_rng(5000 + seed)
    covered = _shaped_set(rng, int(rng.integers(0, 25)), ("disjoint", "touching")[seed % 2])
    times = rng.integers(-20, SPAN + 20, int(rng.integers(0, 60)))
    for t in (times, np.sort(times), np.repeat(np.sort(times), 2)):
        assert np.array_equal(iv.covered_until(covered, t), _numpy(monkeypatch, iv.covered_until, covered, t))
        if covered[0].size:
            lo, hi = np.minimum(t, t[::-1]), np.maximum(t, t[::-1])
            assert np.array_equal(iv.per_bin_total(covered, lo, hi),
                                  _numpy(monkeypatch, iv.per_bin_total, covered, lo, hi))
    n = int(rng.integers(0, 80))
    release = np.where(rng.random(n) < 0.3, -(1 << 60), rng.integers(0, 1000, n)).astype(np.int64)
    durations = rng.integers(0, 30, n).astype(np.int64)
    assert np.array_equal(iv.chain_ends(release, durations), _numpy(monkeypatch, iv.chain_ends, release, durations))


@pytest.mark.skipif(iv._fast is None, reason="the C interval module is not built")
@pytest.mark.parametrize("seed", range(30))
def test_c_pairwise_overlaps_match_the_numpy_sweep(seed, monkeypatch):
    """The C sweep and the numpy one agree on every pair, for up to 16 sets of every shape
    (touching pieces, empty sets, boundaries shared between sets)."""
    rng = np.random.default_rng(7000 + seed)
    k = int(rng.integers(1, 17))
    sets = [_shaped_set(rng, int(rng.integers(0, 20)), ("disjoint", "touching")[i % 2]) for i in range(k)]
    table = iv.pairwise_overlaps(sets)
    assert np.array_equal(table, _numpy(monkeypatch, iv.pairwise_overlaps, sets))
    masks = np.array([_mask(*s) for s in sets], np.int64)
    assert np.array_equal(table, masks @ masks.T)


@pytest.mark.parametrize("seed", range(6))
def test_pairwise_overlaps_of_more_sets_than_one_sweep(seed, monkeypatch):
    """Over 16 sets (more than one sweep tracks: 32 GPUs, say), every pair's overlap, with the C
    module and without, is what the coverage masks give."""
    rng = np.random.default_rng(9000 + seed)
    k = int(rng.integers(17, 41))
    sets = [_shaped_set(rng, int(rng.integers(0, 20)), ("disjoint", "touching")[i % 2]) for i in range(k)]
    masks = np.array([_mask(*s) for s in sets], np.int64)
    assert np.array_equal(iv.pairwise_overlaps(sets), masks @ masks.T)
    assert np.array_equal(_numpy(monkeypatch, iv.pairwise_overlaps, sets), masks @ masks.T)
