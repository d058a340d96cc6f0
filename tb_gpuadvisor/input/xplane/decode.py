"""An XPlane's events as numpy columns, with the stats a caller asks for.

The C decoder (``_wire.c``) walks the wire bytes once; when it was not built
(no compiler at install time) the same columns come from protobuf message
objects, slower but identical.  Either way the plane's small fields (name,
metadata maps, plane stats) are parsed with the protobuf runtime, and a plane
the caller skips is checked only as far as its top-level framing, so both
decoders accept and refuse exactly the same bytes (the C decoder follows the
protobuf runtime's wire rules).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from google.protobuf.message import DecodeError

from tb_gpuadvisor.arrays import distinct_small_ints, map_small_ints
from tb_gpuadvisor.input.files import CaptureError
from tb_gpuadvisor.input.xplane.reader import fields
from tb_gpuadvisor.input.xplane.schema import XPlane

try:
    from tb_gpuadvisor.input.xplane import _wire
except ImportError:  # built without a C compiler
    _wire = None

# Bytes of events the C decoder decodes between two hand-backs of a released buffer's pages.
RELEASE_STEP = 16 << 20

# Stat value kinds, as the C decoder reports them.
INT64, UINT64, REF, STR, DOUBLE, BYTES = 1, 2, 3, 4, 5, 6


@dataclass
class Line:
    id: int
    name: str
    display_name: str
    timestamp_ns: int
    first: int        # index of the line's first event in the plane's columns
    count: int


@dataclass
class StatColumn:
    """Sparse values of one stat: which events carry it, and how."""

    event: np.ndarray   # int32 event indices (a plane holds fewer than 2^31: protobuf caps it at 2 GB)
    kind: np.ndarray    # int8 value kinds (INT64, UINT64, REF, STR, DOUBLE, BYTES)
    value: np.ndarray   # int64 raw values (string index for STR, bits for DOUBLE)

    def int_values(self, strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(events, int64 values) of the integer values, numeric strings converted; a string
        value follows the numeric ones, so it wins where an event carries both."""
        numeric = (self.kind == INT64) | (self.kind == UINT64)
        texts = [(int(self.event[i]), int(text)) for i in np.flatnonzero(self.kind == STR)
                 if (text := strings[int(self.value[i])]).lstrip("-").isdigit()]
        if not texts:
            if numeric.all():       # the usual case: no copies of a column every event carries
                return self.event, self.value
            return self.event[numeric], self.value[numeric]
        event, value = zip(*texts)
        return (np.concatenate([self.event[numeric], np.asarray(event, np.int32)]),
                np.concatenate([self.value[numeric], np.asarray(value, np.int64)]))

    def ints(self, n_events: int, strings: list[str], missing: int = -1,
             rows: np.ndarray | None = None) -> np.ndarray:
        """Dense int64 column; numeric strings are converted, other values are missing. ROWS
        (see ``_place``) puts each event's value at its row of a table of N_EVENTS rows."""
        out = np.full(n_events, missing, np.int64)
        _place(out, *self.int_values(strings), rows)
        return out

    def interned(self, n_events: int, stat_names: dict[int, str], strings: list[str],
                 intern: Callable[[str], int], rows: np.ndarray | None = None) -> np.ndarray:
        """Dense int32 column of interned string values (-1 where absent); ROWS as in ``ints``.

        Reference values are resolved once per distinct reference, not once per event. Every
        value is interned, placed or not: the strings' order does not depend on ROWS.
        """
        out = np.full(n_events, -1, np.int32)
        ref = self.kind == REF
        if ref.any():
            refs = self.value[ref]
            interned = {int(sid): intern(stat_names.get(int(sid), "")) for sid in distinct_small_ints(refs)}
            _place(out, self.event[ref], map_small_ints(refs, interned), rows)
        text = self.kind == STR
        if text.any():
            _place(out, self.event[text], np.fromiter((intern(strings[int(i)]) for i in self.value[text]),
                                                      np.int32, int(text.sum())), rows)
        return out

    def window(self, lo: int, hi: int) -> "StatColumn":
        """The values of events lo..hi-1, renumbered from 0 (records are in event order)."""
        a, b = np.searchsorted(self.event, [lo, hi])
        return StatColumn(self.event[a:b] - lo, self.kind[a:b], self.value[a:b])

    def at(self, rows: np.ndarray) -> "StatColumn":
        """The values of the events ROWS (sorted indices), renumbered to positions in ROWS."""
        if rows.size == 0 or self.event.size == 0:
            return StatColumn(self.event[:0], self.kind[:0], self.value[:0])
        pos = np.clip(np.searchsorted(rows, self.event), 0, rows.size - 1)
        hit = rows[pos] == self.event
        return StatColumn(pos[hit], self.kind[hit], self.value[hit])

    def floats(self, n_events: int) -> np.ndarray:
        out = np.zeros(n_events, np.float64)
        double = self.kind == DOUBLE
        out[self.event[double]] = self.value[double].view(np.float64)
        numeric = (self.kind == INT64) | (self.kind == UINT64)
        out[self.event[numeric]] = self.value[numeric]
        return out


