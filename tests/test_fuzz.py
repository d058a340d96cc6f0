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
    """The Kineto JSON reader on byte-flipped, spliced and cut traces (benchmarks/fuzz.py's second
    target): host tables or a CaptureError, never another exception."""
    assert _fuzz_in_child("fuzz.run_kineto(inputs=300, seconds=30, seed=0)", timeout=180) >= 50
