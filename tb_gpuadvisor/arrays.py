"""Vectorised lookups that replace per-event dict access on the hot path."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

# Above this many distinct key values a dense table costs more memory than sorting does.
_DENSE_LIMIT = 1 << 24


def map_small_ints(ids: np.ndarray, mapping: Mapping[int, int], default: int = -1) -> np.ndarray:
    """int32 ``mapping.get(id, default)`` for every id.

    Profiler metadata ids are small non-negative integers, so a dense table indexed by id
    is O(n); other ids fall back to one sort.
    """
    if ids.size == 0:
        return np.empty(0, np.int32)
    keys = np.fromiter(mapping.keys(), np.int64, len(mapping))
    values = np.fromiter(mapping.values(), np.int32, len(mapping))
    lo, hi = int(ids.min()), int(ids.max())
    if lo >= 0 and hi < _DENSE_LIMIT:
        table = np.full(hi + 1, default, np.int32)
        inside = (keys >= 0) & (keys <= hi)
        table[keys[inside]] = values[inside]
        return table[ids]
    return SortedKeys(keys, values).get(ids, default)


_INT32 = np.iinfo(np.int32)


def narrow_ids(ids: np.ndarray) -> np.ndarray:
    """IDS (ids or string indices, -1 where absent) in the least memory that keeps them: one
    read-only -1 for every row when none is present (a stat the capture never records), int32
    when every value fits, else as they are. They are matched and looked up, never added up, and
    a column every event carries takes half the memory in int32."""
    if ids.size and ids.strides[0] == 0:
        return ids          # one value for every row already
    if ids.size:
        lo, hi = int(ids.min()), int(ids.max())
        if lo == hi == -1:
            return np.broadcast_to(np.int32(-1), ids.shape)
        if ids.dtype == np.int32 or lo < _INT32.min or hi > _INT32.max:
            return ids
    return ids.astype(np.int32)


def kept_mask(mask: np.ndarray) -> np.ndarray:
    """MASK as a table keeps it for its readers (read-only): one value for every row when it
    holds one (no event or every event: most name masks of a capture; no memory), else itself."""
    if mask.size and mask.strides[0]:
        count = int(np.count_nonzero(mask))
        if count in (0, mask.size):
            return np.broadcast_to(np.bool_(count), mask.shape)
    mask.flags.writeable = False
    return mask


def _small(values: np.ndarray) -> bool:
    return bool(values.size) and int(values.min()) >= 0 and int(values.max()) < _DENSE_LIMIT


def distinct_small_ints(values: np.ndarray) -> np.ndarray:
    """The distinct values, counted in a dense table when they are small non-negative ints."""
    return np.flatnonzero(np.bincount(values)) if _small(values) else np.unique(values)


def renumber_small_ints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct VALUES in order, VALUES as int32 indices into them): np.unique's answer with
    return_inverse, from a dense table and without a sort when the values are small non-negative
    ints (interned ids, device and stream numbers)."""
    if _small(values):
        used = np.flatnonzero(np.bincount(values))
        position = np.zeros(int(used[-1]) + 1, np.int32)
        position[used] = np.arange(used.size, dtype=np.int32)
        return used, position[values]
    used, inverse = np.unique(values, return_inverse=True)
    return used, inverse.reshape(-1).astype(np.int32)


