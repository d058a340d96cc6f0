"""Damaged captures never crash the analysis: random byte flips, cuts and splices.

The C decoder walks untrusted bytes, so a mutation must end in a clear error entry or
a (possibly odd) report, never an exception or a crash of the process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from synth import build_training_session, truncated, write_session

from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.multihost import analyze_session
from tb_gpuadvisor.input.xplane.decode import has_fast_decoder

_SCRIPT = """
import random, sys, tempfile, pathlib
sys.path.insert(0, {tests!r})
from synth import build_training_session, write_session
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.multihost import analyze_session
data = bytearray(build_training_session(steps=3, gpus=2, memcpy_frac=0.05).space.SerializeToString())
for seed in range({start}, {stop}):
    rng = random.Random(seed)
    damaged = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        damaged[rng.randrange(len(damaged))] = rng.randrange(256)
    if seed % 3 == 0:
        cut = rng.randrange(len(damaged))
        damaged = damaged[:cut] + damaged[cut + rng.randint(1, 64):]
    with tempfile.TemporaryDirectory() as tmp:
        write_session(tmp, "run", "s", {{"h": bytes(damaged)}})
        (ref,) = find_sessions(tmp)
        session = analyze_session(ref)
        assert isinstance(session["errors"], list) and "findings" in session
print("ok")
"""


def test_mutated_captures_give_errors_or_reports_never_crashes():
    # A child process, so that a crash in the C decoder fails the test instead of killing pytest.
    script = _SCRIPT.format(tests=str(Path(__file__).parent), start=0, stop=120)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9])
def test_cut_capture_reports_the_host_error(tmp_path, keep):
    data = build_training_session(steps=3).space.SerializeToString()
    write_session(tmp_path, "run", "s", {"h": truncated(data, keep)})
    (ref,) = find_sessions(str(tmp_path))
    session = analyze_session(ref)
    assert session["errors"] and session["errors"][0]["host"] == "h"



def _fuzz_in_child(call: str, timeout: int) -> int:
    """Inputs tried by benchmarks/fuzz.py's CALL in a child process (a crash in a decoder fails the
    test instead of killing pytest); fails the test on any failing input."""
    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    script = (f"import sys; sys.path.insert(0, {str(bench)!r}); import fuzz; "
              f"tried, failures = {call}; "
              "print('\\n'.join(failures[:5])); print(tried, len(failures))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    tried, failed = map(int, result.stdout.split()[-2:])
    assert failed == 0, result.stdout[-3000:]
    return tried

def test_both_decoders_agree_on_mutated_captures():
    """Differential fuzzing (benchmarks/fuzz.py): same columns, or both a CaptureError.

    A bounded batch here; `python benchmarks/fuzz.py --seconds 600` runs longer.
    A child process, so a crash in the C decoder fails the test instead of killing pytest.
    """
    tried = _fuzz_in_child("fuzz.run(inputs=4000, seconds=20, seed=0)", timeout=120)
    assert tried > 500 or not has_fast_decoder()


def test_mutated_pytorch_traces_give_tables_or_a_capture_error():
    """The Kineto JSON reader on mutated windows of the corpus traces and synthetic ones
    (benchmarks/fuzz.py's second target, kineto_mutate): on every decoder host tables or a
    CaptureError, never another exception, and the decoders agree."""
    assert _fuzz_in_child("fuzz.run_kineto(inputs=300, seconds=30, seed=0)", timeout=180) >= 50


def _kernel_trace(**changes) -> dict:
    event = {"ph": "X", "cat": "kernel", "name": "void gemm<float>()", "pid": 0, "tid": 7, "ts": 1000.5, "dur": 4,
             "args": {"device": 0, "stream": 7, "correlation": 12, "bytes": 64}}
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 999, "dur": 1,
              "args": {"correlation": 12}}
    for key, value in changes.items():
        (event["args"] if key in ("device", "stream", "correlation", "bytes") else event)[key] = value
    return {"traceEvents": [launch, event]}


def _text(trace: dict) -> bytes:
    import json

    return json.dumps(trace).encode()


_KERNEL = _text(_kernel_trace())


@pytest.mark.parametrize("data", [
    _KERNEL.replace(b'"ts": 1000.5', b'"ts": NaN'),
    _KERNEL.replace(b'"stream": 7', b'"stream": Infinity'),
    _KERNEL.replace(b'"ts": 1000.5', b'"ts": 1e400'),
    _KERNEL.replace(b'"bytes": 64', b'"bytes": -9223372036854775809'),
    _KERNEL.replace(b'"bytes": 64', b'"bytes": 123456789012345678901234567890'),
    _text(_kernel_trace(name=2**70, tid=-2**64)),
    _text(_kernel_trace(ts="1000", dur=[1], args="none")),
    _text(_kernel_trace(correlation={"a": 1}, device=True, stream=None)),
    _text(_kernel_trace(device="12", tid=-2**63 - 1, pid=2**63)),
    _KERNEL.replace(b'"ts": 1000.5', b'"ts": 1, "ts": 2').replace(b'"traceEvents"', b'"traceEvents": [], "traceEvents"'),
    *(_KERNEL.replace(b'"bytes": 64', b'"bytes": 64, "deep": ' + b"[" * depth + b"]" * depth)
      for depth in (100, 1000, 1019, 1020, 1021, 5000)),
    _KERNEL.replace(b"gemm", b"ge\xffmm"),
    _KERNEL.replace(b'"bytes": 64', b'"bytes": 64, "note": "\xed\xa0\x80"'),
    _KERNEL.replace(b'"bytes": 64', b'"bytes": 64, "note": "\\ud800"'),
    _KERNEL.replace(b'"bytes": 64', b'"bytes": 64, "note": "\\ud83d\\ude00"'),
    _text(_kernel_trace(name="<script>" * 300_000)),
    _text({"traceEvents": [*_kernel_trace()["traceEvents"], {"ph": "i", "name": "[memory]", "ts": 1e300,
                                                             "args": {"Device Type": 1, "Device Id": 0}}]}),
    _KERNEL[:-40],
    _text(_kernel_trace())[:-2] + b"]",
], ids=["nan", "infinity", "1e400", "below-int64", "beyond-u64", "big-name-tid", "types", "arg-types", "numeric-text-and-ids-past-int64",
        "duplicate-keys", "deep-100", "deep-1000", "deep-1019", "deep-1020", "deep-1021", "deep-5000",
        "not-utf8", "encoded-surrogate", "lone-surrogate", "surrogate-pair", "megabyte-name", "memory-event-far-away", "cut", "wrong-close"])
def test_both_json_decoders_agree_on_hostile_traces(data):
    """Each class of issue 34's fuzz target, once, on both decoders (msgspec with orjson, and
    msgspec alone with the standard library): the same columns or both a CaptureError, never
    another exception (benchmarks/fuzz.py's kineto_problem)."""
    import fuzz     # benchmarks/ is on the path (conftest)

    assert fuzz.kineto_problem(data) is None
