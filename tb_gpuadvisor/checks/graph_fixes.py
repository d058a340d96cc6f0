"""The "run the step as a compiled graph" fixes that apply to a capture: shared by the checks of
host work between launches (host_overhead) and of launch overhead (kernel_launch)."""

from __future__ import annotations

from tb_gpuadvisor.checks import fixes
from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.model.kernels import named_events
from tb_gpuadvisor.vocab import tensorflow

LOOP_IN_GRAPH = fixes.Remedy(
    text="In a custom training loop, run the loop over the dataset inside tf.function too, so "
         "Python is not re-entered between steps.",
    code="@tf.function\n"
         "def train_epoch(dataset):\n"
         "    for x, y in dataset:  # becomes a tf.while_loop\n"
         "        train_step(x, y)",
    doc=fixes.FUNCTION_GUIDE,
    jax=fixes.JAX_SCAN_STEPS, pytorch=fixes.TORCH_COMPILE)

# Steps marked by model.fit itself (Keras 3 "Profiled batch", Keras 2 TraceContext): fit compiles
# the step into a tf.function unless run_eagerly=True, and runs the loop over the data itself.
_FIT_MARKERS = ("keras", "keras2")


def graph_remedies(analysis: Analysis) -> list[fixes.Remedy]:
    """The "run it as a tf.function" remedies that apply: none for a model.fit step that already
    ran as one (its function calls are in the steps), only EAGER_FIT (turn run_eagerly off) for
    an eager fit, both for a custom loop."""
    if analysis.trust.candidates.source not in _FIT_MARKERS:
        return [fixes.TF_FUNCTION, LOOP_IN_GRAPH]
    compiled = any((named_events(host.activity, "graph_call", tensorflow.GRAPH_CALL.search) & (host.activity.step >= 0)).any()
                   for host in analysis.model.hosts)
    return [] if compiled else [fixes.EAGER_FIT]
