"""Many-host sessions: ``tb-gpuadvisor analyze`` (local and Dask engines) against XProf.

One host capture (``make_capture.py``: about 24 MB, 2 GPUs, ~150 steps) is
hard-linked N times (``host000.xplane.pb`` ...) into one session folder per N
(default 1, 4, 16 and 64 hosts): no gigabytes of copies, and both tools read
the links like files.  For every N, cold child processes run:

* ``ours``: ``tb-gpuadvisor analyze SESSION --format json > /dev/null`` with
  whatever engine the CLI uses by default;
* ``dask`` (``--dask``): the same with ``--engine dask --address ADDR``
  against a ``distributed.LocalCluster`` of 2 single-thread workers started
  here, restarted before each run so its workers start cold; skipped with a
  note when ``distributed`` is missing or the CLI has no ``--engine`` flag;
* ``xprof``: ``xspace_to_tool_data([every host file], "overview_page", ...)``
  on a fresh folder of links per run (XProf writes caches beside captures),
  up to ``--xprof-max-hosts``.

Memory is the whole process tree's, because an engine may run hosts in worker
processes: every SAMPLE_S the child, all its descendants and (for Dask) the
cluster's worker processes are read from /proc, keeping the largest
single process and the largest sum.  The largest single process also takes
the child's ``ru_maxrss`` from ``wait4``, which on Linux covers every
descendant the child reaped, so a short peak between two samples still counts.
The Dask scheduler and the workers' nannies run inside this benchmark
process and are not counted.

Results: ``results/hosts.json``, ``results/hosts.md`` and the table inside
``README.md`` between its ``hosts`` markers.
"""

from __future__ import annotations

import argparse
import compileall
import dataclasses
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import bench  # noqa: E402
from make_capture import SHAPES, CaptureInfo, make_capture  # noqa: E402

RESULTS = bench.RESULTS
SESSION = "2024_01_01_00_00_00"
DEFAULT_HOSTS = (1, 4, 16, 64)
HOST_MB = 24.0
HOST_GPUS = 2
KERNELS_PER_STEP = 400  # 24 MB of 2-GPU steps holds ~150 of them, as in issue 18
SAMPLE_S = 0.02  # how often the process tree is read; a walk of /proc costs ~2 ms
DASK_WORKERS = 2

# Acceptance targets (issue 18): 64 hosts x 24 MB on 2 cores, local and Dask engines alike.
TARGET_HOSTS = 64
TARGET_S = 20.0
TARGET_PROCESS_GB = 0.3


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


class ProcessTree:
    """Peak RSS of a child, its descendants and some extra processes (the Dask workers).

    Used as ``measure``'s RSS probe: called every poll with the child's pid,
    it reads the tree at most every SAMPLE_S and returns the largest single
    process seen so far (what the memory limit and the per-process target are
    about).  A process's parent never changes while it lives, so only pids
    new since the last sample have their ``stat`` read.
    """

    def __init__(self, extra_roots: tuple[int, ...] = ()) -> None:
        self.extra_roots = extra_roots
        self.max_process_mb = 0.0
        self.max_total_mb = 0.0
        self.max_processes = 0
        self._parent: dict[int, int | None] = {}
        self._last = float("-inf")

    def members(self, root: int) -> set[int]:
        """ROOT, the extra roots and every live descendant of them."""
        alive = [int(name) for name in os.listdir("/proc") if name.isdigit()]
        known = {pid: self._parent.get(pid) for pid in alive}
        self._parent = {pid: parent if parent is not None else _ppid(pid) for pid, parent in known.items()}
        children: dict[int, list[int]] = {}
        for pid, parent in self._parent.items():
            if parent is not None:
                children.setdefault(parent, []).append(pid)
        found: set[int] = set()
        todo = [root, *self.extra_roots]
        while todo:
            pid = todo.pop()
            if pid not in found:
                found.add(pid)
                todo += children.get(pid, [])
        return found

    def __call__(self, root: int) -> float:
        now = time.perf_counter()
        if now - self._last >= SAMPLE_S:
            self._last = now
            sizes = [rss for rss in map(bench._rss_mb, self.members(root)) if rss]
            self.max_process_mb = max(self.max_process_mb, max(sizes, default=0.0))
            self.max_total_mb = max(self.max_total_mb, sum(sizes))
            self.max_processes = max(self.max_processes, len(sizes))
        return self.max_process_mb


