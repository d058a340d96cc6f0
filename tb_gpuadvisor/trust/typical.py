"""Which steps are typical, and what one step alone can say.

Compilation, warm-up, autotuning and checkpoints make a few steps far slower than the
rest; averaged in, they turn a one-off cost into a per-step "problem". Such steps are
listed and left out. A capture of one step (the Keras callback's default) cannot be
compared with others, so that step is judged on its own evidence: kernels cuDNN or XLA
run only while autotuning, and compilation or tracing on the host, mark it as atypical.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tb_gpuadvisor.model.kernels import name_mask
from tb_gpuadvisor.timeline import PS_PER_MS, SessionModel, Steps
from tb_gpuadvisor.kinds import DeviceEventKind, HostEventKind
from tb_gpuadvisor.vocab import tensorflow, xla

# A step this many times the median of the others is not typical (compile, warm-up, checkpoint).
OUTLIER_RATIO = 2.5
# At most this share of the steps is ever left out as outliers: beyond it, slow steps are the norm.
MAX_OUTLIER_SHARE = 0.34

# A convolution runs a handful of kernels; dozens in one step means candidates were timed.
AUTOTUNE_KERNELS_PER_OP = 20
ATYPICAL_SHARE = 0.05


@dataclass
class Outlier:
    index: int
    reason: str


def outliers(steps: Steps, keep: np.ndarray) -> list[Outlier]:
    """Steps among KEEP far above the median of the others."""
    idx = np.flatnonzero(keep)
    durations = steps.duration_ps[idx].astype(float)
    out: list[Outlier] = []
    if idx.size >= 3:
        median = float(np.median(durations))
        slow = np.flatnonzero(durations > OUTLIER_RATIO * median)
        if 0 < slow.size <= MAX_OUTLIER_SHARE * idx.size:
            out = [Outlier(int(idx[i]), f"{durations[i] / PS_PER_MS:.2f} ms, {durations[i] / median:.1f}x the "
                           f"median step ({median / PS_PER_MS:.2f} ms): compilation, warm-up or a one-off stall")
                   for i in slow]
    elif idx.size == 2 and durations[0] > OUTLIER_RATIO * durations[1]:
        out = [Outlier(int(idx[0]), f"the first step took {durations[0] / PS_PER_MS:.2f} ms, "
                       f"{durations[0] / durations[1]:.1f}x the second: warm-up or compilation")]
    return out


def steps_per_marker(steps: Steps) -> int:
    """N when consecutive step markers advance their step number by N > 1 every time
    (Keras ``steps_per_execution``, or a loop that runs N steps per marked call)."""
    if len(steps) < 2:
        return 1
    advance = np.diff(np.sort(steps.number))
    if advance.size and int(advance.min()) > 1 and np.all(advance == advance[0]):
        return int(advance[0])
    return 1


def single_step_evidence(model: SessionModel, steps: Steps, first_use: bool = True) -> list[str]:
    """Reasons one captured step is not a typical step (empty when it looks clean); FIRST_USE:
    False when set-up was measured already (``warmup``), so it is not said twice."""
    if len(steps) != 1:
        return []
    lo, hi = int(steps.start_ps[0]), int(steps.end_ps[0])
    step_ps = max(hi - lo, 1)
    reasons: list[str] = []
    autotune_ps, autotune_n, per_conv = 0, 0, 0
    for dev in model.devices:
        inside = (dev.start_ps >= lo) & (dev.start_ps < hi) & (dev.kind == DeviceEventKind.KERNEL)
        checker = inside & name_mask(dev.names, lambda n: bool(xla.AUTOTUNE_KERNEL.search(n)))[dev.name]
        autotune_n += int(checker.sum())
        autotune_ps += int(dev.dur_ps[checker].sum())
        conv = inside & (dev.op >= 0)
        if conv.any() and dev.ops:
            conv &= name_mask(dev.ops, lambda o: bool(tensorflow.CONV_OP.search(o)))[np.clip(dev.op, 0, None)]
            if conv.any():
                per_conv = max(per_conv, int(np.bincount(dev.op[conv]).max()))
    if autotune_n:
        reasons.append(f"{autotune_n} autotuning checker kernels ({autotune_ps / PS_PER_MS:.1f} ms) ran in it: "
                       "cuDNN/XLA was still timing candidate algorithms")
    elif per_conv >= AUTOTUNE_KERNELS_PER_OP:
        reasons.append(f"one convolution ran {per_conv} kernels in it: cuDNN was trying algorithms (autotuning)")
    compile_ps = 0
    for host in model.hosts:
        act = host.activity
        inside = (act.start_ps >= lo) & (act.start_ps < hi)
        compiling = inside & name_mask(act.names, lambda n: bool(xla.COMPILE.search(n)))[act.name]
        compile_ps += int(act.dur_ps[compiling].sum())
    if compile_ps > ATYPICAL_SHARE * step_ps:
        reasons.append(f"{compile_ps / PS_PER_MS:.1f} ms of tracing or compilation ran in it")
    first_use_ps, first_use_n = 0, 0
    for host in model.hosts:
        act = host.activity
        first = (act.kind == HostEventKind.FIRST_USE) & (act.start_ps >= lo) & (act.start_ps < hi)
        first_use_n += int(first.sum())
        first_use_ps += int(act.dur_ps[first].sum())
    if first_use and first_use_ps > ATYPICAL_SHARE * step_ps:
        reasons.append(f"{first_use_ps / PS_PER_MS:.1f} ms of first-use set-up ran in it ({first_use_n} lazy kernel "
                       "loads, kernel attribute queries and first launches that loaded their kernel): it is a "
                       "warm-up iteration, so its launch and host times are not those of a typical step")
    return reasons
