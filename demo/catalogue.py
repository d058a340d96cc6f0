"""What each demo scenario plants, readable without importing TensorFlow."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScenarioInfo:
    name: str
    planted: str
    cpu_note: str  # why the planted problem cannot show without a GPU; "" when it can


CATALOGUE: tuple[ScenarioInfo, ...] = (
    ScenarioInfo("healthy", "nothing: prefetching parallel input pipeline, mixed precision on a GPU",
                 "mixed precision is only used on a GPU; on the CPU the model trains in float32"),
    ScenarioInfo("input_bound", "an expensive tf.data map with no parallelism and no prefetch", ""),
    ScenarioInfo("host_overhead", "a per-batch callback doing an eager forward pass and metrics in Python", ""),
    ScenarioInfo("launch_bound", "hundreds of tiny ops per step at batch size 1, run eagerly",
                 "kernel launch latency exists only on a GPU; on the CPU the same job shows as host time"),
    ScenarioInfo("host_placement", "tf.unique and a heavy projection pinned to /CPU:0 inside the step",
                 "without a GPU every op runs on the host: the /CPU:0 pin cannot show, only the time in "
                 "tf.unique, which has no GPU kernel"),
    ScenarioInfo("fp32", "the healthy model without mixed precision",
                 "precision and Tensor Core use can only be measured on a GPU; on the CPU this equals healthy"),
    ScenarioInfo("multi_gpu", "MirroredStrategy with extra work pinned to the first replica's device",
                 "two logical CPU devices stand in for the GPUs; the profiler keeps no per-device timeline "
                 "for them, so replica imbalance cannot show"),
    ScenarioInfo("custom_loop", "nothing: a tf.GradientTape loop with Trace(step_num=..., _r=1) step markers", ""),
)
SCENARIOS: dict[str, ScenarioInfo] = {info.name: info for info in CATALOGUE}
