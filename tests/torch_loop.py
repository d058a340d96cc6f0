"""A tiny PyTorch training loop on the CPU, profiled by torch.profiler into a TensorBoard logdir.

``slow``: the DataLoader builds every sample in the training process (num_workers=0) and each
sample takes SAMPLE_S to make, so the loop waits for input.  ``fixed``: the same dataset read by
worker processes that keep batches queued ahead (num_workers, persistent_workers,
prefetch_factor), the DataLoader fix the Advisor recommends.

    python tests/torch_loop.py LOGDIR slow|fixed
"""

from __future__ import annotations

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

SAMPLE_S = 0.0015
BATCH = 32
WAIT, WARMUP, ACTIVE = 1, 2, 6


class SlowDataset(Dataset):
    """Random samples that take SAMPLE_S each to make (decoding and augmenting, in real life)."""

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int):
        time.sleep(SAMPLE_S)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(256, generator=generator), index % 10


def loader(kind: str) -> DataLoader:
    if kind == "slow":
        return DataLoader(SlowDataset(), batch_size=BATCH, num_workers=0)
    return DataLoader(SlowDataset(), batch_size=BATCH, num_workers=4, persistent_workers=True, prefetch_factor=4)


def train(logdir: str, kind: str) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    # About 40 ms of compute per step (8 updates of ~5 ms), so a scheduling hiccup of the shared
    # machine is small beside it.
    model = torch.nn.Sequential(torch.nn.Linear(256, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(loader(kind))
    next(batches)                   # the workers (if any) are up
    if kind == "fixed":
        time.sleep(2.0)             # and fill their queues, as they do in the steps before a capture
    schedule = torch.profiler.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule,
                                on_trace_ready=torch.profiler.tensorboard_trace_handler(logdir, worker_name=kind)
                                ) as prof:
        for _ in range(WAIT + WARMUP + ACTIVE):
            x, y = next(batches)
            for _ in range(8):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            prof.step()


if __name__ == "__main__":
    train(sys.argv[1], sys.argv[2])
