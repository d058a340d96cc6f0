"""Time and memory of ``tb-gpuadvisor analyze`` against XProf's overview page.

For every synthetic capture (``make_capture.py``; about 10, 50, 200 MB, and
1 GB with ``--full``; 1 and 8 GPUs) three cold child processes run, each on a
fresh copy of the file because XProf writes caches beside a capture:

* ``ours``: the console script, ``tb-gpuadvisor analyze SESSION --format json``
  with stdout to /dev/null -- what a user waits for;
* ``model``: the same work split into parse + model build (``load_session``)
  and the report (checks, JSON), pinned to one core, for issue 2's MB/s figure;
  it also returns the step count so a fast run that found nothing shows up;
* ``xprof``: ``xspace_to_tool_data([file], "overview_page", {"use_saved_result": False})``.

Wall time is measured around each child and peak RSS comes from ``wait4`` on
that child alone (not ``RUSAGE_CHILDREN``, which is a maximum over every child
so far).  A child that fails, runs past its timeout or grows past the memory
limit is killed and recorded as such; the benchmark goes on.

Results: a table on stdout, ``results/latest.json``, ``results/latest.md``,
and the table inside ``README.md`` between its ``results`` markers.
"""

from __future__ import annotations

import argparse
import compileall
import dataclasses
import hashlib
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
README = HERE / "README.md"
DEFAULT_SIZES = (10, 50, 200)
FULL_SIZE = 1000
KB = 1024
MB = 1e6

# Acceptance targets (issue 6, and issue 2 for the parse rate).
TARGET_TIME_RATIO = 0.25
TARGET_RSS_RATIO = 0.5
TARGET_FROM_MB = 50
TARGET_1GB_SECONDS = 60.0
TARGET_1GB_RSS_MB = 6 * 1024
TARGET_MB_PER_S = 30.0
TARGET_SLOPE = 1.15  # log-log slope of time over size; 1.0 is linear


