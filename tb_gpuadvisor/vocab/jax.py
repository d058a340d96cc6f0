"""What JAX event names mean: jitted function calls, the XLA modules they run, its
re-sharding fallback and its read-back call, as the JAX captures in ``../shared/corpus`` (ROCm
GPUs, TPU) and the in-loop helper's own captures name them."""

from __future__ import annotations

import re

FRAMEWORK = "jax"

# A call of a jitted function ("PjitFunction(train_step)") and the module it runs ("jit_train_step").
PJIT_PREFIX = "PjitFunction"
FUNCTION = re.compile(r"^PjitFunction\(|^jit_")
PJIT_CALL = re.compile(r"^PjitFunction\((.*)\)$")
MODULE_PREFIX = "jit_"
MODULE = re.compile(r"^(jit_[^:(]*)")

# The host call JAX makes when an argument's sharding does not match the one the function was
# compiled for: the array is re-sharded on every call.
RESHARD_EVENT = "cpp_pjit_shard_arg_fallback"
# A Python frame of a call to block_until_ready ("$<file>:<line> block_until_ready").
BLOCK_UNTIL_READY_FRAME = re.compile(r"^\$\S+ block_until_ready$")

# Names only JAX writes: how a capture is known to be JAX's.
HOST_HINTS = (PJIT_PREFIX, "py_xla_execute", "PjRt", "TfrtTpuLoadedExecutable", MODULE_PREFIX)
THREAD_HINT = "py_xla_execute"
