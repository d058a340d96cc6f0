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
import time
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


# Seconds each batch waits for slow storage in the I/O-bound pipeline, and how many reads the
# fixed pipeline keeps in flight (waits, not CPU work: more than the cores is fine).
READ_SECONDS = 1.0
PARALLEL_READS = 16

PAIRS = (
    Pair("input pipeline", "input_bound", "input_io_bound", "input_io_fixed",
         "reads run in parallel and ahead of the step (parallel map, prefetch)"),
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

    def io_pipeline(parallel: bool) -> tf.data.Dataset:
        """Batches read from slow storage: the reads wait (no CPU), like files on a network disk."""
        images, labels = wl.synthetic_images(512)

        def read(batch: tf.Tensor) -> tf.Tensor:
            time.sleep(READ_SECONDS)
            return tf.cast(batch, tf.float32) / 255.0

        def load(batch_images: tf.Tensor, batch_labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            loaded = tf.py_function(read, [batch_images], tf.float32)
            loaded.set_shape(batch_images.shape)
            return loaded, batch_labels

        batches = tf.data.Dataset.from_tensor_slices((images, labels)).batch(wl.BATCH_SIZE, drop_remainder=True)
        if parallel:
            return batches.map(load, num_parallel_calls=PARALLEL_READS).repeat().prefetch(PARALLEL_READS)
        return batches.map(load).repeat()

    def input_run(parallel: bool):
        def run(settings: scenarios.Settings) -> None:
            model = wl.compile_classifier(wl.small_cnn())
            scenarios._fit_with_profile(model, io_pipeline(parallel), settings)
        return run

    def custom_loop_eager(settings: scenarios.Settings) -> None:
        # The scenario's loop with its tf.function running op by op, as an unwrapped step would.
        tf.config.run_functions_eagerly(True)
        try:
            scenarios.run_custom_loop(settings)
        finally:
            tf.config.run_functions_eagerly(False)

    return {"input_io_bound": input_run(parallel=False), "input_io_fixed": input_run(parallel=True),
            "host_overhead": scenarios.run_host_overhead, "host_overhead_fixed": host_overhead_fixed,
            "custom_loop_eager": custom_loop_eager, "custom_loop": scenarios.run_custom_loop}


def run_pairs(logdir: Path, steps: int, warmup: int) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from demo.scenarios import Settings

    runners = _runners()
    gpus = len(tf.config.list_physical_devices("GPU"))
    # Each fixed run first: TensorFlow's first runs in a process are slower, which would flatter the fix.
    for name in dict.fromkeys(run for pair in PAIRS for run in (pair.after, pair.before)):
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