def _place(out: np.ndarray, events: np.ndarray, values: np.ndarray, rows: np.ndarray | None) -> None:
    """OUT[event] = value, or with ROWS (int32 per event of the plane: its row in OUT, -1 for an
    event OUT leaves out) OUT[ROWS[event]] = value for the events it keeps: a table of some of a
    plane's events, in its own order, built without a column over every event."""
    if rows is None:
        out[events] = values
        return
    at = rows[events]
    kept = at >= 0
    out[at[kept]] = values[kept]


@dataclass
class DecodedPlane:
    shell: XPlane                 # the plane without its lines
    stat_names: dict[int, str]
    lines: list[Line]
    metadata_id: np.ndarray       # int64 per event, lines concatenated in order
    offset_ps: np.ndarray
    duration_ps: np.ndarray
    stats: dict[str, StatColumn]
    strings: list[str]

    @property
    def n_events(self) -> int:
        return sum(line.count for line in self.lines)

    def drop(self, *columns: str) -> None:
        """Forget the event COLUMNS a builder has taken: their memory goes before it builds the
        rest (a large plane's columns are much of the decode's peak)."""
        for column in columns:
            setattr(self, column, np.empty(0, getattr(self, column).dtype))


def _empty_column() -> StatColumn:
    return StatColumn(np.empty(0, np.int32), np.empty(0, np.int8), np.empty(0, np.int64))


_LINES = 3


def _shell(buf, spans) -> XPlane:
    try:
        return XPlane.FromString(b"".join(bytes(buf[a:b]) for a, b in spans))
    except DecodeError as err:
        raise CaptureError(f"a plane's header is corrupt: {err}") from None


def _shell_spans(view) -> list[tuple[int, int]]:
    """Byte spans of every plane field that is not a line (the pure-Python twin of the C walk)."""
    return [(first, last) for number, wire, first, _, _, last in fields(view, 0, len(view))
            if not (number == _LINES and wire == 2)]


Chooser = Callable[[XPlane], "tuple[str, ...] | None"]


def _decode_fast(view, at: int, choose: Chooser, release: bool, parts: int) -> DecodedPlane | None:
    try:
        spans = _wire.decode_plane(view, b"", False)[0]
        shell = _shell(view, spans)
        wanted = choose(shell)
        if wanted is None:
            return None
        stat_names = {sid: meta.name for sid, meta in shell.stat_metadata.items()}
        ids = {name: sid for sid, name in stat_names.items() if name in wanted}
        names = list(ids)
        wanted_ids = np.asarray([ids[n] for n in names], np.int64).tobytes()
        (_, lines, md, off, dur, st_event, st_type, st_value,
         strings) = _wire.decode_plane(view, wanted_ids, True, RELEASE_STEP if release else 0, parts)
    except ValueError as err:
        raise CaptureError(f"a plane at bytes {at}-{at + len(view)} is corrupt: {err}") from None
    columns = {name: StatColumn(np.frombuffer(e, np.int32), np.frombuffer(k, np.int8), np.frombuffer(v, np.int64))
               for name, e, k, v in zip(names, st_event, st_type, st_value)}
    for name in wanted:
        columns.setdefault(name, _empty_column())
    return DecodedPlane(shell, stat_names, [Line(*line) for line in lines], np.frombuffer(md, np.int64),
                        np.frombuffer(off, np.int64), np.frombuffer(dur, np.int64), columns, strings)


_VALUE_FIELDS = {"int64_value": INT64, "uint64_value": UINT64, "ref_value": REF, "str_value": STR,
                 "double_value": DOUBLE, "bytes_value": BYTES}


