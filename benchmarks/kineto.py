"""Speed and memory of PyTorch (Kineto JSON) traces, end to end.

Each measurement runs in a fresh process, which reports its own peak RSS (ru_maxrss):
  - ``decode``: the JSON decoders alone on the inflated text (msgspec typed, orjson, json);
  - ``read``: the Kineto adapter (read, inflate, decode, build the host tables);
  - ``analyze``: the whole report of the session (``build_report``, one local process);
  - ``json_load``: a bare ``json.load`` of the same file (the standard library, every field
    made a Python object), the yardstick of issue 32: the whole report within 1.2x of it.

Inputs: every ``*.pt.trace.json[.gz]`` of the corpus, and a generated trace made by tiling one
corpus trace (its events repeated, shifted in time and correlation id) up to ``--gb``.

    python benchmarks/kineto.py                 # corpus + a 1 GB tiled trace
    python benchmarks/kineto.py --gb 0.2 --skip-corpus
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("TB_GPUADVISOR_CORPUS", REPO.parent / "shared" / "corpus"))
TILE_SOURCE = "pytorch-h100-owlv2/worker0.pt.trace.json.gz"


def _child(mode: str, path: str, backend: str = "") -> dict:
    """Run one measurement in a new interpreter; its wall time and peak RSS."""
    code = (
        "import sys, time\n"
        "from tb_gpuadvisor.input.kineto.build import read\n"
        "from tb_gpuadvisor.input.kineto.decode import decode, inflate\n"
        "from tb_gpuadvisor.input.discovery import find_sessions\n"
        "from tb_gpuadvisor.multihost import build_report\n"
        "from tb_gpuadvisor.multihost.engine import LocalEngine\n"
        "from tb_gpuadvisor.input.files import read_bytes\n"
        f"mode, path, backend = {mode!r}, {path!r}, {backend!r}\n"
        "import resource\n"
        "ready = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "t, cpu = time.perf_counter(), time.process_time()\n"
        "if mode == 'decode':\n"
        "    data = inflate(read_bytes(path)); t, cpu = time.perf_counter(), time.process_time()\n"
        "    decode(data, backend)\n"
        "elif mode == 'json_load':\n"
        "    import gzip, json\n"
        "    json.load(gzip.open(path) if path.endswith('.gz') else open(path, 'rb'))\n"
        "elif mode == 'read':\n"
        "    read(path, 'h')\n"
        "else:\n"
        "    with LocalEngine(workers=1) as engine:\n"
        "        build_report(find_sessions(path), engine=engine)\n"
        "kids = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(time.perf_counter() - t, time.process_time() - cpu, ready, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,\n"
        "      kids.ru_utime + kids.ru_stime, kids.ru_maxrss)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), check=True)
    seconds, cpu, ready_kb, peak_kb, helpers_cpu, helper_kb = out.stdout.split()[-6:]
    # The decoder's helper processes (a large local trace is decoded on every core) count too:
    # their CPU seconds, and the largest one's peak RSS beside this process's.
    return {"seconds": float(seconds), "cpu_seconds": float(cpu) + float(helpers_cpu),
            "peak_mb": int(peak_kb) / 1024, "ready_mb": int(ready_kb) / 1024,
            "helper_peak_mb": int(helper_kb) / 1024}


def json_size(path: Path) -> int:
    """Bytes of JSON text (inflated for .gz)."""
    if path.name.endswith(".gz"):
        with gzip.open(path) as f:
            return sum(len(chunk) for chunk in iter(lambda: f.read(1 << 24), b""))
    return path.stat().st_size


def tile(source: Path, target: Path, gigabytes: float) -> Path:
    """SOURCE's events repeated back to back (times and correlation ids shifted) up to GIGABYTES."""
    trace = json.load(gzip.open(source))
    events = [e for e in trace["traceEvents"] if e.get("ph") != "M"]
    meta = [e for e in trace["traceEvents"] if e.get("ph") == "M"]
    times = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(times) - min(times) + 1000.0
    # Each copy's ids follow the last copy's, as a longer run of the profiler numbers them (a
    # gap per copy would look like a trace sampled after capture).
    numbers = [e["args"]["correlation"] for e in events
               if isinstance(e.get("args"), dict) and isinstance(e["args"].get("correlation"), int)]
    ids = max(numbers) - min(numbers) + 1 if numbers else 0
    one = len(json.dumps(events))
    copies = max(1, int(gigabytes * 1e9 / one))
    head = {k: v for k, v in trace.items() if k != "traceEvents"}
    with open(target, "w") as out:
        out.write(json.dumps(head)[:-1] + ', "traceEvents": [\n')
        out.write(",\n".join(json.dumps(e) for e in meta))
        for k in range(copies):
            shifted = []
            for e in events:
                e = dict(e)
                if isinstance(e.get("ts"), (int, float)):
                    e["ts"] = round(e["ts"] + k * span, 3)
                args = e.get("args")
                if isinstance(args, dict) and "correlation" in args:
                    e["args"] = dict(args, correlation=args["correlation"] + k * ids)
                if e.get("name", "").startswith("ProfilerStep#"):
                    e["name"] = f"ProfilerStep#{k}"
                shifted.append(json.dumps(e))
            out.write(",\n" + ",\n".join(shifted))
        out.write("\n]}\n")
    return target


