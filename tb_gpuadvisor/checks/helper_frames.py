"""The in-loop helpers' own work in a capture: profiler overhead, not the user's.

``tb_gpuadvisor.jax.profile_steps`` (and the Keras callback) run inside the loop they profile,
so JAX's Python tracer records their frames ("$jax.py:85 step", "$inloop.py:147 begin") and
what they call: the step marker, ``stop_trace``, and the ``block_until_ready`` the step hook
inserts so that each profiled step holds its device work. None of that is in the user's code:
it is left out of evidence and advice, as the Keras callback's trace export is.

The frames are named the way the Python tracer names them, "$<file>:<first line> <function>",
from the helpers' own source (read, not imported: this stage never loads the training side).
"""

from __future__ import annotations

import ast
import functools
import os

import numpy as np

from tb_gpuadvisor.arrays import kept_mask
from tb_gpuadvisor.model.kernels import named_events
from tb_gpuadvisor.timeline import HostActivity
from tb_gpuadvisor.vocab import jax
from tb_gpuadvisor.stages import Memo

# What this stage derives from the tables and asks for again (see stages.Memo).
_MEMO = Memo()

_HELPERS = ("jax.py", "inloop.py", "keras.py")
# The step hook (``ProfileSteps.wrap``'s inner function) calls the user's step: only its own
# calls to block_until_ready are the helper's, the rest of what it runs is the user's.
_HOOK = ("jax.py", "wrap")


def _frames(source: str, file: str) -> tuple[set[str], set[str]]:
    """Tracer names of every function and lambda in SOURCE; and of the step hook's inner function."""
    frames: set[str] = set()
    hooks: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # A decorated function's code starts at its first decorator.
            line = min([node.lineno] + [d.lineno for d in node.decorator_list])
            frames.add(f"${file}:{line} {node.name}")
            if (file, node.name) == _HOOK:
                hooks |= {f"${file}:{min([f.lineno] + [d.lineno for d in f.decorator_list])} {f.name}"
                          for f in node.body if isinstance(f, ast.FunctionDef)}
        elif isinstance(node, ast.Lambda):
            frames.add(f"${file}:{node.lineno} <lambda>")
    return frames, hooks


@functools.lru_cache(maxsize=1)
def helper_frame_names() -> tuple[frozenset[str], frozenset[str]]:
    """(every helper frame name, the step hook's frame names)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frames: set[str] = set()
    hooks: set[str] = set()
    for file in _HELPERS:
        with open(os.path.join(package, file), encoding="utf-8") as handle:
            found, hook = _frames(handle.read(), file)
        frames |= found
        hooks |= hook
    return frozenset(frames), frozenset(hooks)


def _inside(act: HostActivity, outer: np.ndarray) -> np.ndarray:
    """Events on the same thread as one of the OUTER events and within its span."""
    out = np.zeros(len(act.start_ps), bool)
    end = act.start_ps + act.dur_ps
    for thread in np.unique(act.thread[outer]):
        frames = outer[act.thread[outer] == thread]
        on_thread = act.thread == thread
        for lo, hi in zip(act.start_ps[frames], end[frames]):
            out |= on_thread & (act.start_ps >= lo) & (end <= hi)
    return out


def helper_overhead(act: HostActivity) -> np.ndarray:
    """Per event of ACT: the helpers' own work (their frames and what they call, the hook's
    block_until_ready included; not the user's step the hook calls). Kept in ``_MEMO.of(act)``."""
    cached = _MEMO.of(act).get("helper_overhead")
    if cached is not None:
        return cached
    frames, hooks = helper_frame_names()
    helper = named_events(act, "helper_frame", frames.__contains__)
    hook = named_events(act, "helper_hook", hooks.__contains__)
    out = helper.copy()
    if helper.any():
        out |= _inside(act, np.flatnonzero(helper & ~hook))
        syncs = np.flatnonzero(named_events(act, "sync_call", jax.BLOCK_UNTIL_READY_FRAME.match))
        out[syncs[_parents_are(act, syncs, hook)]] = True
    out = _MEMO.of(act)["helper_overhead"] = kept_mask(out)
    return out


def _parents_are(act: HostActivity, rows: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Per row in ROWS: whether its caller (the innermost Python frame around it on its thread;
    step markers and other annotations span frames without calling them) is one of PARENT."""
    end = act.start_ps + act.dur_ps
    python = named_events(act, "python_frame", lambda name: name.startswith("$"))
    found = np.zeros(len(rows), bool)
    for i, row in enumerate(rows):
        around = np.flatnonzero(python & (act.thread == act.thread[row]) & (act.start_ps <= act.start_ps[row])
                                & (end >= end[row]))
        around = around[around != row]
        if around.size:
            found[i] = bool(parent[around[np.argmax(act.start_ps[around])]])
    return found


def user_syncs(act: HostActivity) -> bool:
    """Whether the user's own code called block_until_ready inside the steps."""
    syncs = named_events(act, "sync_call", jax.BLOCK_UNTIL_READY_FRAME.match) & (act.step >= 0)
    return bool((syncs & ~helper_overhead(act)).any())
