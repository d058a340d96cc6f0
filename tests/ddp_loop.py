"""A 2-rank DDP training loop on the CPU (gloo), profiled by torch.profiler into a TensorBoard logdir.

Rank 0 sleeps SLOW_S in every step before its forward pass (a slow data source, logging): rank 1
reaches each gradient all-reduce first and waits in ``gloo:all_reduce`` for rank 0. The data is
an in-memory TensorDataset read through a DistributedSampler.

The ranks meet through a file in a fresh temporary folder (``file://`` init_method), not a TCP
port picked beforehand, which another process may take between the pick and the bind. A run
whose rank dies before both ranks have joined the group is started again, up to ATTEMPTS times;
a rank that fails after that fails the run.

    python tests/ddp_loop.py LOGDIR
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

SLOW_S = 0.02
WAIT, WARMUP, ACTIVE = 1, 1, 4
RANKS, ATTEMPTS = 2, 3


def train(rank: int, logdir: str, rendezvous: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{Path(rendezvous) / 'store'}", rank=rank,
                            world_size=RANKS)
    (Path(rendezvous) / f"joined-{rank}").touch()      # past start-up: a failure from here on is the run's
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


def run(logdir: str) -> int:
    """Both ranks into LOGDIR; the attempts it took."""
    attempt = 1
    while True:
        rendezvous = tempfile.mkdtemp(prefix="ddp-rendezvous-")
        try:
            torch.multiprocessing.start_processes(train, args=(logdir, rendezvous), nprocs=RANKS, start_method="fork")
            return attempt
        except (torch.multiprocessing.ProcessRaisedException, torch.multiprocessing.ProcessExitedException):
            joined = sum((Path(rendezvous) / f"joined-{rank}").exists() for rank in range(RANKS))
            if joined == RANKS or attempt == ATTEMPTS:
                raise
            print(f"attempt {attempt}: a rank died at start-up ({joined} of {RANKS} joined); starting again",
                  file=sys.stderr)
            shutil.rmtree(logdir, ignore_errors=True)       # no half-written traces of the failed attempt
            attempt += 1
        finally:
            shutil.rmtree(rendezvous, ignore_errors=True)

if __name__ == "__main__":
    run(sys.argv[1])