@dataclasses.dataclass
class Measurement:
    """One child process: how it ended, how long it took, its peak memory."""

    status: str  # ok | failed | timeout | memory-limit
    wall_s: float
    peak_rss_mb: float
    detail: str = ""
    inner: dict = dataclasses.field(default_factory=dict)  # what the child reported
    cpu_s: float = 0.0    # user + system time of the child (and the children it reaped)
    # Stage -> [wall s, CPU s] from the child's TB_GPUADVISOR_TIMINGS lines (summed over hosts).
    stages: dict = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _rss_mb(pid: int) -> float:
    """Current resident memory of PID (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (KB * KB)
    except (OSError, IndexError, ValueError):
        return 0.0


# How often a running child is checked for timeout and memory; short, because the child's
# wall time is only known to this resolution (50 ms would add ~25 ms to a 0.6 s run).
POLL_S = 0.005


def measure(cmd: list[str], *, timeout_s: float, mem_limit_mb: float | None = None,
            result_file: Path | None = None, cpus: set[int] | None = None,
            rss_mb: Callable[[int], float] = _rss_mb, env: dict | None = None,
            cwd: Path | None = None) -> Measurement:
    """Run CMD in its own process; wall time and its own peak RSS via wait4.

    The child is killed past ``timeout_s`` or when its RSS passes
    ``mem_limit_mb`` (checked every POLL_S), so a tool that would exhaust the
    machine is recorded instead of taking the benchmark (and others) down.
    ``rss_mb(pid)`` is what is checked; ``hosts.py`` passes one that also
    watches the child's worker processes.
    """
    if result_file is not None and result_file.exists():
        result_file.unlink()
    preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    with tempfile.TemporaryFile() as err:
        began = time.perf_counter()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, preexec_fn=preexec, env=env, cwd=cwd)
        killed = ""
        seen_mb = 0.0
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            elapsed = time.perf_counter() - began
            seen_mb = max(seen_mb, rss_mb(proc.pid))
            if not killed and elapsed > timeout_s:
                killed = f"timeout: killed after {timeout_s:.0f} s"
            elif not killed and mem_limit_mb and seen_mb > mem_limit_mb:
                killed = f"memory-limit: killed at {seen_mb / KB:.1f} GB after {elapsed:.0f} s"
            if killed:
                os.kill(proc.pid, signal.SIGKILL)
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(POLL_S)
        wall = time.perf_counter() - began
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    peak = max(usage.ru_maxrss / KB, seen_mb)
    cpu = usage.ru_utime + usage.ru_stime
    inner = {}
    if result_file is not None and result_file.exists():
        inner = json.loads(result_file.read_text())
    stages = stage_times(stderr)
    if killed:
        return Measurement(killed.split(":")[0], wall, peak, killed, inner, cpu, stages)
    if proc.returncode != 0:
        how = (f"killed by signal {-proc.returncode}" if proc.returncode < 0
               else f"exit {proc.returncode}")
        tail = stderr.strip().splitlines()[-1:] or [""]
        return Measurement("failed", wall, peak, f"{how}: {tail[0][:200]}", inner, cpu, stages)
    return Measurement("ok", wall, peak, "", inner, cpu, stages)


_TIMING = re.compile(r"tb-gpuadvisor timing: (\S+)\s+([\d.]+) s wall\s+([\d.]+) s cpu")


def stage_times(stderr: str) -> dict[str, list[float]]:
    """Stage -> [wall s, CPU s] of the TB_GPUADVISOR_TIMINGS lines in STDERR, summed per stage."""
    stages: dict[str, list[float]] = {}
    for name, wall, cpu in _TIMING.findall(stderr):
        total = stages.setdefault(name, [0.0, 0.0])
        total[0] += float(wall)
        total[1] += float(cpu)
    return stages


# --- the child processes --------------------------------------------------------------------

def _child_model(session_dir: str, out: str) -> int:
    began = time.perf_counter()
    from tb_gpuadvisor.input.discovery import find_sessions
    from tb_gpuadvisor.pipeline import load_session
    from tb_gpuadvisor.pipeline import report_model
    from tb_gpuadvisor.input.xplane.decode import has_fast_decoder

    imported = time.perf_counter()
    (ref,) = find_sessions(session_dir)
    model = load_session(ref)
    loaded = time.perf_counter()
    session = report_model(model)
    text = json.dumps({"sessions": [session]})
    done = time.perf_counter()
    Path(out).write_text(json.dumps({
        "import_s": imported - began, "load_s": loaded - imported, "report_s": done - loaded,
        "fast_decoder": has_fast_decoder(), "steps": session["steps"]["count"],
        "device_events": sum(d.get("events", 0) for d in session["devices"]),
        "findings": len(session["findings"]), "errors": [e.get("message", "") for e in session["errors"]],
        "json_bytes": len(text)}))
    return 0


def _child_xprof(xplane: str, out: str) -> int:
    """XProf's overview page of one file, or of every host file of a session folder."""
    began = time.perf_counter()
    from xprof.convert import raw_to_tool_data

    path = Path(xplane)
    files = sorted(str(p) for p in path.glob("*.xplane.pb")) if path.is_dir() else [xplane]
    imported = time.perf_counter()
    data, _ = raw_to_tool_data.xspace_to_tool_data(files, "overview_page", {"use_saved_result": False})
    done = time.perf_counter()
    Path(out).write_text(json.dumps({"import_s": imported - began, "convert_s": done - imported,
                                     "bytes": len(data) if data else 0}))
    return 0 if data else 3


CHILDREN = {"model": _child_model, "xprof": _child_xprof}


# --- captures ---------------------------------------------------------------------------------

