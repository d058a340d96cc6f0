"""Before/after pairs: demo jobs with a planted problem, and the same jobs with it fixed.

    python -m demo.fixed --logdir pairs_logs [--steps 4 --warmup 2]

The Advisor predicts, from the "before" capture alone, the step time its fix would give
(a replay of the step with that cause removed); the "after" capture measures it. All
runs share one process (on the CPU they set no process-wide state that differs), each
writing ``<logdir>/<run>/train/plugins/profile/<session>/``.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pair:
    """A planted problem, the check whose fix it is, and the runs before and after the fix."""

    name: str
    check: str
    before: str
    after: str
    fix: str


PAIRS = (
    Pair("input pipeline", "input_bound", "input_bound", "input_fixed",
         "parallel map and prefetch instead of a sequential map"),
    Pair("host work per batch", "host_overhead", "host_overhead", "host_overhead_fixed",
         "no per-batch Python callback"),
    Pair("custom loop", "host_overhead", "custom_loop_eager", "custom_loop",
         "the training step wrapped in tf.function"),
)


def _runners() -> dict:
    """Run name -> function(settings); imported late so the parent never loads TensorFlow."""
    import tensorflow as tf

    from demo import scenarios
    from demo import workloads as wl

    def host_overhead_fixed(settings: scenarios.Settings) -> None:
        images, labels = wl.synthetic_images(2048)
        model = wl.compile_classifier(wl.small_cnn())
        # The scenario's training (same model and batch), minus its per-batch callback.
        scenarios._fit_with_profile(model, wl.fast_pipeline(images, labels, batch_size=64), settings)

    def custom_loop_eager(settings: scenarios.Settings) -> None:
        # The scenario's loop with its tf.function running op by op, as an unwrapped step would.
        tf.config.run_functions_eagerly(True)
        try:
            scenarios.run_custom_loop(settings)
        finally:
            tf.config.run_functions_eagerly(False)

    return {"input_bound": scenarios.run_input_bound, "input_fixed": scenarios.run_healthy,
            "host_overhead": scenarios.run_host_overhead, "host_overhead_fixed": host_overhead_fixed,
            "custom_loop_eager": custom_loop_eager, "custom_loop": scenarios.run_custom_loop}


def run_pairs(logdir: Path, steps: int, warmup: int) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from demo.scenarios import Settings

    runners = _runners()
    gpus = len(tf.config.list_physical_devices("GPU"))
    for name in dict.fromkeys(run for pair in PAIRS for run in (pair.before, pair.after)):
        settings = Settings(run_dir=logdir / name, warmup=warmup, steps=steps, gpu_count=gpus)
        settings.run_dir.mkdir(parents=True, exist_ok=True)
        runners[name](settings)
        print(f"[pairs] {name}: capture in {settings.capture_dir}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.fixed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--logdir", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)
    run_pairs(args.logdir, args.steps, args.warmup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