def measure(path: Path, modes: tuple[str, ...]) -> dict:
    size = json_size(path)
    row = {"file": str(path.relative_to(CORPUS)) if CORPUS in path.parents else path.name,
           "json_mb": size / 1e6}
    for mode in modes:
        if mode == "decode":
            for backend in ("msgspec", "orjson", "json"):
                got = _child("decode", str(path), backend)
                row[f"decode_{backend}_mb_s"] = size / 1e6 / got["cpu_seconds"]
        else:
            got = _child(mode, str(path))       # one file: a session of that rank alone
            row[f"{mode}_mb_s"] = size / 1e6 / got["cpu_seconds"]     # per CPU second: the machine is shared
            row[f"{mode}_wall_mb_s"] = size / 1e6 / got["seconds"]
            row[f"{mode}_s"] = got["seconds"]
            row[f"{mode}_peak_mb"] = got["peak_mb"]
            row[f"{mode}_helper_peak_mb"] = got["helper_peak_mb"]
            row[f"{mode}_rss_x"] = got["peak_mb"] * 2**20 / size
            # What the work itself added to the peak, above the interpreter with its imports.
            row[f"{mode}_added_x"] = (got["peak_mb"] - got["ready_mb"]) * 2**20 / size
            row[f"{mode}_cpu_s"] = got["cpu_seconds"]
    if "analyze" in modes and "json_load" in modes:
        row["analyze_over_json_load_wall"] = row["analyze_s"] / row["json_load_s"]
        row["analyze_over_json_load_cpu"] = row["analyze_cpu_s"] / row["json_load_cpu_s"]
    return row


def main() -> None:
    # MB/s are per CPU second of the measured process and its helper processes (every thread's CPU
    # time); wall-clock MB/s are reported beside them, and match on an idle machine.
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="size of the tiled trace (0: none)")
    parser.add_argument("--skip-corpus", action="store_true")
    parser.add_argument("--modes", default="decode,read,analyze,json_load",
                        help="what to measure, of decode, read, analyze, json_load")
    parser.add_argument("--keep", type=Path, help="folder to write the tiled trace in and keep (reused)")
    args = parser.parse_args()
    modes = tuple(m for m in args.modes.split(",") if m)
    rows = []
    if not args.skip_corpus:
        for path in sorted(CORPUS.glob("pytorch-*/**/*.pt.trace.json*")):
            rows.append(measure(path, modes))
            print(json.dumps(rows[-1]), flush=True)
    if args.gb > 0:
        with tempfile.TemporaryDirectory() as tmp:
            folder = args.keep / f"tiled-{args.gb:g}" if args.keep else Path(tmp) / "tiled"
            path = folder / "worker0.pt.trace.json"
            if not path.exists():
                folder.mkdir(parents=True, exist_ok=True)
                started = time.perf_counter()
                tile(CORPUS / TILE_SOURCE, path.with_suffix(".part"), args.gb).rename(path)
                print(f"tiled {json_size(path) / 1e9:.2f} GB in {time.perf_counter() - started:.0f} s", flush=True)
            rows.append(measure(path, modes))
            print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