def _generator_hash() -> str:
    digest = hashlib.sha1()
    for path in (HERE / "make_capture.py", REPO / "tests" / "synth.py"):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def build_capture(workdir: Path, size_mb: float, gpus: int) -> dict:
    """The capture for (size, gpus) in WORKDIR, reused when built with the same parameters.

    It is built in a child process: Linux counts a parent's peak memory in the ``ru_maxrss`` of
    every child it starts later, so a capture built in this process set a floor of about 220 MB
    under every run measured after it (a 10 MB capture's analysis, which peaks at 60 MB, was
    reported at 218 MB)."""
    name = f"{size_mb:g}mb-{gpus}gpu"
    meta_path = workdir / f"{name}.json"
    params = {"size_mb": size_mb, "gpus": gpus, "generator": _generator_hash()}
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        path = Path(meta["path"])
        if meta["params"] == params and path.exists() and path.stat().st_size == meta["bytes"]:
            meta["reused"] = True
            return meta
    shutil.rmtree(workdir / name, ignore_errors=True)
    code = ("import dataclasses, json, sys; sys.path.insert(0, sys.argv[1]); from make_capture import make_capture; "
            "info = make_capture(sys.argv[2], float(sys.argv[3]), gpus=int(sys.argv[4])); "
            "print(json.dumps(dataclasses.asdict(info), default=str))")
    built = subprocess.run([sys.executable, "-c", code, str(HERE), str(workdir / name), str(size_mb), str(gpus)],
                           capture_output=True, text=True, check=True)
    info = json.loads(built.stdout.strip().splitlines()[-1])
    meta = {"params": params, "path": info["path"], "bytes": info["bytes"], "steps": info["steps"],
            "events": info["events"], "kernel_events": info["kernel_events"],
            "build_s": round(info["seconds"], 2)}
    meta_path.write_text(json.dumps(meta))
    meta["reused"] = False
    return meta


def fresh_copy(xplane: Path, scratch: Path) -> Path:
    """A new session folder holding a copy of XPLANE; returns the copy's path."""
    session = xplane.parent
    target = scratch / "run" / "plugins" / "profile" / session.name / xplane.name
    shutil.rmtree(scratch, ignore_errors=True)
    target.parent.mkdir(parents=True)
    shutil.copyfile(xplane, target)
    return target


# --- one row ----------------------------------------------------------------------------------

def _child_cmd(kind: str, *args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--child", kind, *args]


def _ours_cmd(session_dir: Path) -> list[str]:
    script = Path(sys.executable).parent / "tb-gpuadvisor"
    head = [str(script)] if script.exists() else [sys.executable, "-m", "tb_gpuadvisor.cli"]
    return head + ["analyze", str(session_dir), "--format", "json"]


def bench_capture(capture: dict, workdir: Path, *, timeout_s: float, xprof_timeout_s: float,
                  xprof_mem_limit_mb: float | None, with_xprof: bool = True,
                  repeat: int = 1, xprof_repeat: int = 1) -> dict:
    """Measure ours (CLI), ours split (model/report) and XProf on one capture."""
    xplane = Path(capture["path"])
    scratch = workdir / "scratch"
    result_file = workdir / "child.json"

    def run(cmd_of, times: int = repeat, **kw) -> Measurement:
        runs = []
        for _ in range(times):
            runs.append(measure(cmd_of(fresh_copy(xplane, scratch)), result_file=result_file, **kw))
            if not runs[-1].ok:
                break  # a timeout or a kill would only repeat itself
        best = min(runs, key=lambda m: (not m.ok, m.wall_s))  # fastest good run, its own numbers
        return dataclasses.replace(best, peak_rss_mb=max(m.peak_rss_mb for m in runs))

    ours = run(lambda copy: _ours_cmd(copy.parent), timeout_s=timeout_s)
    split = run(lambda copy: _child_cmd("model", str(copy.parent), str(result_file)),
                timeout_s=timeout_s, cpus={min(os.sched_getaffinity(0))})
    xprof = None
    if with_xprof:
        xprof = run(lambda copy: _child_cmd("xprof", str(copy), str(result_file)), times=xprof_repeat,
                    timeout_s=xprof_timeout_s, mem_limit_mb=xprof_mem_limit_mb)
    shutil.rmtree(scratch, ignore_errors=True)
    return make_row(capture, ours, split, xprof)


def make_row(capture: dict, ours: Measurement, split: Measurement, xprof: Measurement | None) -> dict:
    size_mb = capture["bytes"] / MB
    row = {
        "nominal_mb": capture["params"]["size_mb"], "size_mb": round(size_mb, 1),
        "gpus": capture["params"]["gpus"], "events": capture["events"],
        "kernel_events": capture["kernel_events"], "steps_built": capture["steps"],
        "ours": dataclasses.asdict(ours), "ours_split": dataclasses.asdict(split),
        "xprof": dataclasses.asdict(xprof) if xprof else None,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    load_s = split.inner.get("load_s")
    row["parse_model_s"] = load_s
    row["parse_model_mb_per_s"] = round(size_mb / load_s, 1) if load_s else None
    row["report_s"] = split.inner.get("report_s")
    row["steps_found"] = split.inner.get("steps")
    if xprof is not None:
        # A killed XProf ran at least this long / this big: the ratios are upper bounds.
        row["time_ratio"] = ours.wall_s / xprof.wall_s if ours.ok else None
        row["rss_ratio"] = ours.peak_rss_mb / xprof.peak_rss_mb if ours.ok else None
        row["ratios_are_bounds"] = not xprof.ok
    return row


# --- reporting --------------------------------------------------------------------------------

def machine() -> dict:
    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    cpu = "unknown"
    mem_mb = None
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                   if line.startswith("model name"))
        mem_kb = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
        mem_mb = mem_kb / KB
    except (OSError, StopIteration):
        pass
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    try:
        from tb_gpuadvisor.input.xplane.decode import has_fast_decoder
        fast = has_fast_decoder()
    except ImportError:
        fast = None
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gb": round(mem_mb / KB, 1) if mem_mb else None,
            "os": platform.platform(), "python": platform.python_version(),
            "xprof": version("xprof"), "protobuf": version("protobuf"), "numpy": version("numpy"),
            "tb_gpuadvisor": version("tb-gpuadvisor") or version("tb_gpuadvisor"), "commit": commit,
            "c_decoder": fast}


