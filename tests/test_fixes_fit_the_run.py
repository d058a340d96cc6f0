"""Fixes that fit the run (issue 35 item 2): a run without a GPU gets no fix that needs one, and a
fix the run has already applied is never the first one. Real runs made here (a PyTorch DataLoader
with and without workers, a JAX step jitted and op by op, all on the CPU) and the corpus' PyTorch
DataLoader traces; the Keras run_eagerly case is the demo's launch_bound run (tests/test_demo.py).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tb_gpuadvisor.checks import fixes
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.pipeline import analyse, load_session
from tb_gpuadvisor.multihost import analyze_session
from tb_gpuadvisor.render import render_text

TESTS = Path(__file__).resolve().parent
CORPUS = Path(os.environ.get("TB_GPUADVISOR_CORPUS", TESTS.parent.parent / "shared" / "corpus"))

# GPU-only mechanisms: the copy engine, pinned memory, CUDA decoding and graphs, reading values
# back from the GPU, TensorFlow's GPU launch threads.
GPU_ONLY = re.compile(r"copy engine|pin_memory|pinned|device=\"cuda\"|device_type=\"cuda\"|CUDA graph|"
                      r"on the GPU|TF_GPU_THREAD|non_blocking", re.IGNORECASE)


def _fix_texts(finding: dict) -> list[str]:
    return [f"{fix['text']}\n{fix['code']}" for fix in finding["fixes"]]


def _session(logdir: Path) -> dict:
    (ref,) = find_sessions(str(logdir))
    return analyze_session(ref)


def _finding(session: dict, check: str) -> dict:
    return next(f for f in session["findings"] if f["check"] == check)


def _facts(logdir: Path) -> fixes.RunFacts:
    (ref,) = find_sessions(str(logdir))
    return fixes.run_facts(analyse(load_session(ref)))


def test_cpu_pytorch_logdir_get_no_gpu_only_fix(torch_logdir):
    """Both runs have no GPU (model_ran_on cpu_only): every fix of every finding is free of GPU
    mechanisms, and the slow loader still hears of workers (in their CPU form) first."""
    for kind in ("slow", "fixed"):
        session = _session(torch_logdir / kind)
        assert session["trust"]["model_ran_on"] == "cpu_only"
        for finding in session["findings"]:
            for text in _fix_texts(finding):
                assert not GPU_ONLY.search(text), (kind, finding["check"], text)
    slow = _finding(_session(torch_logdir / "slow"), "input_bound")
    assert slow["severity"] in ("warning", "critical")
    assert "worker processes" in slow["fixes"][0]["text"] and "num_workers" in slow["fixes"][0]["code"]


def test_workers_on_is_not_told_to_add_workers_first(torch_logdir):
    """The fixed run's DataLoader already runs 4 workers (its waits are in
    _MultiProcessingDataLoaderIter.__next__) and still waits for input (each sample sleeps 1.5 ms:
    32 x 1.5 / 4 = 12 ms a batch). Its first input fix is making samples cheaper; the workers fix
    is only the follow-up, last."""
    assert _facts(torch_logdir / "fixed").loader_workers and not _facts(torch_logdir / "slow").loader_workers
    finding = _finding(_session(torch_logdir / "fixed"), "input_bound")
    if finding["severity"] not in ("warning", "critical"):
        pytest.skip("the workers kept up on this machine: nothing to fix")
    first = finding["fixes"][0]
    assert "cheaper" in first["text"] and "num_workers" not in first["code"]
    assert "already loads in worker processes" in finding["fixes"][-1]["text"]
    assert not any("num_workers=8" in fix["code"] for fix in finding["fixes"])


@pytest.mark.parametrize("folder, workers", [("num_workers_4", True), ("num_workers_0", False)])
def test_dataloader_workers_read_from_the_corpus_traces(folder, workers):
    """Hand check (gunzip | grep DataLoader): num_workers_4's trace waits in
    enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__ (6 calls, one per step),
    num_workers_0's in _SingleProcessDataLoaderIter.__next__. With workers on, the PyTorch input
    fixes start with cheaper samples and end with the workers follow-up, the GPU forms kept (it ran
    on an A100-class GPU)."""
    path = CORPUS / "pytorch-resnet50-dataloader" / folder
    if not path.exists():
        pytest.skip("corpus not available")
    facts = _facts(path)
    assert facts.loader_workers is workers and not facts.cpu_only
    offered = [fixes.PREFETCH, fixes.PARALLEL_MAP, fixes.CACHE_AND_INTERLEAVE, fixes.SYNTHETIC_INPUT_TEST]
    fitted = fixes.for_run(offered, "pytorch", facts)
    if workers:
        assert fitted[0] is fixes.TORCH_LIGHTER_DATASET and fitted[-1] is fixes.TORCH_FASTER_WORKERS
        assert fixes.TORCH_WORKERS not in fitted
    else:
        assert fitted[0] is fixes.TORCH_WORKERS and fixes.TORCH_PINNED_COPIES in fitted


JAX_OP_BY_OP = """
import sys, jax, jax.numpy as jnp
def train_step(w, x):
    loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w) ** 2))(w)
    return w - 0.1 * grad, loss
