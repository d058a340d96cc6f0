"""Side by side with HolisticTraceAnalysis 0.5.0 on the corpus's PyTorch traces (issue 23).

For every folder of ``*.pt.trace.json[.gz]`` files under ``corpus/pytorch-*`` (one session),
in turn, each in a cold process, ``--repeat`` times (median kept):
  - ours: ``python -m tb_gpuadvisor.cli analyze FOLDER --format json``;
  - HTA: ``TraceAnalysis(trace_dir=...)``, then ``get_temporal_breakdown``,
    ``get_idle_time_breakdown`` (all loaded ranks) and ``critical_path_analysis`` (lowest
    rank, first ``ProfilerStep``) in the same child; each call
    is timed and its outcome (ok or the one-line error) recorded.
Wall time is taken around each child, peak RSS is the child's ``ru_maxrss`` from ``os.wait4``.
HTA is installed into a throwaway venv (``--venv``, default /tmp/hta-venv); it is never a
dependency of the project.

    python benchmarks/hta.py                  # writes benchmarks/results/hta.md
    python benchmarks/hta.py --repeat 1 --only pytorch-hta-2ranks
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("TB_GPUADVISOR_CORPUS", REPO.parent / "shared" / "corpus"))
# Our side runs in the interpreter that runs this script (the project venv), unless told otherwise.
OURS_PY = Path(os.environ.get("TB_GPUADVISOR_PYTHON", sys.executable))
HTA_VERSION = "0.5.0"

# What a user of HTA runs; prints one JSON line: per-call seconds and outcome.
HTA_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
out = {}
def one_line(e):
    import os, traceback
    text = (str(e).strip().splitlines() or [""])[0][:120]
    at = traceback.extract_tb(e.__traceback__)[-1]
    return f"{type(e).__name__}: {text} ({os.path.basename(at.filename)}:{at.lineno})"
def call(name, fn):
    t = time.perf_counter()
    try:
        result = fn()
        if result is None and name == "critical_path":
            out[name] = "returned None"
        elif isinstance(result, tuple) and len(result) == 2 and result[1] is False:
            out[name] = "returned success=False"
        else:
            out[name] = "ok"
    except Exception as e:  # record, go on
        out[name] = one_line(e)
    out[name + "_s"] = time.perf_counter() - t
    return out[name] == "ok"
from hta.trace_analysis import TraceAnalysis
box = {}
def load():
    box["a"] = TraceAnalysis(trace_dir=sys.argv[1])
ok = call("load", load)
out["load_total_s"] = time.perf_counter() - t0  # import + load
if ok:
    a = box["a"]
    call("temporal", lambda: a.get_temporal_breakdown(visualize=False))
    ranks = sorted(a.t.traces.keys())  # the default, ranks=[0], fails on a lone rank 3
    call("idle", lambda: a.get_idle_time_breakdown(ranks=ranks, visualize=False))
    rank = ranks[0]
    call("critical_path", lambda: a.critical_path_analysis(  # first ProfilerStep
        rank=rank, annotation="ProfilerStep", instance_id=0))
print(json.dumps(out))
"""


def ensure_hta(venv: Path) -> Path:
    """The venv's python, with HolisticTraceAnalysis installed into it if missing."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    probe = subprocess.run([str(python), "-c", "import hta"], capture_output=True)
    if probe.returncode != 0:
        subprocess.run([str(python), "-m", "pip", "install", "-q",
                        f"HolisticTraceAnalysis=={HTA_VERSION}"], check=True)
    return python


def sessions(only: list[str]) -> list[Path]:
    """Folders under corpus/pytorch-* that directly hold PyTorch trace files."""
    found = sorted({p.parent for p in CORPUS.glob("pytorch-*/**/*.pt.trace.json*")})
    return [d for d in found if not only or any(o in str(d) for o in only)]


def json_mb(folder: Path) -> float:
    """Size of the (inflated) JSON of every trace in ``folder``, in MB."""
    total = 0
    for f in folder.glob("*.pt.trace.json*"):
        if f.suffix != ".gz":
            total += f.stat().st_size
            continue
        with gzip.open(f) as fh:  # in chunks: children forked from a big parent report its RSS
            while chunk := fh.read(1 << 20):
                total += len(chunk)
    return total / 1e6


def run_measured(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> dict:
    """Run one cold child, reaped with ``os.wait4``: wall s, its own peak RSS MB, rc, output."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err, text=True)
        deadline = t + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
            time.sleep(0.005)
        seconds = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        return {"seconds": seconds, "peak_mb": usage.ru_maxrss / 1024, "rc": proc.returncode,
                "stdout": out.read(), "stderr": err.read()[-2000:]}


