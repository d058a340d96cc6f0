"""What a capture shows about the tf.data pipeline, and which of it the user wrote.

tf.data rewrites the pipeline it is given: it fuses a ``map`` followed by ``batch`` into
one ``MapAndBatch`` stage (parallel or not, depending on what the user asked for), and it
can insert a ``prefetch`` at the end (the ``inject_prefetch`` optimisation) or tune buffer
sizes itself. So the iterator stage names (``Iterator::Root::Prefetch::MapAndBatch``) say
what ran, not what the user's code did. Recent TensorFlow versions record each stage's
dataset in a ``name`` stat, which does tell them apart:

- ``PrefetchDataset:8``: a ``prefetch`` the user wrote; ``inject/prefetch_...``: one tf.data
  inserted.
- ``ParallelMapDatasetV2:6`` (alone or inside ``fused(...)``): a ``map`` with
  ``num_parallel_calls``; ``MapDataset:2``: a plain, sequential ``map``, even when tf.data
  fused it with ``batch`` into a ``MapAndBatch`` stage (which then runs with parallelism 1).

Captures without that stat (older TensorFlow) fall back to the stage names, and the
evidence says the origin cannot be told.

The user's own slow work is what their functions (``map``, ``filter``, ``interleave``) run:
framework ops executed on tf.data's threads, such as ``EagerPyFunc`` for a
``tf.py_function`` or a ``DecodeJpeg``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tb_gpuadvisor.model import kernels
from tb_gpuadvisor.model import intervals as iv
from tb_gpuadvisor.timeline import HostActivity, HostModel
from tb_gpuadvisor.kinds import HostEventKind, InputStage

# What a stage or wait is when its adapter read nothing in its name.
_UNREAD = InputStage()


@dataclass
class Stage:
    name: str
    self_ps: int
    thread: str
    facts: InputStage = _UNREAD
    python: str | None = None       # a user op: the Python API that made it ("tf.py_function")


@dataclass
class Pipeline:
    """What the capture shows about the tf.data pipeline.

    ``prefetches``, ``parallel`` and ``sequential_map`` describe the user's code when
    ``origin_known``; otherwise they describe the stages that ran, whoever added them.
    """

    stages: list[Stage]          # by self time, longest first
    prefetches: bool
    parallel: bool               # some map/batch/interleave stage runs in parallel
    sequential_map: bool         # a plain map exists
    origin_known: bool = False
    inserted: list[str] = field(default_factory=list)   # what tf.data added or rewrote, for the user
    user_ops: list[Stage] = field(default_factory=list)  # ops the user's functions ran, slowest first

    @property
    def slowest(self) -> Stage | None:
        for stage in self.stages:
            if not stage.facts.buffer:
                return stage
        return self.stages[0] if self.stages else None

    def describe(self) -> str:
        """One line for the evidence: what the user's code does, and what tf.data added."""
        if not self.origin_known:
            return (f"stages seen: prefetch: {'yes' if self.prefetches else 'no'}; parallel map/batch: "
                    f"{'yes' if self.parallel else 'no'}; this capture does not record which stages your "
                    "code wrote and which tf.data inserted")
        text = (f"your code: prefetch: {'yes' if self.prefetches else 'no'}; parallel map: "
                f"{'yes' if self.parallel else 'no' if self.sequential_map else 'no map'}")
        return text + (f"; added by tf.data: {', '.join(self.inserted)}" if self.inserted else "")


def _facts(activity: HostActivity, idx: np.ndarray) -> dict[str, InputStage]:
    """What the adapter read in the name of each stage of the rows IDX."""
    return {activity.names[i]: activity.stages.get(activity.names[i], _UNREAD) for i in np.unique(activity.name[idx])}


