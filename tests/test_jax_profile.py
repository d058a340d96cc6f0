"""``profile_steps`` around a real JAX loop: the right steps captured, the planted problem named.

JAX runs in one child process (this file executed as a script) that trains a small
jitted model on the CPU, with batches from a Python loader that sleeps (the planted
problem: the host keeps the device waiting), without and with ``profile_steps``,
and writes what it saw to a JSON file. The tests skip when JAX is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from advice_runs import assert_not_slower, run_child

FEATURES, HIDDEN, BATCH = 64, 256, 64
LOADER_S = 0.03            # per batch: many times the jitted step on a CPU
STEPS, TIMED_STEPS = 5, 40
WARMUP = 3
OVERHEAD_LIMIT = 0.10      # allowed growth of the median step time outside the capture


def _loop(steps: int, advisor=None, hook: bool = True) -> list[float]:
    """Train for STEPS steps (marked by ADVISOR's step hook or its ``step()`` context); the seconds
    between step starts."""
    import time

    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)

    @jax.jit
    def train_step(params, x, y):
        def loss(p):
            return jnp.mean((jnp.tanh(x @ p[0]) @ p[1] - y) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        return [p - 0.01 * g for p, g in zip(params, grads)], value

    def next_batch():
        time.sleep(LOADER_S)
        return rng.normal(size=(BATCH, FEATURES)).astype("float32"), rng.normal(size=(BATCH, 1)).astype("float32")

    params = [jnp.full((FEATURES, HIDDEN), 0.01, jnp.float32), jnp.full((HIDDEN, 1), 0.01, jnp.float32)]
    step_fn = advisor.wrap(train_step) if advisor is not None and hook else train_step
    starts = []
    for _ in range(steps):
        starts.append(time.perf_counter())
        if advisor is not None and not hook:
            with advisor.step():
                params, _ = train_step(params, *next_batch())
        else:
            params, _ = step_fn(params, *next_batch())
    jax.block_until_ready(params)
    return np.diff(starts).tolist()


def _advised(log_dir: Path, loop_steps: int, hook: bool, **options) -> dict:
    import contextlib
    import io

    from tb_gpuadvisor.jax import profile_steps

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), profile_steps(str(log_dir), **options) as advisor:
        times = _loop(loop_steps, advisor, hook)
    return {"times": times, "printed": printed.getvalue(), "numbers": advisor.window.profiled_numbers,
            "settled_after": advisor.window.clock.done, "session_dir": advisor.window.session_dir,
            "report": advisor.report, "problem": advisor.window.problem}


def _write_runs(out: Path) -> None:
    # The advised run is timed between two runs without it, so a change in the machine's load
    # during the test shows in one of them.
    runs = {"baseline_before": {"times": _loop(TIMED_STEPS)},
            "hook": _advised(out / "hook", TIMED_STEPS, True, steps=STEPS),
            "baseline_after": {"times": _loop(TIMED_STEPS)},
            "context": _advised(out / "context", 12, False, steps=STEPS, warmup_steps=WARMUP)}
    (out / "runs.json").write_text(json.dumps(runs))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax not installed")
    return run_child(__file__, tmp_path_factory.mktemp("jax_advisor"), JAX_PLATFORMS="cpu")


def test_step_annotations_are_the_steps_of_the_capture(runs: dict):
    context = runs["context"]
    # Warm-up, one unmarked lead-in step, then the profiled steps.
    assert context["numbers"] == list(range(WARMUP + 1, WARMUP + 1 + STEPS))
    session = context["report"]["sessions"][0]
    assert session["framework"] == "jax"
    assert session["steps"]["source"] == "custom_loop" and session["steps"]["marker"] == "train"
    assert session["steps"]["numbers"] == context["numbers"]


def test_auto_warmup_and_step_hook(runs: dict):
    hook = runs["hook"]
    assert hook["problem"] is None
    assert hook["numbers"][0] == hook["settled_after"] + 1 >= 3
    steps = hook["report"]["sessions"][0]["steps"]
    assert steps["count"] == STEPS and steps["numbers"] == hook["numbers"]
    # The loader's sleep is inside each step: a step is start to start.
    assert steps["min_ms"] >= LOADER_S * 1e3


def test_printed_report_names_the_slow_loader(runs: dict):
    printed = runs["hook"]["printed"]
    assert "1. [CRITICAL]" in printed and "check: host_overhead" in printed
    top = printed[printed.index("1. ["):printed.index("2. [") if "2. [" in printed else None]
    assert "sleep" in top and "next_batch" in top
    session_dir = runs["hook"]["session_dir"]
    assert Path(session_dir).parent.parent.name == "plugins"
    assert f"capture: {session_dir}" in printed


def test_the_helpers_own_frames_and_sync_are_no_evidence_or_advice(runs: dict):
    """Issue 26.9: with the step hook, JAX's Python tracer records the helper's frames
    ("$jax.py:<line> step", "$inloop.py:<line> begin", ...) and the block_until_ready it inserts;
    the user's loop calls neither. They are not evidence, and the advice does not tell the user to
    stop calling block_until_ready; the user's own loader still is the top evidence."""
    from tb_gpuadvisor.checks.helper_frames import helper_frame_names

    frames, hooks = helper_frame_names()
    session = runs["hook"]["report"]["sessions"][0]
    evidence = [ev["name"] for f in session["findings"] for ev in f["evidence"]]
    assert not [name for name in evidence if name in frames or name.endswith(" block_until_ready")], evidence
    host = next(f for f in session["findings"] if f["check"] == "host_overhead")
    assert host["evidence"][0]["name"].endswith(" next_batch")
    texts = " ".join(fix["text"] for f in session["findings"] for fix in f["fixes"])
    assert "block_until_ready" not in texts
    # The names are the tracer's own: the hook's frame is in the capture under exactly this name.
    from tb_gpuadvisor.input.discovery import find_sessions
    from tb_gpuadvisor.pipeline import load_session

    (ref,) = find_sessions(runs["hook"]["session_dir"])
    names = set(load_session(ref).hosts[0].activity.names)
    (hook,) = hooks
    assert hook.startswith("$jax.py:") and hook.endswith(" step") and hook in names
    assert len(frames & names) >= 3, sorted(frames & names)


def test_training_outside_the_capture_is_not_slower(runs: dict):
    assert_not_slower(runs, "hook", OVERHEAD_LIMIT)


if __name__ == "__main__":
    _write_runs(Path(sys.argv[1]))
