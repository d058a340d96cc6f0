"""When launch overhead is worth a warning: kernel_launch's threshold, which unfused_ops also reads
(in a launch-bound step, fusing kernels saves their launches too)."""

from __future__ import annotations

# Percent of the step's device time lost to launch overhead.
LAUNCH_WARNING_PERCENT = 3.0