def _stage_self_times(activity: HostActivity, windows: iv.Intervals, idx: np.ndarray,
                      facts: dict[str, InputStage]) -> list[Stage]:
    """Self time of every stage: its time on a thread minus its descendants nested in it there."""
    totals: dict[str, tuple[int, str]] = {}
    for thread in np.unique(activity.thread[idx]):
        on_thread = idx[activity.thread[idx] == thread]
        name_ids = activity.name[on_thread]
        thread_names = {int(i): activity.names[int(i)] for i in np.unique(name_ids)}
        for name_id, name in thread_names.items():
            own = on_thread[name_ids == name_id]
            descendant_ids = [i for i, other in thread_names.items() if name in facts[other].ancestors]
            children = on_thread[np.isin(name_ids, descendant_ids)]
            own_set = iv.intersect(iv.union(activity.start_ps[own], activity.end_ps[own]), windows)
            child_set = iv.union(activity.start_ps[children], activity.end_ps[children])
            self_ps = iv.total(iv.subtract(own_set, child_set))
            previous, _ = totals.get(name, (0, ""))
            totals[name] = (previous + self_ps, activity.threads[int(thread)])
    return sorted((Stage(n, ps, t, facts[n]) for n, (ps, t) in totals.items() if ps > 0), key=lambda s: -s.self_ps)


def _user_ops(activity: HostActivity, windows: iv.Intervals) -> list[Stage]:
    """Framework ops run on tf.data threads (the user's dataset functions), by thread time."""
    threads = sorted(activity.input_threads)
    rows = np.flatnonzero((activity.kind == HostEventKind.FRAMEWORK_OP) & np.isin(activity.thread, threads))
    totals: dict[str, tuple[int, str]] = {}
    for name_id in np.unique(activity.name[rows]):
        own = rows[activity.name[rows] == name_id]
        op_type = kernels.op_type(activity.names[int(name_id)])
        # Thread time: parallel calls on several threads add up.
        busy = sum(iv.total(iv.intersect(iv.union(activity.start_ps[on], activity.end_ps[on]), windows))
                   for on in (own[activity.thread[own] == t] for t in np.unique(activity.thread[own])))
        previous, _ = totals.get(op_type, (0, ""))
        totals[op_type] = (previous + busy, activity.threads[int(activity.thread[own[0]])])
    return sorted((Stage(n, ps, t, python=kernels.python_api(n)) for n, (ps, t) in totals.items() if ps > 0),
                  key=lambda s: -s.self_ps)


def user_facts(stages: dict[str, InputStage]) -> tuple[bool, bool, bool, list[str]]:
    """(prefetches, parallel map, sequential map, what tf.data inserted) from the stages' origins."""
    origins = [stages[name].origin for name in sorted(stages) if stages[name].origin is not None]
    inserted = [o.inserted for o in origins if o.inserted]
    return (any(o.prefetch for o in origins), any(o.parallel for o in origins),
            any(o.sequential_map for o in origins), list(dict.fromkeys(inserted)))


def pipeline_stages(host: HostModel, windows: iv.Intervals, read_origin: bool = False) -> Pipeline:
    """The pipeline's stages inside WINDOWS; with READ_ORIGIN, also which ones the user wrote
    (from the stages' dataset names) and the user's own slowest ops in them."""
    activity = host.activity
    idx = np.flatnonzero(activity.kind == HostEventKind.INPUT_STAGE)
    facts = _facts(activity, idx)
    stages = _stage_self_times(activity, windows, idx, facts)
    seen = Pipeline(stages=stages, prefetches=any(f.prefetch for f in facts.values()),
                    parallel=any(f.parallel for f in facts.values()),
                    sequential_map=any(f.sequential_map for f in facts.values()))
    if not (read_origin and stages):
        return seen
    seen.user_ops = _user_ops(activity, windows)
    if not any(f.origin is not None for f in facts.values()):
        return seen
    prefetches, parallel, sequential, inserted = user_facts(facts)
    return Pipeline(stages=stages, prefetches=prefetches, parallel=parallel, sequential_map=sequential,
                    origin_known=True, inserted=inserted, user_ops=seen.user_ops)
