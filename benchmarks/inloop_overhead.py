"""What the PyTorch in-loop helper costs a training step outside the steps it profiles (issue 42).

A small MLP trains on batches made once in memory (no input wait), on the GPU where there is one,
else on the CPU with one thread. Each round trains the same number of steps twice, in turn:
without any helper, and inside ``tb_gpuadvisor.torch.profile_steps`` (a fixed warm-up of 2
steps, 3 profiled ones; its analysis process then reads the capture while training goes on).
Steps are timed start to start; the steps compared are those after the capture has stopped
(its lead-in, profiled and stopping steps left out, in both runs alike), and each run's median
is taken. The result is the median over rounds of (with helper / without) - 1.

A second measurement times ``advisor.step()`` alone once the capture is over, the only code
the helper runs in a step it does not profile.

    python benchmarks/inloop_overhead.py [--rounds 7] [--steps 80]

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
# Steps before the comparison starts: warm-up, lead-in, profiled steps, the step that stops the
# capture, and one more.
SKIP = WARMUP + 1 + PROFILED + 2


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


def _run(train_step, steps: int, log_dir: str | None) -> list[float]:
    """Seconds between step starts, with the helper around the loop when LOG_DIR is given."""
    from tb_gpuadvisor.torch import profile_steps

    starts = []
    helper = (profile_steps(log_dir, steps=PROFILED, warmup_steps=WARMUP, print_report=False)
              if log_dir else contextlib.nullcontext())
    with contextlib.redirect_stdout(io.StringIO()), helper as advisor:
        for i in range(steps):
            starts.append(time.perf_counter())
            train_step(i)
            if advisor is not None:
                advisor.step()
        starts.append(time.perf_counter())
    return [b - a for a, b in zip(starts, starts[1:])]


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
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=80)
    args = parser.parse_args(argv)
    if args.steps < SKIP + 20:
        parser.error(f"--steps must be at least {SKIP + 20}")
    train_step, device = _setup()
    _run(train_step, 20, None)          # first-use costs out of the way
    rounds = []
    with tempfile.TemporaryDirectory() as root:
        for r in range(args.rounds):
            without = statistics.median(_run(train_step, args.steps, None)[SKIP:])
            with_helper = statistics.median(_run(train_step, args.steps, os.path.join(root, f"run{r}"))[SKIP:])
            rounds.append({"without_ms": without * 1e3, "with_ms": with_helper * 1e3,
                           "overhead": with_helper / without - 1})
            print(f"round {r}: {without * 1e3:.3f} ms without, {with_helper * 1e3:.3f} ms with "
                  f"({100 * rounds[-1]['overhead']:+.2f}%)", file=sys.stderr)
    result = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "device": device,
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}",
              "steps_per_run": args.steps, "compared_steps": args.steps - SKIP, "rounds": rounds,
              "median_overhead": statistics.median(r["overhead"] for r in rounds),
              "step_call_ns": _step_call_ns()}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "inloop_overhead.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# In-loop helper overhead, {result['date']} ({device}; {result['machine']})", "",
             "| round | without (ms/step) | with helper (ms/step) | overhead |", "|---:|---:|---:|---:|"]
    lines += [f"| {i} | {r['without_ms']:.3f} | {r['with_ms']:.3f} | {100 * r['overhead']:+.2f}% |"
              for i, r in enumerate(rounds)]
    lines += ["", f"Median overhead: {100 * result['median_overhead']:+.2f}% over {len(rounds)} rounds "
              f"({result['compared_steps']} steps after the capture per run); `advisor.step()` outside "
              f"the capture: {result['step_call_ns']:.0f} ns per call."]
    (RESULTS / "inloop_overhead.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
