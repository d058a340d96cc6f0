"""Differential fuzzing of the two plane decoders (C and pure Python).

Seeds are synthetic captures (tests/synth.py) and, when present, the small real
captures of the shared corpus.  A second target is the PyTorch (Kineto JSON) reader: mutated
and cut traces (synthetic ones and the small corpus ones) must give host tables or a
CaptureError, never another exception (``run_kineto``).  Each input is a seed mutated by byte flips, cuts,
duplicated slices or inserted varints; every plane is then decoded by both
decoders, which must agree: the same columns, or both a CaptureError.  Anything
else (another exception, a crash, a disagreement) fails.

    python benchmarks/fuzz.py --seconds 600            # a long run
    python benchmarks/fuzz.py --inputs 2000 --seed 7   # a reproducible batch

The test suite runs a bounded batch (tests/test_fuzz.py).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from tb_gpuadvisor.xspace import decode  # noqa: E402
from tb_gpuadvisor.xspace.reader import CaptureError, index_space  # noqa: E402

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


def kineto_seeds() -> list[bytes]:
    import gzip
    import json

    from synth_kineto import kineto_trace

    found = [json.dumps(kineto_trace(steps=2, kernels=6, input_us=50)).encode(),
             json.dumps(kineto_trace(steps=2, kernels=4, old=True)).encode()]
    if CORPUS.is_dir():
        found += [gzip.decompress(p.read_bytes()) for p in sorted(CORPUS.glob("pytorch-*/**/*.pt.trace.json.gz"))
                  if p.stat().st_size <= MAX_SEED_BYTES]
    return found


def kineto_outcome(data: bytes) -> str | None:
    """None when the reader made tables or said why not (CaptureError); else what went wrong."""
    from tb_gpuadvisor.adapters.kineto import build
    from tb_gpuadvisor.adapters.kineto_json import decode

    try:
        build(decode(bytearray(data)), "h")
    except CaptureError:
        pass
    except Exception as err:        # noqa: BLE001 - anything else is the bug this hunts
        return f"{type(err).__name__}: {err}"
    return None


def _cut_or_mutated(data: bytes, rng: random.Random) -> bytes:
    """A mutated trace, or (one time in five) a trace cut short, as a truncated download is."""
    return mutate(data, rng) if rng.random() < 0.8 else data[:rng.randrange(len(data))]


def run_kineto(inputs: int, seconds: float, seed: int) -> tuple[int, list[str]]:
    """(inputs tried, failures) of the Kineto reader on mutated traces."""
    return _campaign(kineto_seeds(), _cut_or_mutated, kineto_outcome, inputs, seconds, seed, "kineto ")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inputs", type=int, default=10**9)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    tried, failures = run(args.inputs, args.seconds / 2, args.seed)
    more, kineto_failures = run_kineto(args.inputs, args.seconds / 2, args.seed)
    tried, failures = tried + more, failures + kineto_failures
    for line in failures[:20]:
        print(line)
    print(f"{tried} inputs, {len(failures)} disagreements")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
