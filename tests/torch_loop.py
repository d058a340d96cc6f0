"""A tiny PyTorch training loop on the CPU, profiled by torch.profiler into a TensorBoard logdir.

``slow``: the DataLoader builds every sample in the training process (num_workers=0) and each
sample takes SAMPLE_S to make, so the loop waits for input.  ``fixed``: the same dataset read by
worker processes that keep batches queued ahead (num_workers, persistent_workers,
prefetch_factor), the DataLoader fix the Advisor recommends.  ``tiny_slow``/``tiny_fixed``: the
same pair on a tiny MLP (one update of a few hundred microseconds per step, TINY_SAMPLE_S per
sample): with the loader fixed, the host's own dispatch and the batch's hand-over from the
workers set the step.

    python tests/torch_loop.py LOGDIR slow|fixed|tiny_slow|tiny_fixed
"""

from __future__ import annotations

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

SAMPLE_S = 0.0015
TINY_SAMPLE_S = 0.00025
BATCH = 32
WAIT, WARMUP, ACTIVE = 1, 2, 6


class SlowDataset(Dataset):
    """Random samples that take SAMPLE_S each to make (decoding and augmenting, in real life)."""

    def __init__(self, sample_s: float = SAMPLE_S, width: int = 256) -> None:
        self.sample_s, self.width = sample_s, width

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int):
        time.sleep(self.sample_s)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(self.width, generator=generator), index % 10


def loader(kind: str) -> DataLoader:
    data = SlowDataset(TINY_SAMPLE_S, 64) if kind.startswith("tiny") else SlowDataset()
    if kind.endswith("slow"):
        return DataLoader(data, batch_size=BATCH, num_workers=0)
    return DataLoader(data, batch_size=BATCH, num_workers=4, persistent_workers=True, prefetch_factor=4)


def train(logdir: str, kind: str) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    # About 40 ms of compute per step (8 updates of ~5 ms), so a scheduling hiccup of the shared
    # machine is small beside it.
    tiny = kind.startswith("tiny")
    width, hidden, updates = (64, 64, 1) if tiny else (256, 2048, 8)
    model = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(loader(kind))
    next(batches)                   # the workers (if any) are up
    if kind.endswith("fixed"):
        time.sleep(2.0)             # and fill their queues, as they do in the steps before a capture
    schedule = torch.profiler.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule,
                                on_trace_ready=torch.profiler.tensorboard_trace_handler(logdir, worker_name=kind)
                                ) as prof:
        for _ in range(WAIT + WARMUP + ACTIVE):
            x, y = next(batches)
            for _ in range(updates):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            prof.step()


if __name__ == "__main__":
    train(sys.argv[1], sys.argv[2])