class SortedKeys:
    """A read-only int64 -> int32 map: build once, look up many arrays.

    Values are above the int32 minimum (indices, positions, -1). Keys that span a range not much wider than their count (correlation ids count up) go in
    a table indexed by key, a look-up per query; other keys are sorted and searched. Either
    way a key present several times maps to its first value.
    """

    _ABSENT = np.iinfo(np.int32).min     # a value no map holds

    def __init__(self, keys: np.ndarray, values: np.ndarray) -> None:
        self.size = int(keys.size)
        self._table: np.ndarray | None = None
        if self.size:
            self._lo, hi = int(keys.min()), int(keys.max())
            span = hi - self._lo + 1
            if span <= min(_DENSE_LIMIT, 4 * self.size + 4096):
                at = keys - self._lo
                self._table = np.full(span, self._ABSENT, np.int32)
                self._table[at] = values
                if np.count_nonzero(self._table != self._ABSENT) < self.size:  # repeated keys: first wins
                    first = np.full(span, self.size, np.int64)
                    np.minimum.at(first, at, np.arange(self.size))
                    present = first < self.size
                    self._table[:] = self._ABSENT
                    self._table[present] = values[first[present]]
                return
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        self.values = values[order]

    def __len__(self) -> int:
        return self.size

    def get(self, queries: np.ndarray, default: int = -1) -> np.ndarray:
        if self.size == 0 or queries.size == 0:
            return np.full(queries.shape, default, np.int32)
        if self._table is not None:
            at = np.subtract(queries, self._lo, dtype=np.int64)     # int32 queries, keys past int32
            found = self._table[np.clip(at, 0, self._table.size - 1)]
            found[(at < 0) | (at >= self._table.size)] = self._ABSENT
            return np.where(found != self._ABSENT, found, np.int32(default))
        idx = np.clip(np.searchsorted(self.keys, queries), 0, self.keys.size - 1)
        return np.where(self.keys[idx] == queries, self.values[idx], default).astype(np.int32)


def reduce_by_key(ufunc: np.ufunc, out: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``ufunc.at(out, keys, values)`` (e.g. the latest end per step), returned.

    Event columns sorted by start give keys (step indices) that rarely go down; sorted keys
    are reduced one run at a time (``reduceat``), several times faster than ``ufunc.at``,
    which stays the way for unsorted keys."""
    if keys.size and np.any(keys[1:] < keys[:-1]):
        ufunc.at(out, keys, values)
        return out
    if keys.size:
        first = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
        at = keys[first]
        out[at] = ufunc(out[at], ufunc.reduceat(values, first))
    return out


@dataclass(frozen=True)
class Runs:
    """A column kept as its runs of equal values (a step function of the events: the host time
    removed before each event changes at few of them), when that takes much less memory."""

    values: np.ndarray      # each run's value
    lengths: np.ndarray     # int32: how many rows it spans

    @staticmethod
    def packed(column: np.ndarray) -> "Runs | np.ndarray":
        """COLUMN as runs when they take at most half its memory, else COLUMN itself."""
        first = np.flatnonzero(column[1:] != column[:-1]) + 1
        if (first.size + 1) * (column.itemsize + 4) > column.nbytes // 2:
            return column
        starts = np.concatenate(([0], first))
        return Runs(column[starts], np.diff(starts, append=column.size).astype(np.int32))

    @staticmethod
    def dense(kept: "Runs | np.ndarray") -> np.ndarray:
        """The whole column of what ``packed`` kept."""
        return np.repeat(kept.values, kept.lengths) if isinstance(kept, Runs) else kept


def last_at_or_before(groups: np.ndarray, positions: np.ndarray, query_groups: np.ndarray,
                      query_positions: np.ndarray) -> np.ndarray:
    """Per query, the index of the last item of its group placed at or before it (-1: none), items
    of one place counted in index order: ``searchsorted(..., "right") - 1`` within every group at
    once, by one sort of items and queries together instead of a search per query."""
    n = groups.size
    order = np.lexsort((np.arange(n + query_groups.size) >= n, np.concatenate((positions, query_positions)),
                        np.concatenate((groups, query_groups))))
    is_query = order >= n
    seen = np.maximum.accumulate(np.where(is_query, -1, np.arange(order.size)))
    found = np.full(query_groups.size, -1, np.int64)
    found[order[is_query] - n] = np.where(seen >= 0, order[np.maximum(seen, 0)], -1)[is_query]
    mine = found >= 0
    mine[mine] = groups[found[mine]] == query_groups[mine]
    return np.where(mine, found, -1)