def _slope(rows: list[dict]) -> float | None:
    """Least-squares slope of log(time) over log(size): 1.0 means time is linear in size."""
    pts = [(math.log(r["size_mb"]), math.log(r["ours"]["wall_s"])) for r in rows
           if r["ours"]["status"] == "ok" and r["nominal_mb"] >= TARGET_FROM_MB]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    var = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / var if var else None


def targets(rows: list[dict]) -> list[dict]:
    """Each acceptance target with its measured value and whether it is met."""
    out = []
    for r in rows:
        tag = f"{r['nominal_mb']:g} MB x {r['gpus']} GPU"
        if r["nominal_mb"] >= TARGET_FROM_MB and r.get("time_ratio") is not None:
            bound = "<= " if r["ratios_are_bounds"] else ""
            out.append({"target": f"{tag}: our time / XProf time <= {TARGET_TIME_RATIO}",
                        "value": f"{bound}{r['time_ratio']:.3f}", "met": r["time_ratio"] <= TARGET_TIME_RATIO})
            out.append({"target": f"{tag}: our peak RSS / XProf peak RSS <= {TARGET_RSS_RATIO}",
                        "value": f"{bound}{r['rss_ratio']:.3f}", "met": r["rss_ratio"] <= TARGET_RSS_RATIO})
        if r["nominal_mb"] >= FULL_SIZE:
            ok = r["ours"]["status"] == "ok"
            out.append({"target": f"{tag}: analyze in < {TARGET_1GB_SECONDS:.0f} s",
                        "value": f"{r['ours']['wall_s']:.1f} s",
                        "met": ok and r["ours"]["wall_s"] < TARGET_1GB_SECONDS})
            out.append({"target": f"{tag}: analyze in < {TARGET_1GB_RSS_MB / KB:.0f} GB",
                        "value": f"{r['ours']['peak_rss_mb'] / KB:.2f} GB",
                        "met": ok and r["ours"]["peak_rss_mb"] < TARGET_1GB_RSS_MB})
    for gpus in sorted({r["gpus"] for r in rows}):
        slope = _slope([r for r in rows if r["gpus"] == gpus])
        if slope is not None:
            out.append({"target": f"{gpus} GPU: time linear in size (log-log slope <= {TARGET_SLOPE}, "
                                  f">= {TARGET_FROM_MB} MB)", "value": f"{slope:.2f}",
                        "met": slope <= TARGET_SLOPE})
    rated = [r for r in rows if r.get("parse_model_mb_per_s")]
    if rated:
        big = max(rated, key=lambda r: (r["size_mb"], r["gpus"]))
        out.append({"target": f"parse + model build >= {TARGET_MB_PER_S:.0f} MB/s on one core "
                              f"(largest: {big['nominal_mb']:g} MB x {big['gpus']} GPU)",
                    "value": f"{big['parse_model_mb_per_s']:.1f} MB/s",
                    "met": big["parse_model_mb_per_s"] >= TARGET_MB_PER_S})
    return out