def measure_tree(cmd: list[str], *, timeout_s: float, mem_limit_mb: float | None = None,
                 result_file: Path | None = None, extra_roots: tuple[int, ...] = ()) -> dict:
    """One cold run of CMD: ``bench.measure``'s record plus the process tree's memory."""
    tree = ProcessTree(extra_roots)
    run = bench.measure(cmd, timeout_s=timeout_s, mem_limit_mb=mem_limit_mb, result_file=result_file,
                        rss_mb=tree)
    return {**dataclasses.asdict(run),
            "max_process_mb": run.peak_rss_mb,  # sampled, or ru_maxrss of the child and what it reaped
            "sampled_max_process_mb": tree.max_process_mb,
            "total_mb": max(tree.max_total_mb, run.peak_rss_mb), "processes": tree.max_processes}


def best_of(runs: list[dict]) -> dict:
    """The fastest good run with the largest memory of all runs (one bad run is returned as is)."""
    best = min(runs, key=lambda r: (r["status"] != "ok", r["wall_s"]))
    return {**best, "runs": len(runs), "walls_s": [r["wall_s"] for r in runs],
            **{k: max(r[k] for r in runs) for k in ("max_process_mb", "total_mb", "processes")}}


# --- sessions ---------------------------------------------------------------------------------

def build_host(workdir: Path, size_mb: float = HOST_MB, shape: str | None = None) -> CaptureInfo:
    """The one host capture every session links to (rebuilt each time: it takes a second); of
    one of make_capture's SHAPES when SHAPE is given, else 2 GPUs of the benchmark's kind."""
    shutil.rmtree(workdir / "host", ignore_errors=True)
    kwargs = dict(SHAPES[shape]) if shape else {"gpus": HOST_GPUS, "kernels_per_step": KERNELS_PER_STEP}
    return make_capture(workdir / "host", size_mb, kwargs.pop("gpus"), session=SESSION, host="host", **kwargs)


def link_session(host: Path, hosts: int, root: Path) -> Path:
    """A new logdir ROOT whose one session holds HOSTS hard links of HOST; returns the session folder."""
    shutil.rmtree(root, ignore_errors=True)
    session = root / "run" / "plugins" / "profile" / SESSION
    session.mkdir(parents=True)
    for i in range(hosts):
        os.link(host, session / f"host{i:03d}.xplane.pb")
    return session


class DaskCluster:
    """A LocalCluster of DASK_WORKERS single-thread worker processes, made cold before each run."""

    def __init__(self) -> None:
        # Importing distributed sets MALLOC_TRIM_THRESHOLD_, OMP_NUM_THREADS... in this process's
        # environment, which every later child would inherit: the local and XProf runs ran 2.4x
        # slower beside a cluster. They get the environment from before; Dask's workers keep theirs.
        before = dict(os.environ)
        from distributed import Client, LocalCluster

        self.cluster = LocalCluster(n_workers=DASK_WORKERS, threads_per_worker=1, processes=True,
                                    dashboard_address=None, silence_logs=logging.ERROR)
        self.client = Client(self.cluster)  # nannies and scheduler run in this process
        self.address: str = self.cluster.scheduler_address
        os.environ.clear()
        os.environ.update(before)

    def cold_pids(self) -> tuple[int, ...]:
        """Restart the worker processes (nothing imported or cached); their new pids."""
        self.client.restart()
        return tuple(sorted(self.client.run(os.getpid).values()))

    def close(self) -> None:
        self.client.close()
        self.cluster.close()


def dask_unavailable() -> str | None:
    """Why the Dask column cannot be measured here, or None when it can."""
    if importlib.util.find_spec("distributed") is None:
        return "distributed is not installed"
    cmd = bench._ours_cmd(Path("."))
    usage = subprocess.run([*cmd[:cmd.index("analyze") + 1], "--help"], capture_output=True,
                           text=True, check=False).stdout
    if "--engine" not in usage:
        return "the CLI has no --engine flag yet"
    return None


# --- one row ----------------------------------------------------------------------------------

