"""The demo scenarios: each trains briefly and captures a profile with one planted problem.

Keras scenarios profile through ``keras.callbacks.TensorBoard(profile_batch=(a, b))``
after ``warmup`` unprofiled steps, so tracing and graph building stay out of the
capture.  Keras writes the capture under ``<run_dir>/train/plugins/profile/``; the
custom loop writes to the same place so every scenario shows up in TensorBoard as
the run ``<scenario>/train``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import keras
import numpy as np
import tensorflow as tf

from demo import workloads as wl


@dataclass(frozen=True)
class Settings:
    """What one scenario run needs to know about where and how long to train."""

    run_dir: Path
    warmup: int
    steps: int
    gpu_count: int

    @property
    def on_gpu(self) -> bool:
        return self.gpu_count > 0

    @property
    def capture_dir(self) -> Path:
        return self.run_dir / "train"

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps


def _fit_with_profile(model: keras.Model, dataset: tf.data.Dataset, settings: Settings,
                      callbacks: tuple[keras.callbacks.Callback, ...] = ()) -> None:
    """Trains warmup + steps batches and profiles only the last ``steps`` of them.

    Extra callbacks come before the TensorBoard callback, so their per-batch work falls
    inside the "Profiled batch" step markers Keras 3 records.
    """
    tensorboard = keras.callbacks.TensorBoard(
        log_dir=str(settings.run_dir),
        profile_batch=(settings.warmup + 1, settings.warmup + settings.steps))
    # shuffle=False: the pipelines shuffle (or not) themselves; Keras ignores it for datasets anyway.
    model.fit(dataset, epochs=1, steps_per_epoch=settings.total_steps, shuffle=False,
              callbacks=[*callbacks, tensorboard], verbose=0)


def _use_mixed_precision_on_gpu(settings: Settings) -> None:
    policy = "mixed_float16" if settings.on_gpu else "float32"
    keras.mixed_precision.set_global_policy(policy)


def run_healthy(settings: Settings) -> None:
    _use_mixed_precision_on_gpu(settings)
    images, labels = wl.synthetic_images(2048)
    model = wl.compile_classifier(wl.small_cnn())
    _fit_with_profile(model, wl.fast_pipeline(images, labels), settings)


def run_fp32(settings: Settings) -> None:
    keras.mixed_precision.set_global_policy("float32")
    images, labels = wl.synthetic_images(2048)
    model = wl.compile_classifier(wl.small_cnn())
    _fit_with_profile(model, wl.fast_pipeline(images, labels), settings)


def run_input_bound(settings: Settings) -> None:
    _use_mixed_precision_on_gpu(settings)
    images, labels = wl.synthetic_images(2048)
    model = wl.compile_classifier(wl.small_cnn())
    _fit_with_profile(model, wl.slow_pipeline(images, labels), settings)


def run_host_overhead(settings: Settings) -> None:
    _use_mixed_precision_on_gpu(settings)
    images, labels = wl.synthetic_images(2048)
    holdout_images, holdout_labels = wl.synthetic_images(64, seed=1)
    model = wl.compile_classifier(wl.small_cnn())
    metrics = wl.PythonMetricsCallback(holdout_images, holdout_labels, bootstrap_rounds=4000)
    # Smaller batches than healthy: per-batch host work hurts most when steps are short.
    _fit_with_profile(model, wl.fast_pipeline(images, labels, batch_size=64), settings, callbacks=(metrics,))


def run_launch_bound(settings: Settings) -> None:
    rng = np.random.default_rng(0)
    features = rng.normal(size=(1024, 16)).astype(np.float32)
    labels = (features[:, 0] > 0).astype(np.int32) + 2 * (features[:, 1] > 0).astype(np.int32)
    dataset = (tf.data.Dataset.from_tensor_slices((features, labels))
               .batch(1).repeat().prefetch(tf.data.AUTOTUNE))
    model = wl.compile_classifier(wl.tiny_op_mlp(), run_eagerly=True)
    _fit_with_profile(model, dataset, settings)


def run_host_placement(settings: Settings) -> None:
    # Long sequences of a large vocabulary make deduplicating ids (tf.unique, which has no GPU
    # kernel) the heaviest op of the step; the narrow projection stays cheap.
    vocab, width, sequence = 500_000, 16, 4096
    ids, labels = wl.synthetic_tokens(2048, sequence, vocab)
    dataset = (tf.data.Dataset.from_tensor_slices((ids, labels))
               .batch(wl.BATCH_SIZE, drop_remainder=True).repeat().prefetch(tf.data.AUTOTUNE))
    # XLA would compile the step for one device and ignore the host pinning (and reject tf.unique).
    model = wl.compile_classifier(wl.token_model(vocab, width, sequence), jit_compile=False)
    _fit_with_profile(model, dataset, settings)


def _replica_devices(on_gpu: bool) -> list[str]:
    """The logical devices MirroredStrategy mirrors over: the GPUs, or the CPUs when there is none."""
    return [d.name for d in tf.config.list_logical_devices("GPU" if on_gpu else "CPU")]


def configure_two_replicas(gpu_count: int) -> str:
    """Two replicas on any machine: real GPUs, one GPU split in two, or two logical CPUs."""
    if gpu_count == 1:
        gpu = tf.config.list_physical_devices("GPU")[0]
        half = tf.config.LogicalDeviceConfiguration(memory_limit=2048)
        tf.config.set_logical_device_configuration(gpu, [half, half])
    elif gpu_count == 0:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
    return f"MirroredStrategy over {', '.join(_replica_devices(gpu_count > 0))}"


def run_multi_gpu(settings: Settings) -> None:
    devices = _replica_devices(settings.on_gpu)
    strategy = tf.distribute.MirroredStrategy(devices=devices)
    images, labels = wl.synthetic_images(2048)
    # Sized so the extra work roughly equals one replica's own step on that kind of device.
    size, repeats = (3072, 3) if settings.on_gpu else (512, 2)
    with strategy.scope():
        model = wl.compile_classifier(wl.imbalanced_cnn(devices[0], size, repeats), jit_compile=False)
    batch = wl.BATCH_SIZE * strategy.num_replicas_in_sync
    _fit_with_profile(model, wl.fast_pipeline(images, labels, batch), settings)


def run_custom_loop(settings: Settings) -> None:
    """A GradientTape loop whose steps are marked for the profiler with ``_r=1`` and ``step_num``."""
    _use_mixed_precision_on_gpu(settings)
    images, labels = wl.synthetic_images(2048)
    model = wl.small_cnn()
    optimizer = keras.optimizers.Adam(1e-3)
    if settings.on_gpu:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(batch_images, batch_labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(batch_labels, model(batch_images, training=True))
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    batches = iter(wl.fast_pipeline(images, labels))
    # A throwaway session first, as Keras' callback does: the first profiler start is slow to set up.
    tf.profiler.experimental.start("")
    tf.profiler.experimental.stop(save=False)
    for _ in range(settings.warmup):
        train_step(*next(batches))
    tf.profiler.experimental.start(str(settings.capture_dir))
    try:
        for step in range(settings.warmup, settings.total_steps):
            with tf.profiler.experimental.Trace("train", step_num=step, _r=1):
                train_step(*next(batches))
    finally:
        tf.profiler.experimental.stop()


# Scenario name -> function that trains and captures; names and descriptions live in demo.catalogue.
RUNNERS: dict[str, Callable[[Settings], None]] = {
    "healthy": run_healthy,
    "input_bound": run_input_bound,
    "host_overhead": run_host_overhead,
    "launch_bound": run_launch_bound,
    "host_placement": run_host_placement,
    "fp32": run_fp32,
    "multi_gpu": run_multi_gpu,
    "custom_loop": run_custom_loop,
}
# Scenario name -> device layout to set before TensorFlow initialises its devices.
DEVICE_SETUP: dict[str, Callable[[int], str]] = {"multi_gpu": configure_two_replicas}
