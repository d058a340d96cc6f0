"""Per-framework name rules: what an event's name means, decided once per distinct name by the
format adapter that reads the capture (see tb_gpuadvisor/input).

The only place framework names are spelled (tests/test_vocabulary_seam.py): ``tensorflow``
(TensorFlow, Keras, tf.data), ``xla`` (XLA/PjRt runtime, compiling, autotuning), ``hlo`` (HLO
instruction names), ``jax``, ``pytorch`` (Kineto), and ``gpu`` (CUDA/HIP calls and library kernel
names that every framework's captures share); ``frameworks`` holds the rules spanning them."""