def bench_hosts(host: CaptureInfo, hosts: int, workdir: Path, *, timeout_s: float,
                xprof_mem_limit_mb: float | None = None, with_xprof: bool = True,
                dask: DaskCluster | None = None, dask_note: str = "", repeat: int = 1) -> dict:
    """Measure ours (local and Dask) and XProf on a session of HOSTS links of HOST."""
    base = workdir / f"h{hosts}"
    session = link_session(host.path, hosts, base)
    result_file = workdir / "child.json"

    def runs(prepare, **kw) -> dict:
        """REPEAT cold runs; PREPARE gives each its command and the extra processes to watch."""
        done: list[dict] = []
        for _ in range(repeat):
            cmd, extra = prepare()
            done.append(measure_tree(cmd, timeout_s=timeout_s, extra_roots=extra, **kw))
            if done[-1]["status"] != "ok":
                break  # a timeout or a kill would only repeat itself
        return best_of(done)

    ours = runs(lambda: (bench._ours_cmd(session), ()))
    dask_run = None
    if dask is not None:
        dask_run = runs(lambda: ([*bench._ours_cmd(session), "--engine", "dask", "--address", dask.address],
                                 dask.cold_pids()))
    xprof = None
    if with_xprof:
        xprof = runs(lambda: (bench._child_cmd("xprof", str(link_session(host.path, hosts, base / "xprof")),
                                               str(result_file)), ()),
                     mem_limit_mb=xprof_mem_limit_mb, result_file=result_file)
    shutil.rmtree(base, ignore_errors=True)
    return {"hosts": hosts, "data_mb": round(hosts * host.bytes / bench.MB, 1),
            "events": hosts * host.events, "ours": ours, "dask": dask_run, "dask_note": dask_note,
            "xprof": xprof, "date": time.strftime("%Y-%m-%d %H:%M")}


# --- reporting --------------------------------------------------------------------------------

HEADER = ("hosts", "data MB", "events", "ours s", "ours max-process RSS GB", "ours total RSS GB",
          "dask s", "dask max-process RSS GB", "XProf s", "XProf RSS GB", "notes")


def _cell(run: dict | None, value: str, killed_mark: str) -> str:
    """VALUE of a good run, marked as a lower bound for a killed one; a failed run has none."""
    if run is None or run["status"] == "failed":
        return "-"
    return f"{'' if run['status'] == 'ok' else killed_mark}{value}"


def _seconds(run: dict | None) -> str:
    return _cell(run, f"{run['wall_s']:.2f}" if run else "", ">")


def _gb(run: dict | None, key: str = "max_process_mb") -> str:
    return _cell(run, f"{run[key] / bench.KB:.2f}" if run else "", ">=")


def table_row(r: dict) -> tuple[str, ...]:
    notes = [f"{name} {r[key]['detail']}" for key, name in (("ours", "ours"), ("dask", "dask"), ("xprof", "XProf"))
             if r[key] is not None and r[key]["status"] != "ok"]
    notes += [f"{name} not run: {r[key]}" for key, name in (("dask_note", "dask"), ("xprof_note", "XProf"))
              if r.get(key)]
    ours, dask, xprof = r["ours"], r["dask"], r["xprof"]
    return (str(r["hosts"]), f"{r['data_mb']:,.0f}", f"{r['events']:,}", _seconds(ours), _gb(ours),
            _gb(ours, "total_mb"), _seconds(dask), _gb(dask), _seconds(xprof), _gb(xprof), "; ".join(notes))


def targets(rows: list[dict]) -> list[dict]:
    """Issue 18's targets, for the local and the Dask engine, with what was measured."""
    out = []
    for r in rows:
        if r["hosts"] != TARGET_HOSTS:
            continue
        for key, engine in (("ours", "local"), ("dask", "Dask")):
            tag = f"{TARGET_HOSTS} hosts x {HOST_MB:g} MB, {engine} engine"
            run = r[key]
            if run is None:
                missing = f"not measured ({r.get('dask_note') or 'run without --dask'})"
                out += [{"target": f"{tag}: {what}", "value": missing, "met": False}
                        for what in (f"analyze in < {TARGET_S:.0f} s",
                                     f"every process < {TARGET_PROCESS_GB} GB")]
                continue
            ok = run["status"] == "ok"
            out.append({"target": f"{tag}: analyze in < {TARGET_S:.0f} s", "value": f"{run['wall_s']:.1f} s",
                        "met": ok and run["wall_s"] < TARGET_S})
            gb = run["max_process_mb"] / bench.KB
            out.append({"target": f"{tag}: every process < {TARGET_PROCESS_GB} GB", "value": f"{gb:.2f} GB",
                        "met": ok and gb < TARGET_PROCESS_GB})
    return out


