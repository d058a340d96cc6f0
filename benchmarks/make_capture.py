"""Write large synthetic XSpace captures (10 MB .. 1 GB) quickly.

Building millions of protobuf objects in Python would take many minutes per
gigabyte, so this writes the wire format directly:

1. one training step is built with the test suite's synthetic builder
   (``tests/synth.py``: realistic kernel names, stats, launch events with
   correlation ids, memory events, custom-loop ``_r``/``step_num`` markers);
2. every line of that step is encoded once into bytes, with *holes* where a
   value changes from step to step: the event offset, ``correlation_id``,
   ``group_id`` and ``step_num``;
3. the step is tiled N times with numpy and the holes are filled in bulk.

Holes need a fixed byte width to make tiling possible, so the varying values
are kept inside one varint-length band (still canonical varints): offsets
lie in [2**42, 2**49) ps from their line's ``timestamp_ns`` (the line origin
sits 4.4 s before the capture's first event; all clocks move 5 s later), correlation ids in
[2**21, 2**28) and step numbers / group ids in [128, 16384) (as in a profile
taken from batch 128 on).  The file parses with protobuf (our schema, XProf)
like any profiler output.

Usage: ``python benchmarks/make_capture.py --size-mb 50 --gpus 8 --out DIR``
writes ``DIR/<run>/plugins/profile/<session>/<host>.xplane.pb``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

_REPO = Path(__file__).resolve().parent.parent
for _path in (_REPO, _REPO / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from tb_gpuadvisor.input.xplane.schema import XLine, XPlane, XStat  # noqa: E402
from synth import PS_PER_MS, STEPS_LINE_ID, build_training_session, iter_events, session_dir  # noqa: E402

OFFSET_BASE_PS = 1 << 42  # ~4.4 s; offsets stay 7-byte varints up to 2**49 ps
CLOCK_SHIFT_NS = 5_000_000_000  # keeps every line's timestamp_ns positive
CORRELATION_BASE = 1 << 21  # 4-byte varints up to 2**28
STEP_BASE = 128  # 2-byte varints up to 16384
MAX_STEPS = (1 << 14) - STEP_BASE

# hole kind -> varint width in bytes
_WIDTH = {"offset": 7, "corr": 4, "step": 2}
_VARYING_STATS = {"correlation_id": "corr", "group_id": "step", "step_num": "step"}


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


@dataclasses.dataclass
class _LineTemplate:
    """One step of one line as bytes, plus where the per-step values go."""

    header: bytes  # XLine fields other than events
    body: np.ndarray  # uint8, the step's encoded events
    holes: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]  # kind -> (pos, base, inc)
    events: int  # per step
    fixed: bytes = b""  # events written once, not per step (the Steps line)
    fixed_events: int = 0


class _Encoder:
    """Encodes the events of a one-step line with holes for varying values."""

    def __init__(self, plane: XPlane, step_ps: int, corr_stride: int, extra: bytes = b"") -> None:
        self.stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        self.step_ps = step_ps
        self.corr_stride = corr_stride
        self.extra = extra      # encoded stats appended to every event (see _extra_stats)

    def line(self, line: XLine) -> _LineTemplate:
        buf = bytearray()
        holes: dict[str, list[tuple[int, int, int]]] = {k: [] for k in _WIDTH}
        origin_shift_ps = OFFSET_BASE_PS
        for event in line.events:
            body = bytearray()
            local: list[tuple[str, int, int, int]] = []  # kind, pos in body, base, inc
            body += _key(1, 0) + _varint(event.metadata_id)
            body += _key(2, 0)
            local.append(("offset", len(body), event.offset_ps + origin_shift_ps, self.step_ps))
            body += bytes(_WIDTH["offset"])
            if event.duration_ps:
                body += _key(3, 0) + _varint(event.duration_ps)
            for stat in event.stats:
                kind = _VARYING_STATS.get(self.stat_names[stat.metadata_id])
                if kind is None:
                    payload = stat.SerializeToString()
                    body += _key(4, 2) + _varint(len(payload)) + payload
                    continue
                field = 3 if stat.WhichOneof("value") == "uint64_value" else 4
                value = getattr(stat, stat.WhichOneof("value"))
                head = _key(1, 0) + _varint(stat.metadata_id) + _key(field, 0)
                body += _key(4, 2) + _varint(len(head) + _WIDTH[kind]) + head
                if kind == "corr":
                    local.append((kind, len(body), CORRELATION_BASE + value, self.corr_stride))
                else:
                    local.append((kind, len(body), STEP_BASE + value, 1))
                body += bytes(_WIDTH[kind])
            body += self.extra
            prefix = _key(4, 2) + _varint(len(body))
            start = len(buf) + len(prefix)
            for kind, pos, base, inc in local:
                holes[kind].append((start + pos, base, inc))
            buf += prefix + body
        header = XLine(id=line.id, name=line.name,
                       timestamp_ns=line.timestamp_ns + CLOCK_SHIFT_NS - origin_shift_ps // 1000,
                       display_name=line.display_name).SerializeToString()
        arrays = {}
        for kind, rows in holes.items():
            if rows:
                table = np.array(rows, dtype=np.uint64).reshape(-1, 3)
                arrays[kind] = (table[:, 0].astype(np.int64), table[:, 1], table[:, 2])
        return _LineTemplate(header, np.frombuffer(bytes(buf), dtype=np.uint8),
                             arrays, len(line.events))


def _fill(block: np.ndarray, holes, first_step: int) -> None:
    """Write the varints of steps ``first_step ..`` into a (steps, bytes) block."""
    steps = np.arange(first_step, first_step + block.shape[0], dtype=np.uint64)[:, None]
    for kind, (pos, base, inc) in holes.items():
        width = _WIDTH[kind]
        values = base[None, :] + inc[None, :] * steps
        lo, hi = np.uint64(1 << (7 * (width - 1))), np.uint64(1 << (7 * width))
        if values.min() < lo or values.max() >= hi:
            raise OverflowError(f"{kind} values left their {width}-byte varint band")
        for i in range(width):
            byte = (values >> np.uint64(7 * i)) & np.uint64(0x7F)
            if i < width - 1:
                byte |= np.uint64(0x80)
            block[:, pos + i] = byte.astype(np.uint8)


def _extra_stats(plane: XPlane, count: int) -> bytes:
    """COUNT more stats for every event of PLANE, of names the analysis does not read (as the
    profiler's context, device and queue ids are), registered in the plane's stat metadata:
    alternately an int and a short string, about 10 bytes each on the wire."""
    out = b""
    first = max(plane.stat_metadata, default=0) + 1
    for i in range(count):
        sid = first + i
        plane.stat_metadata[sid].id = sid
        plane.stat_metadata[sid].name = f"bench_extra_{i}"
        stat = XStat(metadata_id=sid)
        if i % 2:
            stat.str_value = f"v{i:04d}"
        else:
            stat.int64_value = 100_000 + i
        payload = stat.SerializeToString()
        out += _key(4, 2) + _varint(len(payload)) + payload
    return out


# The benchmark's capture shapes (issue 32): keyword arguments of make_capture for each.
SHAPES: dict[str, dict] = {
    # 8 GPUs, 1000 kernels a step each; the host plane is 41% of the file, 38-39 bytes an event.
    "bench": {"gpus": 8},
    # a host plane larger than all GPU planes together (as in real TensorFlow captures):
    # 4 GPUs and host events about 60 bytes each.
    "host": {"gpus": 4, "host_extra_stats": 2},
    # a host plane twice the GPU planes together, as in real TensorFlow GPU captures (2-3x):
    # host events of ~120 bytes (8 more stats each), 4 GPUs.
    "tf": {"gpus": 4, "host_extra_stats": 8},
    # every event carries 8 more stats (host and devices), most of them skipped by the decoder.
    "stats": {"gpus": 8, "host_extra_stats": 8, "device_extra_stats": 8},
    # long steps: 10x the kernels (and host launches) per step and 10x as long, a tenth of the steps.
    "long": {"gpus": 8, "kernels_per_step": 10_000, "step_ms": 300.0},
    # many small planes: 32 GPUs of 250 kernels a step.
    "planes": {"gpus": 32, "kernels_per_step": 250},
    # one GPU (what most users train on): 2000 kernels a step, launched from one thread.
    "single": {"gpus": 1},
    # eight GPUs, many short Keras-3 steps (issue 46): 32 ms steps of 600 kernels per GPU, each
    # GPU launched from its own launch thread, two NCCL all-reduces of 0.6 ms and an input wait
    # of 0.2 ms per step.
    "steps8": {"gpus": 8, "kernels_per_step": 600, "step_ms": 32.0, "marker": "keras3",
               "allreduce_calls": 2, "collective_frac": 1.2 / 32, "input_wait_frac": 0.2 / 32},
}


@dataclasses.dataclass
class CaptureInfo:
    path: Path
    bytes: int
    steps: int
    events: int
    kernel_events: int  # compute + collective kernels on GPU planes
    seconds: float


def make_capture(out: Path | str, size_mb: float, gpus: int = 1, *, run: str = "run",
                 session: str = "2024_01_01_00_00_00", host: str = "bench-host",
                 kernels_per_step: int | None = None, step_ms: float = 30.0,
                 seed: int = 0, host_extra_stats: int = 0, device_extra_stats: int = 0,
                 marker: str = "r", allreduce_calls: int | None = None,
                 collective_frac: float | None = None, input_wait_frac: float = 0.08) -> CaptureInfo:
    """Write a capture of about ``size_mb`` MB into the logdir ``out``; every host (device)
    event carries HOST_EXTRA_STATS (DEVICE_EXTRA_STATS) more stats the analysis does not read.
    MARKER, ALLREDUCE_CALLS (4 on several GPUs unless given), COLLECTIVE_FRAC and
    INPUT_WAIT_FRAC go to the synthetic step builder (``tests/synth.py``)."""
    began = time.perf_counter()
    kernels = kernels_per_step or (2000 if gpus <= 1 else 1000)
    template = build_training_session(
        steps=1, step_ms=step_ms, gpus=gpus, marker=marker, kernels_per_step=kernels,
        input_wait_frac=input_wait_frac, host_overhead_frac=0.03, launch_frac=0.05,
        memcpy_frac=0.03, h2d_bytes=6 << 20, d2h_bytes=64 << 10,
        fp16_frac=0.35, tensor_core_frac=0.3, host_ops_frac=0.05,
        allreduce_calls=(4 if gpus > 1 else 0) if allreduce_calls is None else allreduce_calls,
        collective_frac=collective_frac,
        gpu_compute_scale={0: 1.1} if gpus > 1 else None, launch_skew_ms=0.2,
        cc=(8, 0), derived_lines=True, group_ids=True, seed=seed)
    space = template.space
    step_ps = round(step_ms * PS_PER_MS)
    corr_ids = [stats["correlation_id"] for *_, stats in iter_events(space) if "correlation_id" in stats]
    corr_stride = max(corr_ids) - min(corr_ids) + 1 if corr_ids else 1

    planes = []  # (plane header bytes, [(line template)])
    per_step = 0
    kernel_templates = 0
    for plane in space.planes:
        header = XPlane()
        header.CopyFrom(plane)
        del header.lines[:]
        extra = _extra_stats(header, host_extra_stats if plane.name.startswith("/host:") else
                             device_extra_stats if plane.name.startswith("/device:") else 0)
        enc = _Encoder(header, step_ps, corr_stride, extra)
        lines = [enc.line(line) for line in plane.lines if line.id != STEPS_LINE_ID]
        planes.append((header, lines))
        per_step += sum(t.body.size for t in lines)
        kernel_templates += sum(len(line.events) for line in plane.lines
                                if plane.name.startswith("/device:GPU:")
                                and line.name.startswith("Stream #") and "Memcpy" not in line.name)
    steps = max(1, min(MAX_STEPS, int(size_mb * 1e6 / per_step)))
    for (header, lines), plane in zip(planes, space.planes):
        steps_line = [line for line in plane.lines if line.id == STEPS_LINE_ID]
        if steps_line:
            lines.append(_steps_line(header, steps_line[0], steps, step_ps))
    planes = [(header.SerializeToString(), lines) for header, lines in planes]

    def framed(field: int, length: int) -> bytes:
        return _key(field, 2) + _varint(length)

    # Sizes first (everything is known in advance), then stream the bytes.
    line_sizes = [[len(t.header) + len(t.fixed) + t.body.size * steps for t in lines]
                  for _, lines in planes]
    plane_sizes = [len(h) + sum(len(framed(3, s)) + s for s in sizes)
                   for (h, _), sizes in zip(planes, line_sizes)]
    path = session_dir(out, run, session) / f"{host}.xplane.pb"
    path.parent.mkdir(parents=True, exist_ok=True)
    events = 0
    chunk_bytes = 64 << 20
    with open(path, "wb") as f:
        for (header, lines), sizes, psize in zip(planes, line_sizes, plane_sizes):
            f.write(framed(1, psize))
            f.write(header)
            for tpl, size in zip(lines, sizes):
                f.write(framed(3, size))
                f.write(tpl.header)
                f.write(tpl.fixed)
                events += tpl.events * steps + tpl.fixed_events
                if not tpl.body.size:
                    continue
                chunk = max(1, chunk_bytes // tpl.body.size)
                for first in range(0, steps, chunk):
                    n = min(chunk, steps - first)
                    block = np.tile(tpl.body, (n, 1))
                    _fill(block, tpl.holes, first)
                    f.write(block.tobytes())
    return CaptureInfo(path, path.stat().st_size, steps, events, kernel_templates * steps,
                       time.perf_counter() - began)


def _steps_line(header: XPlane, line: XLine, steps: int, step_ps: int) -> _LineTemplate:
    """The derived ``Steps`` line: one event per step, each with its own name."""
    first = line.events[0]
    stats = {header.stat_metadata[s.metadata_id].name: s.metadata_id for s in first.stats}
    out = XLine(id=line.id, name=line.name,
                timestamp_ns=line.timestamp_ns + CLOCK_SHIFT_NS - OFFSET_BASE_PS // 1000)
    next_id = max(header.event_metadata) + 1
    for step in range(steps):
        number = STEP_BASE + step
        header.event_metadata[next_id + step].id = next_id + step
        header.event_metadata[next_id + step].name = str(number)
        event = out.events.add(metadata_id=next_id + step,
                               offset_ps=first.offset_ps + OFFSET_BASE_PS + step * step_ps,
                               duration_ps=first.duration_ps)
        event.stats.add(metadata_id=stats["group_id"], int64_value=number)
        event.stats.add(metadata_id=stats["step_name"], str_value=str(number))
    header_bytes = XLine(id=out.id, name=out.name, timestamp_ns=out.timestamp_ns).SerializeToString()
    body = out.SerializeToString()[len(header_bytes):]
    return _LineTemplate(header_bytes, np.frombuffer(b"", dtype=np.uint8), {}, 0, body, steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=float, required=True)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--out", required=True, help="logdir to write into")
    parser.add_argument("--run", default="run")
    parser.add_argument("--session", default="2024_01_01_00_00_00")
    parser.add_argument("--host", default="bench-host")
    parser.add_argument("--kernels-per-step", type=int)
    parser.add_argument("--shape", choices=sorted(SHAPES),
                        help="one of the benchmark's shapes (sets --gpus and --kernels-per-step)")
    args = parser.parse_args(argv)
    shape = dict(SHAPES[args.shape]) if args.shape else {"gpus": args.gpus, "kernels_per_step": args.kernels_per_step}
    gpus = shape.pop("gpus")
    info = make_capture(args.out, args.size_mb, gpus, run=args.run, session=args.session,
                        host=args.host, **shape)
    print(f"{info.path}: {info.bytes / 1e6:.1f} MB, {info.steps} steps, "
          f"{info.events} events ({info.kernel_events} kernels) in {info.seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
