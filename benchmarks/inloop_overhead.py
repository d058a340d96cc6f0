"""What the PyTorch in-loop helper costs a training step outside the steps it profiles (issue 42).

A small MLP trains on batches made once in memory (no input wait), on the GPU where there is one,
else on the CPU with one thread. Each round trains the same number of steps twice, in turn:
without any helper, and inside ``tb_gpuadvisor.torch.profile_steps`` (a fixed warm-up of 2
steps, 3 profiled ones; its analysis process then reads the capture while training goes on).
Steps are timed start to start, in two parts of each run (the same steps in both runs): the
72 steps just after the capture stops, while the analysis process reads it, and the last 140,
after it is done (the helper's run waits for it before them). Each part's median is taken, of wall time and of this process's CPU time
(which a shared machine's load moves far less); the result is the median over rounds of
(with helper / without) - 1.

A second measurement times ``advisor.step()`` alone once the capture is over, the only code
the helper runs in a step it does not profile.

    python benchmarks/inloop_overhead.py [--rounds 5]

Results go to ``results/inloop_overhead.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
WARMUP, PROFILED = 2, 3
STEPS = 300
# Steps compared: those just after the capture (its warm-up, lead-in, profiled steps and the step
# that stops it left out), while the analysis process reads it; and the last ones, after it is done.
SKIP = WARMUP + 1 + PROFILED + 2
PARTS = {"during": (SKIP, SKIP + 72), "after": (STEPS - 140, STEPS)}


def _setup():
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(16, 1024, device=device), torch.randint(10, (16,), device=device)) for _ in range(8)]

    def train_step(i: int) -> None:
        x, y = batches[i % len(batches)]
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()    # the step's time is its device work too

    return train_step, device


def _run(train_step, steps: int, log_dir: str | None) -> tuple[list[float], list[float]]:
    """(wall, CPU) seconds between step starts, with the helper around the loop when LOG_DIR is
    given. CPU time is this process's: on a shared machine it moves far less with the others' load
    than wall time (the helper's analysis runs in a process of its own)."""
    from tb_gpuadvisor.torch import profile_steps

    starts = []
    helper = (profile_steps(log_dir, steps=PROFILED, warmup_steps=WARMUP, print_report=False)
              if log_dir else contextlib.nullcontext())
    with contextlib.redirect_stdout(io.StringIO()), helper as advisor:
        for i in range(steps):
            if i == PARTS["after"][0] - 1 and advisor is not None:
                while advisor.window.analysis.running():    # (an untimed pause, between the parts)
                    time.sleep(0.05)
            starts.append((time.perf_counter(), time.process_time()))
            train_step(i)
            if advisor is not None:
                advisor.step()
        starts.append((time.perf_counter(), time.process_time()))
    pairs = list(zip(starts, starts[1:]))
    return [b[0] - a[0] for a, b in pairs], [b[1] - a[1] for a, b in pairs]


def _step_call_ns(calls: int = 200_000) -> float:
    """Nanoseconds per ``advisor.step()`` once the capture is over (analysis finished)."""
    from tb_gpuadvisor.torch import profile_steps

    with tempfile.TemporaryDirectory() as log_dir, contextlib.redirect_stdout(io.StringIO()):
        advisor = profile_steps(log_dir, steps=1, warmup_steps=0, print_report=False)
        for _ in range(4):
            advisor.step()
        advisor.finish()
        start = time.perf_counter_ns()
        for _ in range(calls):
            advisor.step()
        return (time.perf_counter_ns() - start) / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    train_step, device = _setup()
    _run(train_step, 20, None)          # first-use costs out of the way
    rounds = []
    with tempfile.TemporaryDirectory() as root:
        for r in range(args.rounds):
            runs = {"without": _run(train_step, STEPS, None),
                    "with": _run(train_step, STEPS, os.path.join(root, f"run{r}"))}
            row = {}
            for part, (lo, hi) in PARTS.items():
                for name, (wall, cpu) in runs.items():
                    row[f"{part}_{name}_ms"] = statistics.median(wall[lo:hi]) * 1e3
                    row[f"{part}_{name}_cpu_ms"] = statistics.median(cpu[lo:hi]) * 1e3
            rounds.append(row)
            print(f"round {r}: " + "; ".join(
                f"{part} wall {row[f'{part}_without_ms']:.2f}/{row[f'{part}_with_ms']:.2f} ms, "
                f"CPU {row[f'{part}_without_cpu_ms']:.2f}/{row[f'{part}_with_cpu_ms']:.2f} ms" for part in PARTS),
                file=sys.stderr)
    result = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "device": device,
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}",
              "steps_per_run": STEPS, "parts": PARTS, "rounds": rounds, "step_call_ns": _step_call_ns(),
              "median_overhead": {f"{part}_{clock}": statistics.median(
                  r[f"{part}_with_{clock}ms"] / r[f"{part}_without_{clock}ms"] - 1 for r in rounds)
                  for part in PARTS for clock in ("", "cpu_")}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "inloop_overhead.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# In-loop helper overhead, {result['date']} ({device}; {result['machine']})", "",
             "Median ms per step without the helper / with it; wall time and the training process's CPU time.", "",
             "| round | " + " | ".join(f"{part} wall | {part} CPU" for part in PARTS) + " |",
             "|---:|" + "---:|---:|" * len(PARTS)]
    lines += [f"| {i} | " + " | ".join(f"{r[f'{part}_without_ms']:.2f} / {r[f'{part}_with_ms']:.2f} | "
                                       f"{r[f'{part}_without_cpu_ms']:.2f} / {r[f'{part}_with_cpu_ms']:.2f}"
                                       for part in PARTS) + " |" for i, r in enumerate(rounds)]
    overhead = result["median_overhead"]
    lines += ["", f"Median overhead over {len(rounds)} rounds: " + "; ".join(
        f"{part} (steps {lo}-{hi - 1}) wall {100 * overhead[part + '_']:+.2f}%, CPU {100 * overhead[part + '_cpu_']:+.2f}%"
        for part, (lo, hi) in PARTS.items()) +
        f". `advisor.step()` outside the capture: {result['step_call_ns']:.0f} ns per call."]
    (RESULTS / "inloop_overhead.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
