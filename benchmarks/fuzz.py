"""Differential fuzzing of the two plane decoders (C and pure Python).

Seeds are synthetic captures (tests/synth.py) and, when present, the small real
captures of the shared corpus.  A second target is the PyTorch (Kineto JSON) reader
(``run_kineto``): synthetic traces and windows of every corpus trace, cut short, given fields
of other types, NaN and numbers out of range, deep nesting, keys twice, bytes that are not
UTF-8 and strings of megabytes (``kineto_mutate``), are read through every JSON decoder
(msgspec, orjson, json), which must agree (the same columns, or all a CaptureError) and never
raise anything else.  Each input is a seed mutated by byte flips, cuts,
duplicated slices or inserted varints; every plane is then decoded by both
decoders, which must agree: the same columns, or both a CaptureError.  Anything
else (another exception, a crash, a disagreement) fails.

    python benchmarks/fuzz.py --seconds 600            # a long run
    python benchmarks/fuzz.py --target kineto --seconds 600
    python benchmarks/fuzz.py --inputs 2000 --seed 7   # a reproducible batch

The test suite runs a bounded batch (tests/test_fuzz.py).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import resource
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from tb_gpuadvisor.input.xplane import decode  # noqa: E402
from tb_gpuadvisor.input.xplane.reader import index_space
from tb_gpuadvisor.input.files import CaptureError

WANTED = ("correlation_id", "group_id", "level 0", "tf_op", "memcpy_details", "kernel_details", "step_num", "_r")
CORPUS = Path(os.environ.get("TB_GPUADVISOR_CORPUS", REPO.parent / "shared" / "corpus"))
MAX_SEED_BYTES = 200_000


def _choose(plane) -> tuple[str, ...] | None:
    return WANTED if plane.name.startswith(("/device:", "/host:CPU")) else None


def outcome(data: bytes, fast: bool, parts: int = 1) -> object:
    """What one decoder makes of every plane: comparable values, "error" for a CaptureError
    (the C decoder's lines cut into PARTS runs decoded on as many threads)."""
    view = memoryview(data)
    try:
        spans = index_space(view).plane_spans
    except CaptureError:
        return "error"
    planes = []
    for span in spans:
        try:
            dp = decode.decode_plane(view[span[0]:span[1]], _choose, fast=fast, parts=parts)
        except CaptureError:
            planes.append("error")
            continue
        if dp is None:
            planes.append(None)
            continue
        planes.append((dp.shell.SerializeToString(deterministic=True), dp.lines, dp.metadata_id.tolist(),
                       dp.offset_ps.tolist(), dp.duration_ps.tolist(), dp.strings,
                       {name: (c.event.tolist(), c.kind.tolist(), c.value.tolist())
                        for name, c in sorted(dp.stats.items())}))
    return planes


def seeds() -> list[bytes]:
    from synth import build_training_session

    found = [build_training_session(steps=2, gpus=2, memcpy_frac=0.05).space.SerializeToString(),
             build_training_session(steps=2, framework="jax", marker="none").space.SerializeToString(),
             build_training_session(steps=2, marker="r", cupti_plane=True, launch_api="cuLaunchKernel").space.SerializeToString()]
    if CORPUS.is_dir():
        found += [p.read_bytes() for p in sorted(CORPUS.rglob("*.xplane.pb")) if p.stat().st_size <= MAX_SEED_BYTES]
    return found


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def mutate(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        at = rng.randrange(len(out))
        kind = rng.randrange(5)
        if kind == 0:                                   # flip a byte
            out[at] = rng.randrange(256)
        elif kind == 1:                                 # cut a slice
            del out[at:at + rng.randint(1, 64)]
        elif kind == 2:                                 # duplicate a slice
            out[at:at] = out[at:at + rng.randint(1, 32)]
        elif kind == 3:                                 # a tag or value with edge-case numbers
            number = rng.choice([0, 1, 2, 3, 4, 5, 7, 11, (1 << 29) - 1, 1 << 29, 1 << 61])
            wire = rng.choice([0, 1, 2, 3, 4, 5, 6, 7])
            out[at:at] = varint(number << 3 | wire)
        else:                                           # a big varint (timestamps, ref values)
            out[at:at] = varint(rng.choice([1 << 62, (1 << 63) + 5, (1 << 64) - 1, 1 << 31]))
        if not out:
            out = bytearray(data[:1])
    return bytes(out)


def _campaign(pool: list[bytes], derive, problem, inputs: int, seconds: float, seed: int,
              label: str) -> tuple[int, list[str]]:
    """(inputs tried, failures): inputs DERIVEd from random members of POOL, each one that
    PROBLEM finds something wrong with reported; stops at INPUTS or SECONDS, whichever comes first."""
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    failures: list[str] = []
    tried = 0
    while tried < inputs and time.monotonic() < deadline:
        data = derive(rng.choice(pool), rng)
        tried += 1
        found = problem(data)
        if found:
            failures.append(f"{label}input {tried} (seed {seed}): {found}")
    return tried, failures


def _decoders_disagree(data: bytes) -> str | None:
    slow = outcome(data, False)
    return None if outcome(data, True) == slow == outcome(data, True, parts=3) else f"{data.hex()[:200]}..."


def run(inputs: int, seconds: float, seed: int) -> tuple[int, list[str]]:
    """(inputs tried, disagreements of the C and pure-Python decoders on mutated captures)."""
    if not decode.has_fast_decoder():
        return 0, []
    return _campaign(seeds(), mutate, _decoders_disagree, inputs, seconds, seed, "")


KINETO_WINDOW = 400             # events of a corpus trace kept in one seed (with its metadata)
# Values put where a trace has a number or a string: other types, edge numbers, nesting.
_ODD_VALUES = ("12", "", None, True, False, [], {}, [1, 2], {"a": 1}, -1, 0, 1.5, -0.0, 2**53 + 1, 2**63 - 1,
               2**63, 2**64, -2**63 - 1, 1e300, -1e300, 5e-324)
_FIELDS = ("ts", "dur", "args", "name", "cat", "ph", "pid", "tid")
_ARG_FIELDS = ("correlation", "device", "stream", "bytes", "name", "In msg nelems", "Collective name",
               "Process Group Ranks", "Total Allocated", "Bytes", "Device Type", "Device Id")
_NON_NUMBERS = (b"NaN", b"-NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400", b"1e-400",
                b"123456789012345678901234567890", b"-0", b"01", b"1.", b".5", b"0x10")


def kineto_seeds(seed: int = 0) -> list[bytes]:
    """Synthetic traces (both category spellings, a bare array) and a window of KINETO_WINDOW
    events of every corpus PyTorch trace (its header and metadata kept), as Kineto lays them out."""
    import gzip
    import json

    from synth_kineto import kineto_trace

    rng = random.Random(seed)
    old = kineto_trace(steps=2, kernels=4, old=True)
    found = [json.dumps(kineto_trace(steps=2, kernels=6, input_us=50, memory=(1 << 20, 2 << 20),
                                     collectives=(("allreduce", "ncclKernel_AllReduce", 1024, 30.0),))).encode(),
             json.dumps(old).encode(), json.dumps(old["traceEvents"], indent=1).encode()]
    if CORPUS.is_dir():
        for path in sorted(CORPUS.glob("pytorch-*/**/*.pt.trace.json*")):
            data = path.read_bytes()
            trace = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
            events = trace["traceEvents"]
            meta = [e for e in events if e.get("ph") == "M"]
            timed = [e for e in events if e.get("ph") != "M"]
            at = rng.randrange(max(len(timed) - KINETO_WINDOW, 1))
            found.append(json.dumps(dict(trace, traceEvents=meta + timed[at:at + KINETO_WINDOW]), indent=1).encode())
    return found


def _events_of(trace) -> list:
    return trace if isinstance(trace, list) else trace.get("traceEvents", [])


def kineto_mutate(data: bytes, rng: random.Random) -> bytes:
    """One of the ways a trace goes wrong: cut short, a field of another type, a number JSON does
    not allow or cannot hold, deep nesting, a key twice, bytes that are not UTF-8, a string of
    megabytes, or the bytes flipped and spliced (mutate); a tenth of them gzipped."""
    import gzip
    import json

    kind = rng.randrange(8)
    if kind == 0:                                   # cut short, as a trace still being written
        out = data[:rng.randrange(1, len(data))]
    elif kind == 1:                                 # a field or an arg of another type
        trace = json.loads(data)
        events = _events_of(trace)
        for _ in range(rng.randint(1, 4)):
            event = rng.choice(events)
            if rng.random() < 0.5 or not isinstance(event.get("args"), dict):
                event[rng.choice(_FIELDS)] = rng.choice(_ODD_VALUES)
            else:
                event["args"][rng.choice(_ARG_FIELDS)] = rng.choice(_ODD_VALUES)
        out = json.dumps(trace).encode()
    elif kind == 2:                                 # NaN, infinities and numbers out of range
        spots = [m.end() for m in re.finditer(rb'"(?:ts|dur|correlation|device|stream|bytes)": ', data)]
        out = bytearray(data)
        for at in sorted(rng.sample(spots, min(len(spots), rng.randint(1, 3))), reverse=True):
            end = re.compile(rb"[-+0-9.eE]*").match(out, at).end()
            out[at:end] = rng.choice(_NON_NUMBERS)
        out = bytes(out)
    elif kind == 3:                                 # deep nesting inside an event's args
        depth = rng.choice([10, 500, 900, 1000, 1023, 1024, 1025, 2000, 100_000])
        nested = rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
        at = data.find(b'"args": {', rng.randrange(len(data)))
        at = at if at >= 0 else data.find(b'"args": {')
        if at < 0:
            return mutate(data, rng)
        at += len(b'"args": {')
        out = data[:at] + b'"deep": ' + nested[0] * depth + b"1" + nested[1] * depth + b", " + data[at:]
    elif kind == 4:                                 # a key twice: the last one is the value
        key = rng.choice([b'"ts": ', b'"dur": ', b'"name": ', b'"args": ', b'"ph": ', b'"traceEvents": '])
        at = data.find(key, rng.randrange(len(data)))
        if at < 0:
            return mutate(data, rng)
        out = data[:at] + key + rng.choice([b"7", b'"x"', b"null", b"{}", b"[]"]) + b", " + data[at:]
    elif kind == 5:                                 # bytes that are not UTF-8 inside a string
        at = data.find(b'"name": "', rng.randrange(len(data)))
        at = (at if at >= 0 else 0) + len(b'"name": "')
        out = data[:at] + bytes(rng.randrange(0x80, 0x100) for _ in range(rng.randint(1, 4))) + data[at:]
    elif kind == 6:                                 # a name (kernel, frame, annotation) of megabytes
        trace = json.loads(data)
        event = rng.choice(_events_of(trace))
        event["name"] = rng.choice(["x", "\u00e9", "<b>", "\\"]) * rng.randint(1 << 18, 4 << 20)
        out = json.dumps(trace, ensure_ascii=rng.random() < 0.5).encode()
    else:
        out = mutate(data, rng)
    return gzip.compress(out, 1) if rng.random() < 0.1 else out


def kineto_outcome(data: bytes, backend: str) -> object:
    """What the Kineto reader makes of DATA through BACKEND: its columns once the host tables are
    built, "error" for a CaptureError, or ("raised", what) for anything else, a RuntimeWarning
    included: the bug this hunts."""
    from tb_gpuadvisor.input.kineto.build import build
    from tb_gpuadvisor.input.kineto.decode import decode

    try:
        with warnings.catch_warnings():         # numpy's warnings (a cast out of range) are bugs too
            warnings.simplefilter("error", RuntimeWarning)
            cols = decode(bytearray(data), backend)
            build(cols, "h")
    except CaptureError:
        return "error"
    except Exception as err:        # noqa: BLE001 - anything else is the bug this hunts
        return ("raised", f"{type(err).__name__}: {str(err)[:200]}")
    return cols


def kineto_problem(data: bytes) -> str | None:
    """None when every decoder raised nothing but CaptureError and the decoders an install pairs
    agree (the same columns, or both refused): msgspec with orjson, and msgspec without orjson
    with the standard library (nesting past Python's recursion limit is judged by orjson's limit
    where it is installed, by that recursion limit where it is not); else what went wrong."""
    from tb_gpuadvisor.input.kineto import decode as kineto_json

    outcomes = {backend: kineto_outcome(data, backend) for backend in ("msgspec", "orjson")}
    installed, kineto_json.orjson = kineto_json.orjson, None
    try:
        outcomes["msgspec alone"], outcomes["json"] = kineto_outcome(data, "msgspec"), kineto_outcome(data, "json")
    finally:
        kineto_json.orjson = installed
    raised = [f"{b} raised {o[1]}" for b, o in outcomes.items() if isinstance(o, tuple)]
    if raised:
        return "; ".join(raised)
    differ = [f"{fallback} vs {first} ({'refused' if outcomes[first] == 'error' else 'read'})"
              for first, fallback in (("msgspec", "orjson"), ("msgspec alone", "json"))
              if (outcomes[first] == "error") != (outcomes[fallback] == "error")
              or (outcomes[first] != "error" and not outcomes[first] == outcomes[fallback])]
    return None if not differ else f"{'; '.join(differ)} disagree: {data[:120]!r}"


def run_kineto(inputs: int, seconds: float, seed: int) -> tuple[int, list[str]]:
    """(inputs tried, failures) of the Kineto reader on mutated traces, on every decoder."""
    return _campaign(kineto_seeds(seed), kineto_mutate, kineto_problem, inputs, seconds, seed, "kineto ")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inputs", type=int, default=10**9)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", choices=("all", "xplane", "kineto"), default="all",
                        help="the plane decoders, the Kineto reader, or both (the time split between them)")
    args = parser.parse_args(argv)
    share = args.seconds / 2 if args.target == "all" else args.seconds
    tried, failures = run(args.inputs, share, args.seed) if args.target != "kineto" else (0, [])
    if args.target != "xplane":
        more, kineto_failures = run_kineto(args.inputs, share, args.seed)
        tried, failures = tried + more, failures + kineto_failures
    for line in failures[:20]:
        print(line)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{tried} inputs, {len(failures)} disagreements or crashes; peak RSS {peak:.0f} MiB")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
