"""The Kineto adapter: Chrome-trace JSON written by PyTorch's profiler, one file per rank or
worker: ``*.pt.trace.json[.gz]`` (``torch.profiler.tensorboard_trace_handler``), and any
``.json[.gz]`` whose first bytes are a trace (``sniff.py``: ``export_chrome_trace("trace.json")``,
per-rank layouts such as ``rank-3.json.gz``).

This module says how a run folder's traces group into sessions (one per profiling cycle of the
handler's files; the ranks of one run, or else one file each, of the others) and name their
hosts; ``decode.py`` turns a trace's JSON into plain columns and ``build.py`` those into the host's
tables (``input.capture.HostCapture``), with event kinds from ``vocab/pytorch.py``.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

from tb_gpuadvisor.input import KINETO, Sessions, Sniffed
from tb_gpuadvisor.input.discovery import SESSION_TIME, SPLIT_SESSION_S

# torch.profiler.tensorboard_trace_handler names files "<worker>.<epoch time>.pt.trace.json[.gz]":
# the time in ms (PyTorch 1.x, 13 digits) or in ns (PyTorch 2.x, 19 digits).
_WORKER_STAMP = re.compile(r"^(?P<worker>.+)\.(?P<stamp>\d{12,14}|\d{18,20})$")
# A rank in a file's name, as per-rank layouts write it: rank-3, rank0, rank_1, -rank0-.
_RANK = re.compile(r"(?<![a-z])rank[-_]?(\d+)(?!\d)", re.IGNORECASE)


def kineto_worker(file_name: str) -> tuple[str, int | None]:
    """(host name, epoch ms the profiling cycle was written, or None) of a Kineto trace file."""
    stem = KINETO.stem(file_name)
    match = _WORKER_STAMP.match(stem)
    if not match:
        return stem, None
    stamp = match.group("stamp")
    return match.group("worker"), int(stamp) // (1_000_000 if len(stamp) >= 18 else 1)


def _cycle_name(stamp_ms: int | None) -> str:
    """A PyTorch session's name: when its cycle was written (as TensorFlow names sessions)."""
    if stamp_ms is None:
        return "trace"
    return datetime.fromtimestamp(stamp_ms / 1000, timezone.utc).strftime(SESSION_TIME)


def sessions(names: list[str], sniffed: dict[str, Sniffed]) -> Sessions:
    """One run folder's sessions: the handler's files (``*.pt.trace.json[.gz]``) by profiling
    cycle, the other traces (SNIFFED) by run; each session's name unique in the folder."""
    handler = [n for n in names if KINETO.claims(n)]
    found = cycles(handler) + loose([n for n in names if not KINETO.claims(n)], sniffed)
    out, used = [], set()
    for session, members in found:
        while session in used:
            session += "_"
        used.add(session)
        out.append((session, members))
    return out


def file_rank(file_name: str) -> int | None:
    """The rank a trace's file name gives (``rank-3.json.gz``, ``run-rank0-chrome-trace.json``)."""
    match = _RANK.search(KINETO.stem(file_name))
    return int(match.group(1)) if match else None


def loose(names: list[str], sniffed: dict[str, Sniffed]) -> Sessions:
    """Sessions of traces not named by the handler.  Files named alike but for a rank number
    (``rank-0``, ``rank-1``) are the ranks of one run, one session named for the pattern
    (``rank-*``); files that name no rank but whose ``distributedInfo`` gives distinct ranks of
    one world size are one session (``ranks``); every other file is a session of its own, named
    after the file (``trace_optimized.json``: ``trace_optimized``)."""
    groups: dict[str, list[tuple[int, str]]] = {}
    for name in sorted(names):
        stem, rank = KINETO.stem(name), file_rank(name)
        info = sniffed.get(name, Sniffed(True))
        if rank is not None:
            match = _RANK.search(stem)
            key = stem[:match.start(1)] + "*" + stem[match.end(1):]
        elif info.rank is not None and info.world and info.world > 1:
            rank, key = info.rank, f"ranks of {info.world}"
        else:
            rank, key = 0, ""
        groups.setdefault(key, []).append((rank, name))
    out: Sessions = []
    for key, members in sorted(groups.items()):
        ranks = [r for r, _ in members]
        if key and len(members) > 1 and len(set(ranks)) == len(ranks):
            session = "ranks" if key.startswith("ranks of ") else key
            out.append((session, [(KINETO.stem(n), n) for _, n in sorted(members)]))
        else:
            out += [(KINETO.stem(n), [(KINETO.stem(n), n)]) for _, n in members]
    return out


def cycles(names: list[str]) -> Sessions:
    """One run folder's sessions: the files of one profiling cycle (one per rank or worker,
    written within SPLIT_SESSION_S of each other, or all without a time in their name)."""
    traces = sorted(((kineto_worker(n), n) for n in names),
                    key=lambda t: (t[0][1] is not None, t[0][1] or 0, t[0][0]))
    groups: list[tuple[int | None, list[tuple[str, str]]]] = []
    for (worker, stamp), name in traces:
        last = groups[-1] if groups else None
        same_cycle = last is not None and (last[0] is None) == (stamp is None) and (
            stamp is None or stamp - last[0] <= SPLIT_SESSION_S * 1000)
        if same_cycle and worker not in {w for w, _ in last[1]}:
            last[1].append((worker, name))
        else:
            groups.append((stamp, [(worker, name)]))
    return [(_cycle_name(stamp), members) for stamp, members in groups]