HEADER = ("size MB", "GPUs", "events", "ours s", "XProf s", "time ratio", "ours RSS MB",
          "XProf RSS MB", "RSS ratio", "parse+model MB/s", "notes")


def table_rows(rows: list[dict]) -> list[tuple[str, ...]]:
    out = []
    for r in rows:
        ours, x = r["ours"], r["xprof"]
        notes = []
        if ours["status"] != "ok":
            notes.append(f"ours {ours['detail']}")
        if x and x["status"] != "ok":
            notes.append(f"XProf {x['detail']}")
        found, built = r.get("steps_found"), r["steps_built"]
        if found is not None and found != built:
            notes.append(f"steps found {found} of {built}")
        bound = "<=" if r.get("ratios_are_bounds") else ""
        xs = f"{'>' if x and x['status'] != 'ok' else ''}{x['wall_s']:.1f}" if x else "-"
        xrss = f"{'>=' if x and x['status'] != 'ok' else ''}{x['peak_rss_mb']:.0f}" if x else "-"
        out.append((
            f"{r['size_mb']:.1f}", str(r["gpus"]), f"{r['events']:,}", f"{ours['wall_s']:.2f}", xs,
            f"{bound}{r['time_ratio']:.3f}" if r.get("time_ratio") is not None else "-",
            f"{ours['peak_rss_mb']:.0f}", xrss,
            f"{bound}{r['rss_ratio']:.3f}" if r.get("rss_ratio") is not None else "-",
            f"{r['parse_model_mb_per_s']:.1f}" if r.get("parse_model_mb_per_s") else "-",
            "; ".join(notes)))
    return out


