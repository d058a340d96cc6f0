"""How fast and how big one step of the tab's timeline is, once a session is analysed.

The /timeline route cuts a step out of an analysis the service holds (service.HELD_SESSIONS):
this times that cut and its JSON, as the route does it, on a big capture. The analysis itself is
timed once, for reference (it is what the first request waits for).

    python benchmarks/timeline.py --size-mb 978 --gpus 8 --workdir /tmp/tl-bench [--keep]

writes the capture with make_capture.py (reused when --workdir already holds it, removed at
the end unless --keep), analyses it in this process, then draws REPEAT times each of the
representative, first and last steps. Prints one JSON object: per step the median and worst
milliseconds (cut + json.dumps) and the bytes of the answer, the rectangles, and the analysis
time and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from tb_gpuadvisor.input.discovery import find_sessions  # noqa: E402
from tb_gpuadvisor.pipeline import analysed_session  # noqa: E402


def _capture(workdir: Path, size_mb: float, gpus: int) -> Path:
    logdir = workdir / f"tl-{size_mb:g}mb-{gpus}gpu"
    if not any(logdir.rglob("*.xplane.pb")):
        subprocess.run([sys.executable, str(_REPO / "benchmarks" / "make_capture.py"), "--size-mb", str(size_mb),
                        "--gpus", str(gpus), "--out", str(logdir)], check=True, stdout=sys.stderr)
    return logdir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=float, default=978)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the capture for a later run")
    args = parser.parse_args(argv)
    logdir = _capture(args.workdir, args.size_mb, args.gpus)
    try:
        (ref,) = find_sessions(str(logdir))
        size = sum(p.stat().st_size for p in logdir.rglob("*.xplane.pb"))
        began = time.perf_counter()
        analysed = analysed_session(ref)
        analysis_s = time.perf_counter() - began
        steps = analysed.analysis.model.steps
        out = {"load_average": [round(x, 2) for x in os.getloadavg()], "capture_mb": round(size / 1e6, 1), "steps": len(steps), "analysis_s": round(analysis_s, 2),
               "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), "draws": {}}
        for label, step in (("representative", None), ("first", int(steps.number[0])),
                            ("last", int(steps.number[-1]))):
            times, body = [], ""
            for _ in range(args.repeat):
                began = time.perf_counter()
                body = json.dumps(analysed.timeline(step))
                times.append(1000 * (time.perf_counter() - began))
            view = json.loads(body)
            out["draws"][label] = {
                "step": view["step"], "median_ms": round(statistics.median(times), 1), "worst_ms": round(max(times), 1),
                "bytes": len(body), "rows": len(view["rows"]), "rectangles": sum(len(r["start"]) for r in view["rows"]),
                "marked": {m["check"]: m["step_percent"] for m in view["findings"] if "why" not in m}}
        print(json.dumps(out, indent=1))
    finally:
        if not args.keep:
            shutil.rmtree(logdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
