"""Command line for the demo trainer.

    python -m demo.train --scenario input_bound --logdir demo_logs
    python -m demo.train --all --logdir demo_logs [--steps 4 --warmup 2] [--retrain]

Each scenario writes ``<logdir>/<scenario>/train/plugins/profile/<session>/`` plus a
``demo_scenario.json`` describing the run.  ``--all`` runs every scenario in its own
Python process: mixed-precision policies and logical device layouts are
process-wide in TensorFlow and cannot be undone once set.  It keeps a scenario's earlier
capture when it was made with the same steps and warm-up (``--retrain`` trains it again).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from demo.catalogue import SCENARIOS
from demo.quiet import run_quietly

MARKER_FILE = "demo_scenario.json"
_PROJECT_ROOT = Path(__file__).resolve().parent.parent


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m demo.train", description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--scenario", choices=list(SCENARIOS))
    which.add_argument("--all", action="store_true", help="run every scenario, one process each")
    parser.add_argument("--logdir", required=True, type=Path, help="TensorBoard log directory")
    parser.add_argument("--steps", type=int, default=8, help="profiled steps (default 8; 3-4 for CI)")
    parser.add_argument("--warmup", type=int, default=5, help="unprofiled steps before the capture")
    parser.add_argument("--retrain", action="store_true",
                        help="with --all: train every scenario again, even one with a capture already")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be at least 1")
    return args


def _clear_previous_run(run_dir: Path) -> None:
    """Removes an earlier capture of this scenario, but only a folder the demo itself wrote."""
    if (run_dir / MARKER_FILE).is_file():
        shutil.rmtree(run_dir)


def run_one(name: str, logdir: Path, steps: int, warmup: int) -> dict:
    """Runs one scenario in this process and returns what it wrote to its marker file."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # noqa: deferred so --all never loads TensorFlow in the parent

    from demo.scenarios import DEVICE_SETUP, RUNNERS, Settings

    scenario = SCENARIOS[name]
    gpus = tf.config.list_physical_devices("GPU")
    layout = DEVICE_SETUP[name](len(gpus)) if name in DEVICE_SETUP else ""
    if gpus:
        names = [tf.config.experimental.get_device_details(g).get("device_name", g.name) for g in gpus]
        device = f"{len(gpus)} GPU(s): {', '.join(names)}"
    else:
        device = "CPU only (no GPU visible to TensorFlow)"
    print(f"[demo] {name}: planted: {scenario.planted}", flush=True)
    print(f"[demo] {name}: training on {device}" + (f"; {layout}" if layout else ""), flush=True)
    if not gpus and scenario.cpu_note:
        print(f"[demo] {name}: note: {scenario.cpu_note}", flush=True)

    run_dir = logdir / name
    _clear_previous_run(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    settings = Settings(run_dir=run_dir, warmup=warmup, steps=steps, gpu_count=len(gpus))
    started = time.perf_counter()
    RUNNERS[name](settings)
    seconds = time.perf_counter() - started
    record = {"scenario": name, "planted": scenario.planted, "device": device, "device_layout": layout,
              "gpu_problem_visible": bool(gpus) or not scenario.cpu_note,
              "cpu_note": "" if gpus else scenario.cpu_note,
              "warmup_steps": warmup, "profiled_steps": steps, "train_seconds": round(seconds, 1),
              "tensorflow": tf.__version__}
    (run_dir / MARKER_FILE).write_text(json.dumps(record, indent=2) + "\n")
    print(f"[demo] {name}: capture in {settings.capture_dir} ({seconds:.1f} s of training)", flush=True)
    return record


def reusable(run_dir: Path, steps: int, warmup: int) -> bool:
    """Whether RUN_DIR holds a finished capture of the demo made with STEPS and WARMUP: its marker
    file (written after the capture) says so and a session folder holds files."""
    try:
        record = json.loads((run_dir / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    made = (record.get("profiled_steps"), record.get("warmup_steps")) == (steps, warmup)
    return made and any(p.is_file() for p in run_dir.glob("train/plugins/profile/*/*"))


def run_all(logdir: Path, steps: int, warmup: int, retrain: bool = False) -> int:
    """Runs each scenario in a fresh interpreter (or keeps its earlier capture unless RETRAIN);
    returns the number that failed."""
    failed = []
    for name in SCENARIOS:
        if not retrain and reusable(logdir / name, steps, warmup):
            print(f"[demo] {name}: keeping the capture in {logdir / name} "
                  "(make demo RETRAIN=1, or --retrain, trains again)", flush=True)
            continue
        started = time.perf_counter()
        command = [sys.executable, "-m", "demo.train", "--scenario", name, "--logdir", str(logdir.resolve()),
                   "--steps", str(steps), "--warmup", str(warmup)]
        code = run_quietly(command, cwd=_PROJECT_ROOT)
        status = "ok" if code == 0 else f"FAILED (exit {code})"
        print(f"[demo] {name}: {status} in {time.perf_counter() - started:.1f} s wall", flush=True)
        if code:
            failed.append(name)
    if failed:
        print(f"[demo] failed scenarios: {', '.join(failed)}", file=sys.stderr)
    return len(failed)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.all:
        return 1 if run_all(args.logdir, args.steps, args.warmup, args.retrain) else 0
    run_one(args.scenario, args.logdir, args.steps, args.warmup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
