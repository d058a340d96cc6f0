"""Smoke test of the benchmark script on a ~2 MB capture (XProf is measured when installed)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest


import bench  # noqa: E402

HAS_XPROF = importlib.util.find_spec("xprof") is not None


def test_one_capture_end_to_end(tmp_path: Path) -> None:
    capture = bench.build_capture(tmp_path, 2, 2)
    assert not capture["reused"] and 1.5e6 < capture["bytes"] < 3e6
    assert bench.build_capture(tmp_path, 2, 2)["reused"]

    row = bench.bench_capture(capture, tmp_path, timeout_s=120, xprof_timeout_s=120,
                              xprof_mem_limit_mb=None, with_xprof=HAS_XPROF)
    assert row["ours"]["status"] == "ok", row["ours"]["detail"]
    assert row["ours"]["peak_rss_mb"] > 20  # a Python process with numpy, not the wrapper's figure
    assert row["ours_split"]["status"] == "ok", row["ours_split"]["detail"]
    assert row["steps_found"] == capture["steps"]
    assert row["parse_model_mb_per_s"] > 0 and row["report_s"] > 0
    assert not (tmp_path / "scratch").exists()  # the fresh copies are gone
    if HAS_XPROF:
        assert row["xprof"]["status"] == "ok", row["xprof"]["detail"]
        assert row["xprof"]["inner"]["bytes"] > 0
        assert row["time_ratio"] == pytest.approx(row["ours"]["wall_s"] / row["xprof"]["wall_s"])

    result = {"date": "today", "machine": bench.machine(), "rows": [row], "targets": bench.targets([row])}
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results:begin -->\nSTALE TABLE\n<!-- results:end -->\nafter\n")
    bench.write_results(result, tmp_path / "out", (readme,))
    assert json.loads((tmp_path / "out" / "latest.json").read_text())["rows"][0]["gpus"] == 2
    text = readme.read_text()
    assert "STALE TABLE" not in text and text.startswith("intro") and text.endswith("after\n")
    assert f"| {row['size_mb']:.1f} | 2 |" in text


def test_timeout_failure_and_memory_limit_are_recorded() -> None:
    py = sys.executable
    slow = bench.measure([py, "-c", "import time; time.sleep(30)"], timeout_s=0.5)
    assert slow.status == "timeout" and slow.wall_s < 10
    failed = bench.measure([py, "-c", "raise SystemExit('no such capture')"], timeout_s=30)
    assert failed.status == "failed" and "exit 1" in failed.detail and "no such capture" in failed.detail
    hungry = bench.measure([py, "-c", "import time; b = bytearray(400 << 20); time.sleep(30)"],
                           timeout_s=30, mem_limit_mb=150)
    assert hungry.status == "memory-limit" and hungry.peak_rss_mb > 150 and hungry.wall_s < 20
    fine = bench.measure([py, "-c", "b = bytearray(200 << 20)"], timeout_s=30)
    assert fine.ok and 200 < fine.peak_rss_mb < 400


def _row(size: float, gpus: int, ours_s: float, xprof_s: float, killed: bool = False) -> dict:
    ours = {"status": "ok", "wall_s": ours_s, "peak_rss_mb": 100.0, "detail": "", "inner": {}}
    xprof = {"status": "timeout" if killed else "ok", "wall_s": xprof_s, "peak_rss_mb": 1000.0,
             "detail": "timeout: killed after 600 s" if killed else "", "inner": {}}
    return {"nominal_mb": size, "size_mb": size, "gpus": gpus, "events": 1000, "steps_built": 3,
            "steps_found": 3, "ours": ours, "xprof": xprof, "time_ratio": ours_s / xprof_s,
            "rss_ratio": 0.1, "ratios_are_bounds": killed, "parse_model_mb_per_s": 40.0}


def test_targets_and_table() -> None:
    rows = [_row(50, 8, 1.0, 10.0), _row(200, 8, 4.0, 10.0), _row(1000, 8, 70.0, 600.0, killed=True)]
    verdict = {t["target"]: t["met"] for t in bench.targets(rows)}
    assert verdict["50 MB x 8 GPU: our time / XProf time <= 0.25"]
    assert not verdict["200 MB x 8 GPU: our time / XProf time <= 0.25"]
    assert not verdict["1000 MB x 8 GPU: analyze in < 60 s"]
    assert verdict["1000 MB x 8 GPU: analyze in < 6 GB"]
    # 1 s -> 4 s -> 70 s for 1x -> 4x -> 20x the size is worse than linear.
    assert not next(met for name, met in verdict.items() if "linear" in name)
    assert next(met for name, met in verdict.items() if "MB/s" in name)

    table = bench.render_text(rows)
    assert "<=0.117" in table and ">600.0" in table and "XProf timeout" in table
    merged = bench.merge_rows(rows, [_row(50, 8, 2.0, 10.0), _row(10, 1, 0.5, 1.0)])
    assert [(r["gpus"], r["nominal_mb"], r["ours"]["wall_s"]) for r in merged] == [
        (1, 10, 0.5), (8, 50, 2.0), (8, 200, 4.0), (8, 1000, 70.0)]


def test_many_hosts_session_of_links(tmp_path: Path) -> None:
    import hosts

    host = hosts.build_host(tmp_path, size_mb=1)
    session = hosts.link_session(host.path, 2, tmp_path / "links")
    assert sorted(p.name for p in session.iterdir()) == ["host000.xplane.pb", "host001.xplane.pb"]
    assert host.path.stat().st_nlink == 3  # hard links, not copies

    row = hosts.bench_hosts(host, 2, tmp_path, timeout_s=120, with_xprof=False)
    ours = row["ours"]
    assert ours["status"] == "ok", ours["detail"]
    assert ours["max_process_mb"] > 20 and ours["total_mb"] >= ours["max_process_mb"]
    assert row["events"] == 2 * host.events and row["dask"] is None and row["xprof"] is None
    assert not (tmp_path / "h2").exists() and host.path.stat().st_nlink == 3  # its links are gone

    fast = {**ours, "wall_s": 10.0, "max_process_mb": 200.0}
    slow = {**ours, "wall_s": 30.0, "max_process_mb": 100.0}
    big = {**row, "hosts": 64, "ours": fast, "dask": slow, "dask_note": ""}
    verdict = {t["target"]: t["met"] for t in hosts.targets([row, big])}
    assert verdict == {"64 hosts x 24 MB, local engine: analyze in < 20 s": True,
                       "64 hosts x 24 MB, local engine: every process < 0.3 GB": True,
                       "64 hosts x 24 MB, Dask engine: analyze in < 20 s": False,
                       "64 hosts x 24 MB, Dask engine: every process < 0.3 GB": True}

    result = {"date": "today", "machine": bench.machine(), "rows": [row], "targets": [],
              "host": {"bytes": host.bytes, "steps": host.steps, "events": host.events}}
    readme = tmp_path / "README.md"
    readme.write_text("<!-- results:begin -->\nKEEP\n<!-- results:end -->\n<!-- hosts:begin -->\nOLD\n"
                      "<!-- hosts:end -->\n")
    hosts.write_results(result, tmp_path / "out", (readme,))
    assert json.loads((tmp_path / "out" / "hosts.json").read_text())["rows"][0]["hosts"] == 2
    text = readme.read_text()
    assert "KEEP" in text and "OLD" not in text and f"| 2 | 2 | {2 * host.events:,} |" in text


def test_process_tree_memory_counts_descendants_and_extra_processes() -> None:
    import hosts

    py = sys.executable
    hold = "import time; b = bytearray({} << 20); time.sleep({})"
    other = subprocess.Popen([py, "-c", hold.format(150, 30)])
    try:
        time.sleep(1.0)  # let it allocate
        parent = (f"import subprocess, sys; subprocess.run([sys.executable, '-c', {hold.format(200, 1)!r}])")
        run = hosts.measure_tree([py, "-c", parent], timeout_s=60, extra_roots=(other.pid,))
    finally:
        other.kill()
        other.wait()
    assert run["status"] == "ok", run["detail"]
    assert run["processes"] >= 3  # the child, its own child, the extra process
    assert 200 < run["sampled_max_process_mb"] < 300  # the grandchild, seen by sampling
    assert run["total_mb"] > run["sampled_max_process_mb"] + 150  # plus the extra process


def test_many_hosts_table_marks_killed_and_failed_runs() -> None:
    import hosts

    def run(status: str) -> dict:
        return {"status": status, "wall_s": 12.0, "max_process_mb": 2048.0, "total_mb": 3072.0,
                "detail": {"ok": "", "timeout": "timeout: killed after 12 s", "failed": "exit 2: no --engine"}[status]}

    row = {"hosts": 4, "data_mb": 96.0, "events": 100, "ours": run("ok"), "dask": run("failed"),
           "xprof": run("timeout"), "dask_note": ""}
    assert hosts.table_row(row) == ("4", "96", "100", "12.00", "2.00", "3.00", "-", "-", ">12.00", ">=2.00",
                                    "dask exit 2: no --engine; XProf timeout: killed after 12 s")


def _plane_sizes(path: str) -> dict[str, tuple[int, int, int]]:
    """Plane name -> (bytes, events, stats) of a capture, its events counted, not decoded."""
    from tb_gpuadvisor.input.xplane.decode import count_events, decode_plane
    from tb_gpuadvisor.input.xplane.reader import CaptureFile
    sizes = {}
    with CaptureFile(path) as capture:
        for span in capture.index.plane_spans:
            data = capture.read(span)
            names: list[str] = []
            decode_plane(data, lambda plane: names.append(plane.name))      # the shell alone
            sizes[names[0]] = (span[1] - span[0], *count_events(data))
    return sizes


def test_capture_shapes_hold_what_they_are_named_for(tmp_path: Path) -> None:
    """Each benchmark shape (make_capture.SHAPES) at ~3 MB: the host shape's host plane outweighs
    its GPU planes together, the tf shape's holds twice their bytes, the stats shape carries 8
    more stats per event than the benchmark's,
    the planes shape has 32 GPU planes, the single shape one, and the steps8 shape (issue 46)
    eight GPU planes of about 600 kernels per GPU and step; every one parses
    and is analysed."""
    import make_capture
    import shapes
    found = {}
    for shape in ("bench", "host", "tf", "stats", "planes", "single", "steps8"):
        found[shape] = _plane_sizes(shapes.build(tmp_path, shape, 3)["path"])
    assert shapes.build(tmp_path, "bench", 3)["path"]      # built once, then reused
    gpu = lambda sizes, i: sum(v[i] for k, v in sizes.items() if k.startswith("/device:GPU"))  # noqa: E731
    host = lambda sizes, i: sizes["/host:CPU"][i]  # noqa: E731
    assert host(found["host"], 0) > gpu(found["host"], 0) and host(found["bench"], 0) < gpu(found["bench"], 0)
    assert 55 < host(found["host"], 0) / host(found["host"], 1) < 65          # bytes per host event
    assert host(found["tf"], 0) > 1.8 * gpu(found["tf"], 0)                      # 2x, as real TF captures
    per_event = {s: (host(found[s], 2) + gpu(found[s], 2)) / (host(found[s], 1) + gpu(found[s], 1))
                 for s in ("bench", "stats")}
    assert per_event["stats"] - per_event["bench"] == pytest.approx(8, abs=0.01)
    assert sum(name.startswith("/device:GPU") for name in found["planes"]) == 32
    assert sum(name.startswith("/device:GPU") for name in found["single"]) == 1
    assert sum(name.startswith("/device:GPU") for name in found["steps8"]) == 8
    shape = dict(make_capture.SHAPES["steps8"])
    info = make_capture.make_capture(tmp_path / "steps8", 3, shape.pop("gpus"), **shape)
    assert 590 <= info.kernel_events / info.steps / 8 <= 610
    assert set(make_capture.SHAPES) == {"bench", "host", "tf", "stats", "long", "planes", "single", "steps8"}


def test_shapes_table_in_turn_with_stage_times(tmp_path: Path) -> None:
    """shapes.py on one small capture, this checkout against itself: every run's stage times are
    read from its TB_GPUADVISOR_TIMINGS lines, and the table, the per-MB ratio between sizes and
    the stage table are written into the README's section."""
    import shapes
    rows = shapes.measure_all(["bench"], [2, 4], tmp_path / "caps", {"ours": bench.REPO, "again": bench.REPO},
                              repeat=1, warmup=0, timeout_s=120)
    assert [(r["nominal_mb"], r["tree"]) for r in rows] == [(2, "ours"), (2, "again"), (4, "ours"), (4, "again")]
    assert all(r["ok"] == 1 and r["stages"]["decode"][0] > 0 and r["stages"]["checks"][1] > 0 for r in rows)
    result = {"machine": bench.machine(), "load": (1.0, 1.0, 1.0), "date": "today", "repeat": 1, "warmup": 0,
              "trees": {}, "rows": rows}
    readme = tmp_path / "README.md"
    readme.write_text("<!-- shapes:begin -->\nSTALE TABLE\n<!-- shapes:end -->\n")
    bench.write_results(result, tmp_path / "out", (readme,), name="shapes", render=shapes.render, section="shapes")
    text = readme.read_text()
    assert "| bench | 2 |" in text and "| bench | ours |" in text and "STALE TABLE" not in text


def test_stage_times_are_summed_per_stage() -> None:
    text = ("tb-gpuadvisor timing: decode        1.500 s wall   2.250 s cpu  pid 1  host-a\n"
            "tb-gpuadvisor timing: decode        0.500 s wall   0.750 s cpu  pid 2  host-b\n"
            "tb-gpuadvisor timing: report        0.010 s wall   0.020 s cpu  pid 1\nother line\n")
    assert bench.stage_times(text) == {"decode": [2.0, 3.0], "report": [0.01, 0.02]}


def test_sniff_benchmark_finds_only_the_trace_beside_large_json(tmp_path: Path) -> None:
    """benchmarks/sniff.py on 8 MB of non-trace JSON: both logdirs hold the one trace session, and
    every number it reports is there (how fast is the benchmark's own business, not this test's)."""
    import sniff

    result = sniff.measure(8, 2, str(tmp_path))
    assert result["sessions"] == [1, 1]
    assert set(result) == {"base_ms", "large_ms", "first_large_ms", "sessions", "peak_rss_growth_mb"}