def render_text(rows: list[dict]) -> str:
    cells = [HEADER, *table_rows(rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    return "\n".join("  ".join(c[i].rjust(widths[i]) for i in range(len(HEADER))).rstrip() for c in cells)


def machine_line(result: dict) -> str:
    """When and where RESULT was measured: CPU, cores, RAM, versions, commit."""
    m = result["machine"]
    return (f"Run {result['date']} on {m['cpu']}, {m['cores']} cores, {m['ram_gb']} GB RAM; "
            f"Python {m['python']}, xprof {m['xprof']}, protobuf {m['protobuf']}, numpy {m['numpy']}; "
            f"C wire decoder: {'yes' if m['c_decoder'] else 'no'}; commit {m['commit']}.")


def markdown_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """A Markdown table, numbers right-aligned and the last (notes) column left."""
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if i < len(header) - 1 else "---" for i in range(len(header))) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def targets_markdown(found: list[dict]) -> list[str]:
    """The targets as a Markdown table: target, measured value, met."""
    return ["| target | measured | met |", "|---|---|---|"] + [
        f"| {t['target']} | {t['value']} | {'yes' if t['met'] else '**no**'} |" for t in found]


def render_markdown(result: dict) -> str:
    lines = [machine_line(result), "", *markdown_table(HEADER, table_rows(result["rows"]))]
    runs: dict[str, list[str]] = {}
    for r in result["rows"]:
        runs.setdefault(r.get("commit") or "?", []).append(f"{r['nominal_mb']:g} MB x {r['gpus']}")
    if len(runs) > 1:
        lines += ["", "Rows come from several runs: " + "; ".join(
            f"commit {c}: {', '.join(sizes)}" for c, sizes in runs.items()) + "."]
    lines += ["", "Times are wall seconds of a cold process; RSS is the child's peak resident memory. "
              "`<=` marks ratios against an XProf run that was killed (so XProf needed at least that).",
              "", *targets_markdown(result["targets"])]
    return "\n".join(lines) + "\n"


def write_results(result: dict, out_dir: Path, readmes: tuple[Path, ...] = (), *, name: str = "latest",
                  render: Callable[[dict], str] = render_markdown, section: str = "results") -> None:
    """Results as NAME.json and NAME.md, and the Markdown into each README's SECTION."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    md = render(result)
    (out_dir / f"{name}.md").write_text(md)
    for readme in readmes:
        write_section(readme, md, section)


def write_section(readme: Path, md: str, name: str = "results") -> None:
    """MD in place of what README holds between its ``<!-- NAME:begin/end -->`` markers."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = readme.read_text() if readme.exists() else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        readme.write_text(f"{head}{begin}\n{md}{end}{rest.split(end, 1)[1]}")


def merge_rows(old: list[dict], new: list[dict]) -> list[dict]:
    """NEW rows, plus OLD rows for captures NEW did not measure; sorted by GPUs then size."""
    key = lambda r: (r["gpus"], r["nominal_mb"])  # noqa: E731
    fresh = {key(r) for r in new}
    return sorted([r for r in old if key(r) not in fresh] + new, key=key)


# --- main -------------------------------------------------------------------------------------

# --- side by side: this checkout against another commit (and XProf), run in turn ---------------

def side_by_side(xplane: Path, against: Path, workdir: Path, *, repeat: int, with_xprof: bool,
                 timeout_s: float, warmup: int = 1) -> dict:
    """Medians of REPEAT cold runs of this checkout, of the checkout at AGAINST (same venv, its
    tree first on PYTHONPATH) and of XProf's overview page, taken in turn so that load from
    other jobs falls on all of them; CPU time (user + system) is disturbed less than wall time.
    WARMUP rounds run first and are not counted: on a virtual machine whose host reclaims idle
    guest memory, the first run after a pause pays for faulting that memory back in (twice the
    system time here), a cost that would fall on whichever tool happens to run first."""
    tools = {"ours": (REPO, _ours_cmd), "against": (against, _ours_cmd)}
    runs: dict[str, list[Measurement]] = {name: [] for name in tools}
    if with_xprof:
        runs["xprof"] = []
    scratch, result_file = workdir / "scratch", workdir / "child.json"
    for round_ in range(warmup + repeat):
        if round_ == warmup:
            runs = {name: [] for name in runs}
        for name in runs:
            copy = fresh_copy(xplane, scratch)
            if name == "xprof":
                runs[name].append(measure(_child_cmd("xprof", str(copy), str(result_file)),
                                          timeout_s=timeout_s, result_file=result_file))
                continue
            tree, cmd = tools[name]
            env = dict(os.environ, PYTHONPATH=str(tree))
            # Run from the tree: ``python -m`` puts the working directory before PYTHONPATH, so
            # started from another checkout the child would import that checkout's code.
            runs[name].append(measure([sys.executable, "-m", "tb_gpuadvisor.cli", *cmd(copy.parent)[-4:]],
                                      timeout_s=timeout_s, env=env, cwd=tree))
    shutil.rmtree(scratch, ignore_errors=True)

    def median(values: list[float]) -> float:
        ordered = sorted(values)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2

    out = {}
    for name, measured in runs.items():
        ok = [m for m in measured if m.ok]
        out[name] = {"runs": len(measured), "ok": len(ok), "wall_s": median([m.wall_s for m in ok]) if ok else None,
                     "cpu_s": median([m.cpu_s for m in ok]) if ok else None,
                     "peak_rss_mb": median([m.peak_rss_mb for m in ok]) if ok else None,
                     "walls": [round(m.wall_s, 2) for m in measured]}
    return out


def side_by_side_text(xplane: Path, against: Path, result: dict) -> str:
    size = xplane.stat().st_size / MB
    lines = [f"{size:.1f} MB capture; ours = {REPO}, against = {against}; medians of cold runs in turn",
             f"{'tool':<8} {'wall s':>8} {'cpu s':>8} {'RSS MB':>8}   walls"]
    for name, r in result.items():
        cells = [f"{r[k]:8.2f}" if r[k] is not None else f"{'-':>8}" for k in ("wall_s", "cpu_s", "peak_rss_mb")]
        lines.append(f"{name:<8} {' '.join(cells)}   {r['walls']}")
    ours = result["ours"]
    for other in [n for n in result if n != "ours"]:
        for key in ("wall_s", "cpu_s", "peak_rss_mb"):
            if ours[key] and result[other][key]:
                lines.append(f"ratio ours/{other} {key}: {ours[key] / result[other][key]:.3f}")
    lines.append(f"RSS / file size: {ours['peak_rss_mb'] * KB * KB / MB / size:.2f}" if ours["peak_rss_mb"] else "")
    return "\n".join(lines)


def _numbers(text: str, kind=float) -> list:
    return [kind(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return CHILDREN[argv[1]](*argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=_numbers, help="capture sizes in MB (default 10,50,200; +1000 with --full)")
    p.add_argument("--gpus", type=lambda s: _numbers(s, int), default=[1, 8])
    p.add_argument("--full", action="store_true", help="add the 1 GB captures")
    p.add_argument("--workdir", type=Path, help="where captures are built (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the temp workdir")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for each of our runs")
    p.add_argument("--xprof-timeout", type=float, default=600.0)
    p.add_argument("--xprof-mem-limit-gb", type=float,
                   help="kill XProf past this RSS (default: 75%% of RAM, so the machine survives)")
    p.add_argument("--no-xprof", action="store_true")
    p.add_argument("--repeat", type=int, default=1, help="runs of ours per capture (fastest kept)")
    p.add_argument("--xprof-repeat", type=int, default=1, help="runs of XProf per capture (fastest kept)")
    p.add_argument("--append", action="store_true",
                   help="keep rows of results/latest.json for captures not measured now")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--against", type=Path,
                   help="a checkout of another commit: measure ours, it and XProf side by side on --capture")
    p.add_argument("--capture", type=Path, help="the .xplane.pb file for --against")
    p.add_argument("--warmup", type=int, default=1,
                   help="rounds of --against run first and not counted (default 1)")
    args = p.parse_args(argv)
    if args.against:
        if not args.capture:
            p.error("--against needs --capture FILE.xplane.pb")
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tbga-side-"))
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            result = side_by_side(args.capture, args.against, workdir, repeat=max(args.repeat, 3),
                                  with_xprof=not args.no_xprof, timeout_s=args.timeout, warmup=args.warmup)
        finally:
            if args.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)
        print(side_by_side_text(args.capture, args.against, result))
        return 0

    # pip byte-compiles an installed package (XProf here); an editable checkout is compiled on
    # import unless PYTHONDONTWRITEBYTECODE forbids it. Compile ours up front so both sides
    # start from bytecode and the cold-process times compare like with like.
    compileall.compile_dir(str(REPO / "tb_gpuadvisor"), quiet=1)
    sizes = args.sizes or list(DEFAULT_SIZES)
    if args.full and FULL_SIZE not in sizes:
        sizes.append(FULL_SIZE)
    info = machine()
    limit = args.xprof_mem_limit_gb
    limit_mb = limit * KB if limit else (info["ram_gb"] or 8) * KB * 0.75
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tbga-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for gpus in args.gpus:
            for size in sizes:
                cap = build_capture(workdir, size, gpus)
                how = "reused" if cap["reused"] else f"built in {cap['build_s']} s"
                print(f"# {cap['bytes'] / MB:.1f} MB x {gpus} GPU, {cap['events']:,} events ({how})",
                      flush=True)
                row = bench_capture(cap, workdir, timeout_s=args.timeout, xprof_timeout_s=args.xprof_timeout,
                                    xprof_mem_limit_mb=limit_mb, with_xprof=not args.no_xprof,
                                    repeat=args.repeat, xprof_repeat=args.xprof_repeat)
                row["commit"] = info["commit"]
                rows.append(row)
                print(render_text([row]).splitlines()[-1], flush=True)
    finally:
        if args.workdir is None and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        elif args.workdir is None:
            print(f"captures kept in {workdir}")
    if args.append and (args.out / "latest.json").exists():
        rows = merge_rows(json.loads((args.out / "latest.json").read_text())["rows"], rows)
    info["c_decoder"] = next((r["ours_split"]["inner"].get("fast_decoder") for r in rows
                              if r["ours_split"]["inner"]), info["c_decoder"])
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": info,
              "xprof_mem_limit_gb": round(limit_mb / KB, 1), "rows": rows, "targets": targets(rows)}
    print()
    print(render_text(rows))
    print()
    for t in result["targets"]:
        print(f"[{'met' if t['met'] else 'NOT met'}] {t['target']}: {t['value']}")
    write_results(result, args.out, (README, REPO / "README.md") if args.out == RESULTS else ())
    return 0


if __name__ == "__main__":
    sys.exit(main())
