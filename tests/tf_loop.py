"""The small Keras classifier and annotated custom loop that the real-TensorFlow tests profile.

Only the child processes those tests start import this module, so the pytest process
never loads TensorFlow.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import keras
import numpy as np
import tensorflow as tf

CLASSES = 4


def labelled_rows(rows: int, features: int) -> tf.data.Dataset:
    """Random rows with class labels, seeded so every run profiles the same data."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(rows, features)).astype("float32"), rng.integers(0, CLASSES, rows)
    return tf.data.Dataset.from_tensor_slices((x, y))


def classifier(features: int, hidden: Sequence[int]) -> keras.Sequential:
    """Dense ReLU layers of the given widths: enough ops for a capture, quick on a CPU."""
    return keras.Sequential([keras.Input((features,)),
                             *(keras.layers.Dense(width, activation="relu") for width in hidden),
                             keras.layers.Dense(CLASSES)])


def loss_fn() -> keras.losses.Loss:
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def profile_custom_loop(log_dir: str, model: keras.Model, batches: Iterator, *, warmup: int,
                        steps: int) -> None:
    """Train with a ``tf.function`` step and profile ``steps`` steps after ``warmup`` ones.

    Tracing happens in the warm-up, outside the capture. Each profiled step runs inside
    ``Trace("train", step_num=..., _r=1)``, the marker profilers take for a step.
    """
    optimizer = keras.optimizers.Adam()
    loss = loss_fn()

    @tf.function
    def train_step(features, labels):
        with tf.GradientTape() as tape:
            value = loss(labels, model(features, training=True))
        grads = tape.gradient(value, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return value

    for _ in range(warmup):
        train_step(*next(batches))
    tf.profiler.experimental.start(log_dir)
    for step in range(steps):
        with tf.profiler.experimental.Trace("train", step_num=step, _r=1):
            train_step(*next(batches))
    tf.profiler.experimental.stop()
