"""Synthetic data, input pipelines, models and callbacks the demo scenarios are built from.

Everything is sized so that one scenario runs in well under a minute on two CPU
cores, yet is shaped like real training (image batches, a small CNN, Adam) so the
captured timelines look like the ones users bring to the Advisor.
"""

from __future__ import annotations

import math
import random

import keras
import numpy as np
import tensorflow as tf

IMAGE_SHAPE = (32, 32, 3)
NUM_CLASSES = 10
BATCH_SIZE = 128


def synthetic_images(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random uint8 images whose label is a function of their colour balance, so the model can learn."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(count, *IMAGE_SHAPE), dtype=np.uint8)
    balance = images[..., 0].mean(axis=(1, 2)) - images[..., 2].mean(axis=(1, 2))
    edges = np.quantile(balance, np.linspace(0, 1, NUM_CLASSES + 1)[1:-1])
    return images, np.digitize(balance, edges).astype(np.int32)


def _normalize(image: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    image = tf.image.random_flip_left_right(tf.cast(image, tf.float32) / 255.0)
    return image, label


def _decode_and_augment(image: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """A costly per-image preprocessing chain, like decoding and augmenting a large photo."""
    big = tf.image.resize(tf.cast(image, tf.float32) / 255.0, (224, 224), method="bicubic")
    kernel = tf.ones((5, 5, 3, 1)) / 25.0
    for _ in range(8):
        big = tf.nn.depthwise_conv2d(big[None], kernel, strides=(1, 1, 1, 1), padding="SAME")[0]
    big = tf.image.adjust_contrast(tf.image.adjust_saturation(big, 1.2), 1.1)
    return tf.image.resize(big, IMAGE_SHAPE[:2], method="area"), label


def fast_pipeline(images: np.ndarray, labels: np.ndarray, batch_size: int = BATCH_SIZE) -> tf.data.Dataset:
    """The pipeline the tf.data guide recommends: cached, parallel map, prefetching."""
    return (tf.data.Dataset.from_tensor_slices((images, labels))
            .cache()
            .shuffle(len(images), seed=0)
            .map(_normalize, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(batch_size, drop_remainder=True)
            .repeat()
            .prefetch(tf.data.AUTOTUNE))


def slow_pipeline(images: np.ndarray, labels: np.ndarray, batch_size: int = BATCH_SIZE) -> tf.data.Dataset:
    """An expensive per-element map run sequentially, with no prefetch of its own."""
    return (tf.data.Dataset.from_tensor_slices((images, labels))
            .map(_decode_and_augment)
            .batch(batch_size, drop_remainder=True)
            .repeat())


def small_cnn(name: str = "small_cnn") -> keras.Model:
    """A compact CNN; channel counts are multiples of 8 so fp16 GEMMs are Tensor-Core friendly."""
    inputs = keras.Input(IMAGE_SHAPE)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(128, activation="relu")(x)
    x = keras.layers.Dense(NUM_CLASSES)(x)
    # Logits in float32 keep the loss numerically safe under a mixed-precision policy.
    outputs = keras.layers.Activation("linear", dtype="float32")(x)
    return keras.Model(inputs, outputs, name=name)


def compile_classifier(model: keras.Model, **kwargs) -> keras.Model:
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], **kwargs)
    return model


def tiny_op_mlp(features: int = 16, depth: int = 32) -> keras.Model:
    """Many narrow layers: every step is hundreds of microsecond-sized ops."""
    inputs = keras.Input((features,))
    x = inputs
    for _ in range(depth):
        x = keras.layers.Dense(features, activation="tanh")(x)
    outputs = keras.layers.Dense(NUM_CLASSES)(x)
    return keras.Model(inputs, outputs, name="tiny_op_mlp")


class HostPinnedTokenEncoder(keras.layers.Layer):
    """Embeds token ids through tf.unique and projects them, with both pinned to the host CPU.

    Deduplicating ids before the embedding lookup is a common trick; pinning it and the
    projection to ``/CPU:0`` (or relying on ops without a GPU kernel) keeps the heaviest
    part of the step off the accelerator and forces copies in and out of it.
    """

    def __init__(self, vocab: int, width: int, **kwargs):
        super().__init__(**kwargs)
        self.vocab, self.width = vocab, width

    def build(self, input_shape):
        # A frozen (pretrained) embedding table: deduplication, not its gradient, is the heavy part.
        self.table = self.add_weight(shape=(self.vocab, self.width), initializer="glorot_uniform", name="table",
                                     trainable=False)
        self.projection = self.add_weight(shape=(self.width, self.width), initializer="glorot_uniform",
                                          name="projection")

    def call(self, ids):
        with tf.device("/CPU:0"):
            flat = tf.reshape(ids, [-1])
            unique_ids, positions = tf.unique(flat)
            rows = tf.gather(tf.convert_to_tensor(self.table), unique_ids)
            hidden = tf.nn.relu(tf.matmul(tf.gather(rows, positions), self.projection))
            hidden = tf.reshape(hidden, [tf.shape(ids)[0], -1, self.width])
            return tf.reduce_mean(hidden, axis=1)


def token_model(vocab: int, width: int, sequence: int) -> keras.Model:
    ids = keras.Input((sequence,), dtype="int32")
    x = HostPinnedTokenEncoder(vocab, width)(ids)
    x = keras.layers.Dense(64, activation="relu")(x)
    return keras.Model(ids, keras.layers.Dense(NUM_CLASSES)(x), name="token_model")


def synthetic_tokens(count: int, sequence: int, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Zipf-distributed token ids (many repeats, as in text); label = a hash of the first tokens."""
    rng = np.random.default_rng(seed)
    ids = np.minimum(rng.zipf(1.3, size=(count, sequence)), vocab - 1).astype(np.int32)
    return ids, (ids[:, :4].sum(axis=1) % NUM_CLASSES).astype(np.int32)


class FirstDeviceExtraWork(keras.layers.Layer):
    """Adds a matmul chain that every replica runs on one fixed device, overloading it.

    A typical source of imbalance in MirroredStrategy: a helper op with a hard-coded
    ``tf.device`` lands on the first GPU for all replicas.  Its result feeds the output
    with a negligible weight so graph pruning keeps it.
    """

    def __init__(self, device: str, size: int, repeats: int, **kwargs):
        super().__init__(**kwargs)
        self.device, self.size, self.repeats = device, size, repeats

    def call(self, x):
        with tf.device(self.device):
            flat = tf.reshape(tf.cast(x, tf.float32), [tf.shape(x)[0], -1])[:, : self.size]
            gram = tf.matmul(flat, flat, transpose_a=True)
            for _ in range(self.repeats):
                gram = tf.tanh(tf.matmul(gram, gram) / float(self.size))
            nudge = tf.reduce_mean(gram) * 1e-9
        return x + tf.cast(nudge, x.dtype)


def imbalanced_cnn(device: str, size: int, repeats: int) -> keras.Model:
    inputs = keras.Input(IMAGE_SHAPE)
    x = FirstDeviceExtraWork(device, size, repeats)(inputs)
    body = small_cnn(name="replica_cnn")
    return keras.Model(inputs, body(x), name="imbalanced_cnn")


class PythonMetricsCallback(keras.callbacks.Callback):
    """Scores a held-out batch after every training batch, with the metrics computed in Python.

    This is the anti-pattern the guides warn about: per-batch work outside the compiled
    step (an extra predict call, a device-to-host copy, metric and bootstrap loops in
    plain Python) that leaves the accelerator idle between steps.
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray, bootstrap_rounds: int):
        super().__init__()
        self.images = images.astype(np.float32) / 255.0
        self.labels = [int(v) for v in labels]
        self.rounds = bootstrap_rounds
        self.rng = random.Random(0)
        self.history: list[tuple[float, float, float]] = []

    def on_train_batch_end(self, batch, logs=None):
        logits = np.asarray(self.model.predict_on_batch(self.images)).tolist()
        losses, hits = [], []
        for row, label in zip(logits, self.labels):
            top = max(row)
            log_norm = top + math.log(sum(math.exp(v - top) for v in row))
            losses.append(log_norm - row[label])
            hits.append(1.0 if row.index(top) == label else 0.0)
        accuracies = sorted(sum(self.rng.choice(hits) for _ in hits) / len(hits) for _ in range(self.rounds))
        low, high = accuracies[len(accuracies) // 40], accuracies[-len(accuracies) // 40 - 1]
        self.history.append((sum(losses) / len(losses), low, high))
