"""A 2-rank DDP training loop on the CPU (gloo), profiled by torch.profiler into a TensorBoard logdir.

Rank 0 sleeps SLOW_S in every step before its forward pass (a slow data source, logging): rank 1
reaches each gradient all-reduce first and waits in ``gloo:all_reduce`` for rank 0. The data is
an in-memory TensorDataset read through a DistributedSampler.

    python tests/ddp_loop.py LOGDIR PORT
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

SLOW_S = 0.005
WAIT, WARMUP, ACTIVE = 1, 1, 4


def train(rank: int, logdir: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(2048, 256), torch.randint(0, 10, (2048,)))
    loader = torch.utils.data.DataLoader(data, batch_size=64,
                                         sampler=torch.utils.data.distributed.DistributedSampler(data))
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(loader)
    schedule = torch.profiler.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule,
                                on_trace_ready=torch.profiler.tensorboard_trace_handler(logdir, worker_name=f"rank{rank}")
                                ) as prof:
        for _ in range(WAIT + WARMUP + ACTIVE):
            x, y = next(batches)
            if rank == 0:
                time.sleep(SLOW_S)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.multiprocessing.start_processes(train, args=(sys.argv[1], int(sys.argv[2])), nprocs=2,
                                          start_method="fork")
