"""Fixes that several checks recommend, written once so their wording and code agree.

Each is a :class:`Fix` with a sentence saying what to change and why, a code
snippet a user can paste, and the TensorFlow guide that explains it.
"""

from __future__ import annotations

from tb_gpuadvisor.checks.base import Fix

DATA_GUIDE = "https://www.tensorflow.org/guide/data_performance"
GPU_PERF_GUIDE = "https://www.tensorflow.org/guide/gpu_performance_analysis"
GPU_GUIDE = "https://www.tensorflow.org/guide/gpu"
MIXED_PRECISION_GUIDE = "https://www.tensorflow.org/guide/mixed_precision"
DISTRIBUTED_GUIDE = "https://www.tensorflow.org/guide/distributed_training"
FUNCTION_GUIDE = "https://www.tensorflow.org/guide/function"
XLA_GUIDE = "https://www.tensorflow.org/xla"
KERAS_FIT_DOC = "https://keras.io/api/models/model_training_apis/"

PREFETCH = Fix(
    text="Let tf.data prepare the next batches while the current step runs: end the pipeline with "
         "prefetch(tf.data.AUTOTUNE).",
    code="dataset = dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE)",
    doc=DATA_GUIDE,
)

PARALLEL_MAP = Fix(
    text="Run the preprocessing function on several CPU cores; batching before map lets a "
         "vectorized function process a whole batch per call.",
    code="dataset = dataset.batch(batch_size)\n"
         "dataset = dataset.map(preprocess_batch, num_parallel_calls=tf.data.AUTOTUNE)",
    doc=DATA_GUIDE,
)

CACHE_AND_INTERLEAVE = Fix(
    text="Read files in parallel and cache what fits in memory (after the expensive, "
         "deterministic steps) so later epochs skip reading and decoding.",
    code="files = tf.data.Dataset.list_files(pattern)\n"
         "dataset = files.interleave(tf.data.TFRecordDataset, cycle_length=8,\n"
         "                           num_parallel_calls=tf.data.AUTOTUNE)\n"
         "dataset = dataset.map(decode, num_parallel_calls=tf.data.AUTOTUNE).cache()",
    doc=DATA_GUIDE,
)

SYNTHETIC_INPUT_TEST = Fix(
    text="Confirm the diagnosis: train a few steps on random tensors of the same shape. If the "
         "step time drops, the input pipeline is the bottleneck; if not, look elsewhere.",
    code="images = tf.random.uniform((batch_size, *image_shape))\n"
         "labels = tf.random.uniform((batch_size,), maxval=num_classes, dtype=tf.int32)\n"
         "synthetic = tf.data.Dataset.from_tensors((images, labels)).repeat()\n"
         "model.fit(synthetic, steps_per_epoch=50)",
    doc=GPU_PERF_GUIDE,
)

TF_FUNCTION = Fix(
    text="Run the whole training step as one tf.function graph instead of op by op from Python "
         "(Model.fit does this unless run_eagerly=True).",
    code="@tf.function\n"
         "def train_step(x, y):\n"
         "    with tf.GradientTape() as tape:\n"
         "        loss = loss_fn(y, model(x, training=True))\n"
         "    grads = tape.gradient(loss, model.trainable_variables)\n"
         "    optimizer.apply_gradients(zip(grads, model.trainable_variables))\n"
         "    return loss",
    doc=FUNCTION_GUIDE,
)

XLA_JIT = Fix(
    text="Compile the step with XLA: it fuses chains of small element-wise ops into a few "
         "kernels, so there are fewer launches per step.",
    code="model.compile(optimizer=optimizer, loss=loss, jit_compile=True)\n"
         "# or, in a custom loop:\n"
         "@tf.function(jit_compile=True)\n"
         "def train_step(x, y): ...",
    doc=XLA_GUIDE,
)

LARGER_BATCH = Fix(
    text="Use a larger batch (scaling the learning rate accordingly): the same number of kernel "
         "launches then does more work each, so fixed per-launch costs shrink relative to compute.",
    code="dataset = dataset.batch(256)  # e.g. up from 32, as far as device memory allows",
    doc=GPU_PERF_GUIDE,
)

STEPS_PER_EXECUTION = Fix(
    text="Run several training steps per call into the compiled function, so Python and "
         "callback work between steps happens once per group of steps.",
    code="model.compile(optimizer=optimizer, loss=loss, steps_per_execution=32)",
    doc=KERAS_FIT_DOC,
)

GPU_PRIVATE_THREADS = Fix(
    text="Give each GPU its own host threads for launching kernels, so launches do not queue "
         "behind other host work. Set the variables before TensorFlow starts.",
    code="import os\n"
         "os.environ['TF_GPU_THREAD_MODE'] = 'gpu_private'\n"
         "os.environ['TF_GPU_THREAD_COUNT'] = '2'\n"
         "import tensorflow as tf",
    doc=GPU_PERF_GUIDE,
)

LOG_DEVICE_PLACEMENT = Fix(
    text="Print where every op runs to find the ones TensorFlow put on the CPU, then pin the "
         "model to the GPU explicitly.",
    code="tf.debugging.set_log_device_placement(True)\n"
         "strategy = tf.distribute.OneDeviceStrategy('/gpu:0')\n"
         "with strategy.scope():\n"
         "    model = build_model()",
    doc=GPU_GUIDE,
)
