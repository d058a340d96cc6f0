"""Time per MB of ``tb-gpuadvisor analyze`` on captures of several shapes and two sizes (issues 32, 46).

Every shape of ``make_capture.SHAPES`` (the benchmark's own, a host plane larger than the GPU
planes together, events with many stats, long steps, many small planes, one GPU, many short steps on eight GPUs
with per-GPU launch threads) is built at each size
(default 120 and 978 MB) under ``--workdir`` (reused by later runs). Cold runs of this checkout
and, with ``--against``, of another checkout (same venv, its tree first on PYTHONPATH) are taken
in turn, after one discarded warm-up round, with ``TB_GPUADVISOR_TIMINGS=1``: wall, CPU (user +
system, every thread) and peak RSS of the whole process, and each stage's wall and CPU seconds.
Medians over ``--repeat`` runs. The ratio of a shape's wall seconds per MB at the largest size to
those at the smallest says whether its time grows with its bytes alone (1.0) or faster.

```
python benchmarks/shapes.py --workdir /tmp/shapes --against /tmp/base --repeat 3
python benchmarks/shapes.py --workdir /tmp/shapes --shapes host,long --sizes 120 --repeat 1
```

Results: ``results/shapes.json``, ``results/shapes.md`` and the README's ``shapes`` section.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench  # noqa: E402
import make_capture  # noqa: E402

STAGES = ("decode", "trust", "attribution", "replay", "checks", "report")
MB = 1e6


def build(workdir: Path, shape: str, size_mb: float) -> dict:
    """The capture of SHAPE at SIZE_MB, built once into WORKDIR (and its size and events)."""
    folder = workdir / f"{shape}-{size_mb:g}"
    info_file = folder / "info.txt"
    if info_file.exists():
        path, events = info_file.read_text().split()
        return {"path": path, "events": int(events), "bytes": Path(path).stat().st_size}
    shutil.rmtree(folder, ignore_errors=True)
    kwargs = dict(make_capture.SHAPES[shape])
    # Built in a process of its own: a measured child's ru_maxrss starts from this process's
    # high-water mark when it is forked, which building a capture here raised to 0.5 GB (the 120
    # MB rows of 2026-11-28 13:06 read 511 MiB for several shapes and both trees).
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        info = pool.submit(make_capture.make_capture, folder, size_mb, kwargs.pop("gpus"), host="bench-host",
                           **kwargs).result()
    info_file.write_text(f"{info.path} {info.events}\n")
    return {"path": str(info.path), "events": info.events, "bytes": info.bytes}


def run_tree(tree: Path, session_dir: Path, timeout_s: float) -> bench.Measurement:
    env = dict(os.environ, PYTHONPATH=str(tree), TB_GPUADVISOR_TIMINGS="1")
    return bench.measure([sys.executable, "-m", "tb_gpuadvisor.cli", "analyze", str(session_dir),
                          "--format", "json"], timeout_s=timeout_s, env=env, cwd=tree)


def summary(runs: list[bench.Measurement]) -> dict:
    ok = [m for m in runs if m.ok]
    if not ok:
        return {"ok": 0, "runs": len(runs), "detail": runs[-1].detail if runs else ""}
    med = lambda values: statistics.median(values)  # noqa: E731
    stages = {name: [round(med([m.stages.get(name, [0, 0])[i] for m in ok]), 3) for i in (0, 1)]
              for name in STAGES}
    return {"ok": len(ok), "runs": len(runs), "wall_s": med([m.wall_s for m in ok]),
            "cpu_s": med([m.cpu_s for m in ok]), "peak_rss_mb": med([m.peak_rss_mb for m in ok]),
            "walls": [round(m.wall_s, 2) for m in runs], "stages": stages}


def measure_all(shapes: list[str], sizes: list[float], workdir: Path, trees: dict[str, Path], *,
                repeat: int, warmup: int, timeout_s: float) -> list[dict]:
    rows = []
    for shape in shapes:
        for size in sizes:
            capture = build(workdir, shape, size)
            session = Path(capture["path"]).parent
            runs: dict[str, list[bench.Measurement]] = {name: [] for name in trees}
            for round_ in range(warmup + repeat):
                for name, tree in trees.items():
                    measured = run_tree(tree, session, timeout_s)
                    if round_ >= warmup:
                        runs[name].append(measured)
            for name in trees:
                row = {"shape": shape, "nominal_mb": size, "mb": capture["bytes"] / MB,
                       "events": capture["events"], "tree": name, **summary(runs[name])}
                rows.append(row)
                print(row_text(row), flush=True)
    return rows


def row_text(row: dict) -> str:
    if not row["ok"]:
        return f"{row['shape']:<7} {row['mb']:7.1f} MB {row['tree']:<8} failed: {row.get('detail', '')}"
    return (f"{row['shape']:<7} {row['mb']:7.1f} MB {row['tree']:<8} wall {row['wall_s']:6.2f} s "
            f"cpu {row['cpu_s']:6.2f} s  {row['peak_rss_mb']:6.0f} MiB  walls {row['walls']}")


def render(result: dict) -> str:
    rows = result["rows"]
    lines = [bench.machine_line(result) + f" Load average at the start: {result['load'][0]:.1f}.", "",
             f"Medians of {result['repeat']} cold runs per tree, taken in turn after {result['warmup']} "
             "warm-up round(s). ms/MB = wall milliseconds per MB of capture; CPU is user + system, "
             "every thread; RSS is the peak of the whole process.", ""]
    header = ("shape", "MB", "events", "tree", "wall s", "CPU s", "CPU/wall", "ms/MB", "CPU ms/MB",
              "peak RSS MiB", "RSS / file")
    table = []
    for r in rows:
        if not r["ok"]:
            table.append((r["shape"], f"{r['mb']:.0f}", f"{r['events']:,}", r["tree"], "failed", "", "", "", "", "", ""))
            continue
        table.append((r["shape"], f"{r['mb']:.0f}", f"{r['events']:,}", r["tree"], f"{r['wall_s']:.2f}",
                      f"{r['cpu_s']:.2f}", f"{r['cpu_s'] / r['wall_s']:.2f}", f"{1000 * r['wall_s'] / r['mb']:.2f}",
                      f"{1000 * r['cpu_s'] / r['mb']:.2f}", f"{r['peak_rss_mb']:.0f}",
                      f"{r['peak_rss_mb'] * 2**20 / (r['mb'] * MB):.2f}"))
    lines += bench.markdown_table(header, table)
    lines += ["", "Time per MB at the largest size over that at the smallest (1.0: linear in bytes):", ""]
    scale = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        for tree in dict.fromkeys(r["tree"] for r in rows):
            mine = sorted((r for r in rows if r["shape"] == shape and r["tree"] == tree and r["ok"]),
                          key=lambda r: r["mb"])
            if len(mine) >= 2:
                per_mb = [r["wall_s"] / r["mb"] for r in (mine[0], mine[-1])]
                cpu_mb = [r["cpu_s"] / r["mb"] for r in (mine[0], mine[-1])]
                scale.append((shape, tree, f"{per_mb[1] / per_mb[0]:.2f}", f"{cpu_mb[1] / cpu_mb[0]:.2f}"))
    lines += bench.markdown_table(("shape", "tree", "wall ms/MB ratio", "CPU ms/MB ratio"), scale)
    lines += ["", "Stages, wall s (CPU s), medians; `checks` holds attribution and replay:", ""]
    stage_rows = [(r["shape"], f"{r['mb']:.0f}", r["tree"],
                   *(f"{r['stages'][s][0]:.2f} ({r['stages'][s][1]:.2f})" for s in STAGES))
                  for r in rows if r["ok"]]
    lines += bench.markdown_table(("shape", "MB", "tree", *STAGES), stage_rows)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default=",".join(make_capture.SHAPES))
    p.add_argument("--sizes", type=bench._numbers, default=[120, 978])
    p.add_argument("--workdir", type=Path, required=True, help="where captures are built and kept")
    p.add_argument("--against", type=Path, help="another checkout (its C extensions built) to run in turn")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--out", type=Path, default=bench.RESULTS)
    p.add_argument("--no-readme", action="store_true")
    args = p.parse_args(argv)
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in shapes if s not in make_capture.SHAPES]
    if unknown:
        p.error(f"unknown shapes {unknown}; known: {sorted(make_capture.SHAPES)}")
    trees = {"ours": bench.REPO, **({"against": args.against.resolve()} if args.against else {})}
    args.workdir.mkdir(parents=True, exist_ok=True)
    began = time.time()
    rows = measure_all(shapes, args.sizes, args.workdir, trees, repeat=args.repeat, warmup=args.warmup,
                       timeout_s=args.timeout)
    result = {"machine": bench.machine(), "load": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M", time.localtime(began)),
              "repeat": args.repeat, "warmup": args.warmup,
              "trees": {name: str(tree) for name, tree in trees.items()}, "rows": rows}
    bench.write_results(result, args.out, () if args.no_readme else (bench.README,), name="shapes",
                        render=render, section="shapes")
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