def _decode_objects(view, at: int, choose: Chooser) -> DecodedPlane | None:
    """The same columns through protobuf message objects (no C decoder)."""
    try:
        wanted = choose(_shell(view, _shell_spans(view)))
        if wanted is None:
            return None
        plane = XPlane.FromString(view)
    except (DecodeError, CaptureError) as err:
        raise CaptureError(f"a plane at bytes {at}-{at + len(view)} is corrupt: {err}") from None
    stat_names = {sid: meta.name for sid, meta in plane.stat_metadata.items()}
    wanted_ids = {sid: name for sid, name in stat_names.items() if name in wanted}
    lines, md, off, dur, strings = [], [], [], [], []
    rows: dict[str, list[tuple[int, int, int]]] = {name: [] for name in wanted}
    for line in plane.lines:
        lines.append(Line(line.id, line.name, line.display_name, line.timestamp_ns, len(md), len(line.events)))
        for event in line.events:
            index = len(md)
            md.append(event.metadata_id)
            off.append(event.offset_ps)
            dur.append(event.duration_ps)
            for stat in event.stats:
                name = wanted_ids.get(stat.metadata_id)
                field = stat.WhichOneof("value") if name else None
                if field is None:
                    continue
                kind = _VALUE_FIELDS[field]
                value = getattr(stat, field)
                if kind == STR:
                    strings.append(value)
                    value = len(strings) - 1
                elif kind == DOUBLE:
                    value = int(np.float64(value).view(np.int64))
                elif kind == BYTES:
                    value = 0
                elif kind == UINT64 or kind == REF:     # unsigned on the wire, int64 bits in columns
                    value = value - (1 << 64) if value >= 1 << 63 else value
                rows[name].append((index, kind, value))
    columns = {}
    for name, found in rows.items():
        if found:
            event, kind, value = zip(*found)
            columns[name] = StatColumn(np.asarray(event, np.int32), np.asarray(kind, np.int8),
                                       np.asarray(value, np.int64))
        else:
            columns[name] = _empty_column()
    del plane.lines[:]
    return DecodedPlane(plane, stat_names, lines, np.asarray(md, np.int64), np.asarray(off, np.int64),
                        np.asarray(dur, np.int64), columns, strings)


def decode_plane(data, choose: Chooser, fast: bool = True, at: int = 0,
                 release: bool = False, parts: int = 1) -> DecodedPlane | None:
    """Decode the plane whose bytes are DATA (found at offset AT of its file, for messages).

    CHOOSE sees the plane without its lines and returns the stat names to extract
    from its events, or None to skip the plane without decoding its events.  Nothing
    returned refers to DATA: the caller may drop or reuse it.  RELEASE says DATA is a
    writable scratch buffer the caller drops afterwards: the C decoder then hands its pages
    back to the system as it decodes them (they read as zeros after), so a large plane's
    bytes and its columns are not both held whole at the end of its decode.  PARTS > 1 has the
    C decoder cut the lines into that many runs of about equal bytes (between two fields of a
    line where one is longer than a run) and decode them on as many threads: one large plane
    keeps every core busy, with the same result as one run.
    """
    view = memoryview(data)
    if fast and _wire is not None:
        return _decode_fast(view, at, choose, release, parts)
    return _decode_objects(view, at, choose)


def count_events(data, fast: bool = True, stats: bool = True) -> tuple[int, int]:
    """(events, stats) in the lines of the plane whose bytes are DATA, without decoding them.

    The pure-Python count, and any count without STATS, stops at the events (stats cost
    several times more to count) and gives -1 stats.  Counting ends quietly at malformed
    bytes: decoding reports those.
    """
    view = memoryview(data)
    if fast and _wire is not None:
        return _wire.count_plane(view) if stats else (_wire.count_plane(view, False)[0], -1)
    events = 0
    try:
        for number, wire, _, start, stop, _ in fields(view, 0, len(view)):
            if number == _LINES and wire == 2:
                events += _count_events(bytes(view[start:stop]))
    except CaptureError:
        pass
    return events, -1


def _count_events(line: bytes) -> int:
    """XLine.events fields in LINE; 1-byte tags and lengths stepped over inline (this runs per event)."""
    count = pos = 0
    stop = len(line)
    while pos < stop:
        key = line[pos]
        if key < 0x80 and pos + 1 < stop and line[pos + 1] < 0x80 and key & 7 in (0, 2):
            count += key == 0x22
            pos += 2 + (line[pos + 1] if key & 7 == 2 else 0)
            continue
        number, wire, _, _, _, pos = next(fields(line, pos, stop))
        count += number == 4 and wire == 2
    return count


def has_fast_decoder() -> bool:
    return _wire is not None
