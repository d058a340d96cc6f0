"""What a large JSON that is not a trace costs a logdir search (issue 41: under 50 ms, under 20 MB).

Discovery sniffs every ``.json`` / ``.json.gz`` of a logdir for a Chrome trace, reading at most
``HEAD_BYTES`` of each.  This writes a logdir holding one small PyTorch trace, and a copy of it
that also holds a 1 GB non-trace ``data.json`` (real bytes, not sparse) and a ``dump.json.gz``
inflating to 1 GB, then, in a fresh process, times ``find_sessions`` on each (the median of
--repeat searches after one untimed search) and reads the process's peak RSS before and after
the searches of the large one.

    python benchmarks/sniff.py [--size-mb 1024] [--repeat 20] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

_CHILD = """
import json, statistics, sys, time
from tb_gpuadvisor.input.discovery import find_sessions

def peak_kb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))

small, large, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])

def timed(path):
    find_sessions(path)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        refs = find_sessions(path)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000, len(refs)

base_ms, base_refs = timed(small)
before = peak_kb()
first = time.perf_counter()
find_sessions(large)
first_ms = (time.perf_counter() - first) * 1000
large_ms, large_refs = timed(large)
print(json.dumps({"base_ms": base_ms, "large_ms": large_ms, "first_large_ms": first_ms,
                  "sessions": [base_refs, large_refs], "peak_rss_growth_mb": (peak_kb() - before) / 1024}))
"""


def _write_logdirs(root: Path, size: int) -> tuple[Path, Path]:
    from synth_kineto import kineto_trace, write_trace

    small, large = root / "small", root / "large"
    for logdir in (small, large):
        write_trace(logdir / "run" / "trace.json", kineto_trace(steps=3, kernels=3))
    row = json.dumps({"id": 123456, "label": "cat", "box": [0.1, 0.2, 0.3, 0.4]}).encode() + b",\n"
    block = row * ((1 << 20) // len(row))
    data = large / "data" / "data.json"
    data.parent.mkdir(parents=True)
    with open(data, "wb") as out:
        out.write(b'{"annotations": [\n')
        written = 0
        while written < size:
            out.write(block)
            written += len(block)
        out.write(b'{}]}\n')
    packer = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    with open(large / "data" / "dump.json.gz", "wb") as out:
        out.write(packer.compress(b'{"rows": ['))
        for _ in range(size // len(block)):
            out.write(packer.compress(block))
        out.write(packer.compress(b'{}]}') + packer.flush())
    assert gzip.open(large / "data" / "dump.json.gz").read(10) == b'{"rows": ['
    return small, large


def measure(size_mb: int, repeat: int, workdir: str | None = None) -> dict:
    """The child's measurements for logdirs with SIZE_MB of non-trace JSON, REPEAT searches each."""
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        small, large = _write_logdirs(Path(tmp), size_mb << 20)
        child = subprocess.run([sys.executable, "-c", _CHILD, str(small), str(large), str(repeat)],
                               capture_output=True, text=True, check=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    return json.loads(child.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--workdir", help="where the logdirs go (default: a temporary folder)")
    args = parser.parse_args()
    result = measure(args.size_mb, args.repeat, args.workdir)
    added = result["large_ms"] - result["base_ms"]
    print(f"logdir search: {result['base_ms']:.2f} ms with one trace, {result['large_ms']:.2f} ms with a "
          f"{args.size_mb} MB non-trace .json and a .json.gz inflating to {args.size_mb} MB beside it "
          f"(+{added:.2f} ms; first search {result['first_large_ms']:.2f} ms); peak RSS grew "
          f"{result['peak_rss_growth_mb']:.1f} MB; sessions found {result['sessions']}")


if __name__ == "__main__":
    main()