def measure(folder: Path, hta_python: Path, repeat: int, timeout: float) -> dict:
    """``repeat`` alternating cold runs of ours and HTA on a fresh copy of ``folder``."""
    ours, hta = [], []
    with tempfile.TemporaryDirectory(prefix="hta-bench-") as tmp:
        copy = Path(tmp) / folder.name
        shutil.copytree(folder, copy)
        env = dict(os.environ, PYTHONPATH=str(REPO))
        for _ in range(repeat):
            ours.append(run_measured([str(OURS_PY), "-m", "tb_gpuadvisor.cli", "analyze",
                                      str(copy), "--format", "json"], REPO, env, timeout))
            hta.append(run_measured([str(hta_python), "-c", HTA_CHILD, str(copy)], Path(tmp),
                                    dict(os.environ), timeout))
    row: dict = {"trace": str(folder.relative_to(CORPUS)), "json_mb": json_mb(folder)}
    row["ours_s"] = statistics.median(r["seconds"] for r in ours)
    row["ours_peak_mb"] = statistics.median(r["peak_mb"] for r in ours)
    row["ours_ok"] = all(r["rc"] == 0 for r in ours)
    row["hta_s"] = statistics.median(r["seconds"] for r in hta)
    row["hta_peak_mb"] = statistics.median(r["peak_mb"] for r in hta)
    calls = [_hta_calls(r) for r in hta]
    row["hta"] = calls[-1]
    loads = [c["load_total_s"] for c in calls if "load_total_s" in c]
    row["hta_load_s"] = statistics.median(loads) if loads else None
    return row


def _hta_calls(result: dict) -> dict:
    """The child's JSON line, or its last error line if it died."""
    for line in reversed(result["stdout"].splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (result["stderr"].strip().splitlines() or [f"exit {result['rc']}"])[-1]
    return {"load": f"child died: {tail[:160]}"}


def table(rows: list[dict]) -> str:
    """The markdown table of ``rows``."""
    head = ("| trace | JSON MB | ours s | ours peak MB | HTA load s | HTA all s | HTA peak MB "
            "| HTA load | HTA temporal breakdown | HTA idle breakdown | HTA critical path "
            "| ours s / HTA load s |\n|---|---:|---:|---:|---:|---:|---:|---|---|---|---|---:|\n")
    lines = []
    for r in rows:
        c = r["hta"]
        load_s = f"{r['hta_load_s']:.2f}" if r["hta_load_s"] else "-"
        ratio = f"{r['ours_s'] / r['hta_load_s']:.2f}" if r["hta_load_s"] else "-"
        cell = lambda k: c.get(k, "not run").replace("|", "\\|")  # noqa: E731
        lines.append(f"| {r['trace']} | {r['json_mb']:.1f} | {r['ours_s']:.2f}"
                     f"{'' if r['ours_ok'] else ' (failed)'} | {r['ours_peak_mb']:.0f} | {load_s}"
                     f" | {r['hta_s']:.2f} | {r['hta_peak_mb']:.0f} | {cell('load')}"
                     f" | {cell('temporal')} | {cell('idle')} | {cell('critical_path')}"
                     f" | {ratio} |")
    return head + "\n".join(lines) + "\n"


def main() -> None:
    """Measure every session, print the table and write results/hta.md."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, default=Path("/tmp/hta-venv"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--only", nargs="*", default=[], help="substrings of trace folders")
    args = ap.parse_args()
    hta_python = ensure_hta(args.venv)
    versions = subprocess.run([str(hta_python), "-c", "import importlib.metadata as m;"
                               "print(*(f'{p} {m.version(p)}' for p in ('HolisticTraceAnalysis',"
                               "'pandas','numpy')), sep=', ')"],
                              capture_output=True, text=True, check=True).stdout.strip()
    rows = []
    for folder in sessions(args.only):
        rows.append(measure(folder, hta_python, args.repeat, args.timeout))
        print(rows[-1], file=sys.stderr)
    text = (f"Run {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores; HTA side: "
            f"{versions}; median of {args.repeat} cold runs each.\n\n" + table(rows))
    print(text)
    out = REPO / "benchmarks" / "results"
    (out / "hta.md").write_text(text)
    (out / "hta.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
