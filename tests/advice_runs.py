"""What the in-loop advice tests share: running their training child and comparing batch times, and
running the README's PyTorch examples and their fixed twins.

Each test file is also the script of its child process, which trains, writes a
``runs.json`` of what it saw and exits; the framework is never imported by pytest.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def run_child(script: str, root: Path, **env: str) -> dict:
    """Run SCRIPT with ROOT as its output folder and this checkout first on the path; its runs.json."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, script, str(root)], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": path, **env})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((root / "runs.json").read_text())


def median_outside(times: list[float], profiled: list[int]) -> float:
    """Median time between step starts, leaving out the first two (tracing, compilation), the
    lead-in step that starts the profiler, the profiled steps and the step that stops it."""
    skip = set(range(2)) | set(range(profiled[0] - 1, profiled[-1] + 2))
    kept = [t for i, t in enumerate(times) if i not in skip]
    assert len(kept) >= 15, "too few steps outside the capture to compare"
    return float(np.median(kept))


def assert_not_slower(runs: dict, advised: str, limit: float) -> None:
    """The ADVISED run's median step outside its capture is at most LIMIT slower than the slower of
    the runs without advice just before and after it (so a change in the machine's load during the
    test shows in one of them)."""
    profiled = runs[advised]["numbers"]
    with_advice = median_outside(runs[advised]["times"], profiled)
    without = max(median_outside(runs[name]["times"], profiled) for name in ("baseline_before", "baseline_after"))
    assert with_advice <= (1 + limit) * without, \
        f"median step {with_advice * 1e3:.1f} ms with the advice, {without * 1e3:.1f} ms without"


# One thread per training process: the machine is shared, and two threads of a small model
# fight over its cores with the DataLoader and the analysis.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# The line of the README's PyTorch examples that plants the slow input pipeline: their fixed
# twins are the same programs without it.
PLANTED_SLEEP = "        time.sleep(0.00"


def readme_example(marker: str) -> str:
    """The one Python code block of the README holding MARKER (say, its import line)."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    found = [code for code in blocks if marker in code]
    assert len(found) == 1, f"{len(found)} README examples hold {marker!r}"
    return found[0]


def fixed_twin(code: str) -> str:
    """CODE without its planted slow samples."""
    lines = code.splitlines(keepends=True)
    kept = [line for line in lines if not line.startswith(PLANTED_SLEEP)]
    assert len(kept) == len(lines) - 1, "the example plants no slow sample"
    return "".join(kept)


def run_example(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """CODE run as a script in CWD (its relative log dirs land there), this checkout first on the path."""
    cwd.mkdir(parents=True, exist_ok=True)
    (cwd / "example.py").write_text(code)
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "example.py"], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": path, **env})


def printed_checks(printed: str) -> list[str]:
    """The checks of the numbered findings in an in-loop advice printout, in order (notes above
    them, such as "the model ran on the CPU", left out)."""
    return re.findall(r"^  \d+\. \[[A-Z]+\] .*\n     saves about .*; check: (\w+)$", printed, re.M)


def example_runs(code: str, root: Path, call: str, as_written: bool = True,
                 **env: str) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """(result, folder) of the README example CODE with ``fail_on="critical"`` added to its helper's
    CALL ("slow_fail": it prints the advice, then raises), of its fixed twin ("fixed") and, with
    AS_WRITTEN, of CODE as written ("slow"). Callbacks whose framework takes long to start leave the
    last out: the failing run differs from it only in raising once the advice is printed."""
    assert code.count(call) == 1 and call.endswith(")"), call
    programs = {"slow_fail": code.replace(call, call[:-1] + ', fail_on="critical")'), "fixed": fixed_twin(code)}
    if as_written:
        programs["slow"] = code
    return {name: (run_example(program, root / name, **env), root / name) for name, program in programs.items()}


def assert_failed_on_input(result: subprocess.CompletedProcess) -> None:
    """The run ended with AdvisorFindingError naming the critical input finding."""
    assert result.returncode != 0
    raised = result.stderr.strip().splitlines()[-1]
    assert raised.startswith("tb_gpuadvisor.inloop.AdvisorFindingError: ") and "input_bound (critical)" in raised, raised