w, x = jnp.ones((256, 256)), jnp.ones((64, 256))
w, loss = train_step(w, x)
loss.block_until_ready()
with jax.profiler.trace(sys.argv[1]):
    for step in range(6):
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
            w, loss = train_step(w, x)
            loss.block_until_ready()
"""


@pytest.fixture(scope="module")
def jax_runs(tmp_path_factory) -> Path:
    """The same step on the CPU twice: jitted (tests/test_jax.py's writer) and op by op."""
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax not installed")
    root = tmp_path_factory.mktemp("jax_fit")
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS.parent), os.environ.get("PYTHONPATH")]))}
    for name, command in (("jit", [str(TESTS / "test_jax.py")]), ("eager", ["-c", JAX_OP_BY_OP])):
        done = subprocess.run([sys.executable, *command, str(root / name)], capture_output=True, text=True,
                              timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
    return root


def test_a_jitted_jax_step_is_not_told_to_jit(jax_runs):
    """Hand check (trace viewer): jitted, each annotated step holds PjitFunction(train_step) and
    nothing else jitted; op by op, each step calls ~30 jitted primitives (PjitFunction(mul),
    PjitFunction(dot_general), ...). The jit fix is never offered to the first and comes first
    for the second."""
    jitted, eager = _facts(jax_runs / "jit"), _facts(jax_runs / "eager")
    assert jitted.jitted_step and not jitted.op_by_op_step
    assert eager.op_by_op_step and not eager.jitted_step
    jit_text = fixes.JAX_JIT_STEP.text
    for finding in _session(jax_runs / "jit")["findings"]:
        assert all(fix["text"] != jit_text for fix in finding["fixes"]), finding["check"]
    eager_session = _session(jax_runs / "eager")
    assert _finding(eager_session, "host_overhead")["fixes"][0]["text"] == jit_text
    # JAX's step annotations are named as JAX calls them, not as a TensorFlow custom loop
    assert "steps from StepTraceAnnotation markers" in render_text({"sessions": [eager_session]})


def test_resolution_rules():
    """The table rules themselves: a CPU run drops GPU-only fixes and uses CPU forms; an eager fit's
    remedy leads whatever came before it."""
    cpu = fixes.RunFacts(cpu_only=True)
    offered = [fixes.PARALLEL_MAP, fixes.PREFETCH, fixes.SYNTHETIC_INPUT_TEST]
    assert fixes.for_run(offered, "pytorch", cpu) == [fixes.TORCH_WORKERS_ON_CPU,
                                                      fixes.TORCH_SYNTHETIC_INPUT_TEST_ON_CPU]
    assert fixes.for_run([fixes.GPU_PRIVATE_THREADS, fixes.STEPS_PER_EXECUTION], "tensorflow", cpu) == \
        fixes.for_framework([fixes.STEPS_PER_EXECUTION], "tensorflow")
    eager = fixes.for_run([fixes.STEPS_PER_EXECUTION, fixes.EAGER_FIT], "tensorflow", fixes.RunFacts())
    assert "run_eagerly" in eager[0].text and len(eager) == 2
    assert fixes.for_run([fixes.EAGER_FIT], "pytorch", fixes.RunFacts()) == []


def test_an_in_memory_dataset_is_not_told_to_read_files_in_parallel():
    """keras-t4's tf.data stages (Iterator::... events, read by hand) are TensorSlice, FromTensor,
    Zip, Concatenate, FlatMap, ForeverRepeat and ParallelMapV2: the data is in memory and no stage
    reads a file. Its input_bound warnings get the cache-after-map fix, never TFRecord/list_files."""
    path = CORPUS / "keras-t4"
    if not path.exists():
        pytest.skip("corpus not available")
    findings = [f for ref in find_sessions(str(path)) for f in analyze_session(ref)["findings"]
                if f["check"] == "input_bound" and f["fixes"]]
    assert findings
    for finding in findings:
        code = " ".join(fix["code"] for fix in finding["fixes"])
        assert "TFRecordDataset" not in code and "list_files" not in code and ".cache()" in code


def _threaded_trace(path: Path) -> None:
    """A PyTorch GPU run waiting 3 ms per 5.02 ms step on its DataLoader (kineto_trace: then its main
    thread, 7, launches 20 kernels in 0.26 ms), whose process also works on three more threads
    together through 3.3 to 5.0 ms into each step and, for 0.1 ms of that, on a fourth."""
    from synth_kineto import kineto_trace, write_trace
    trace = kineto_trace(input_us=3000, kernel_us=100)
    steps = [e["ts"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    extra = [(tid, "autograd::engine::evaluate_function: AddmmBackward0", ts + 3300, 1700)
             for ts in steps for tid in (8, 9, 10)]
    extra += [(11, "aten::copy_", ts + 4000, 100) for ts in steps]
    trace["traceEvents"] += [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
                             for tid, name, ts, dur in extra]
    write_trace(path / "run" / "w.1.pt.trace.json", trace)


def test_workers_leave_the_cores_the_capture_saw_busy(tmp_path, monkeypatch):
    """Hand check of the trace written: in each 5.02 ms step the main thread works 3.00 to 3.26 ms in
    (its launches), threads 8, 9 and 10 together 3.3 to 5.0 ms, thread 11 4.0 to 4.1 ms: three threads
    at work at once for 1.7 of every 5.02 ms (34%), four for 0.1 ms (2%, a blip under
    model.threads.BUSY_SHARE; counted once the share asked is 1%). The workers fix leaves those 3
    cores, and its count is still at least 1 on this machine."""
    _threaded_trace(tmp_path)
    assert _facts(tmp_path).busy_threads == 3
    fix = _finding(_session(tmp_path), "input_bound")["fixes"][0]
    assert fixes.spare_cores(3) in fix["code"] and fixes.SPARE_CORES not in fix["code"]
    assert "leaves 3 cores to the training process" in fix["text"]
    assert eval(fixes.spare_cores(3), {"os": os}) == max(1, min(8, (os.cpu_count() or 2) - 3))
    one = fixes.RunFacts(busy_threads=1)
    assert fixes.for_run([fixes.PREFETCH], "pytorch", one) == [fixes.TORCH_WORKERS]   # one thread: as written
    from tb_gpuadvisor.model import threads
    monkeypatch.setattr(threads, "BUSY_SHARE", 0.01)
    assert _facts(tmp_path).busy_threads == 4