def render_markdown(result: dict) -> str:
    host = result["host"]
    lines = [
        bench.machine_line(result),
        "",
        f"One host: {host['bytes'] / bench.MB:.1f} MB, {HOST_GPUS} GPUs, {host['steps']} steps, "
        f"{host['events']:,} events; a session of N hosts is N hard links of it.",
        "",
        *bench.markdown_table(HEADER, [table_row(r) for r in result["rows"]]),
    ]
    lines += ["", "Times are wall seconds of a cold process (best of the runs). Max-process RSS is the "
              "largest single process of the run (the CLI, any worker it starts, and for Dask the "
              "cluster's worker processes); total RSS is the largest sum over those processes at one "
              "moment. `>` and `>=` mark a run that was killed. The machine's cores may be shared with "
              "other jobs: on a busy machine times vary up to 2x between runs, memory by a few percent.",
              "", *bench.targets_markdown(result["targets"])]
    return "\n".join(lines) + "\n"


def write_results(result: dict, out_dir: Path, readmes: tuple[Path, ...] = ()) -> None:
    """results/hosts.json, hosts.md and the README's ``hosts`` section."""
    bench.write_results(result, out_dir, readmes, name="hosts", render=render_markdown, section="hosts")


# --- main -------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hosts", type=lambda s: bench._numbers(s, int), default=list(DEFAULT_HOSTS),
                   help="session sizes in hosts (default 1,4,16,64)")
    p.add_argument("--host-mb", type=float, default=HOST_MB, help="size of the one host capture")
    p.add_argument("--shape", choices=sorted(SHAPES), help="make_capture's shape of the host capture")
    p.add_argument("--workdir", type=Path, help="where the capture and sessions go (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the temp workdir")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for each run")
    p.add_argument("--no-xprof", action="store_true")
    p.add_argument("--xprof-max-hosts", type=int, default=64, help="skip XProf on larger sessions")
    p.add_argument("--xprof-mem-limit-gb", type=float,
                   help="kill XProf past this RSS (default: 75%% of RAM, so the machine survives)")
    p.add_argument("--dask", action="store_true", help="also run the Dask engine on a LocalCluster")
    p.add_argument("--repeat", type=int, default=1, help="runs of each tool per session (fastest kept)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)

    began = time.perf_counter()
    compileall.compile_dir(str(bench.REPO / "tb_gpuadvisor"), quiet=1)  # as bench.py: both sides from bytecode
    info = bench.machine()
    limit_mb = (args.xprof_mem_limit_gb or (info["ram_gb"] or 8) * 0.75) * bench.KB
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tbga-hosts-"))
    workdir.mkdir(parents=True, exist_ok=True)
    dask_note = dask_unavailable() if args.dask else ""
    cluster = DaskCluster() if args.dask and not dask_note else None
    rows = []
    try:
        host = build_host(workdir, args.host_mb, args.shape)
        print(f"# host: {host.bytes / bench.MB:.1f} MB, {host.steps} steps, {host.events:,} events"
              f"{'; dask: ' + dask_note if dask_note else ''}", flush=True)
        print("| " + " | ".join(HEADER) + " |", flush=True)
        for hosts in args.hosts:
            with_xprof = not args.no_xprof and hosts <= args.xprof_max_hosts
            row = bench_hosts(host, hosts, workdir, timeout_s=args.timeout, xprof_mem_limit_mb=limit_mb,
                              with_xprof=with_xprof, dask=cluster, dask_note=dask_note, repeat=args.repeat)
            if not with_xprof:
                row["xprof_note"] = "--no-xprof" if args.no_xprof else f"more than {args.xprof_max_hosts} hosts"
            rows.append(row)
            print("| " + " | ".join(table_row(row)) + " |", flush=True)
    finally:
        if cluster is not None:
            cluster.close()
        if args.workdir is None and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        elif args.workdir is None:
            print(f"capture kept in {workdir}")
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": info,
              "host": {"bytes": host.bytes, "steps": host.steps, "events": host.events,
                       "kernel_events": host.kernel_events, "build_s": round(host.seconds, 2)},
              "xprof_mem_limit_gb": round(limit_mb / bench.KB, 1), "rows": rows, "targets": targets(rows),
              "benchmark_s": round(time.perf_counter() - began, 1)}
    print()
    for t in result["targets"]:
        print(f"[{'met' if t['met'] else 'NOT met'}] {t['target']}: {t['value']}")
    print(f"benchmark took {result['benchmark_s']:.0f} s")
    write_results(result, args.out, (bench.README,) if args.out == RESULTS else ())
    return 0


if __name__ == "__main__":
    sys.exit(main())
