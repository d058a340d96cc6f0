"""Every code fix in the catalogue runs as pasted (issue 44 item 2): each form every framework's user
can read (``tb-gpuadvisor checks``' lists, fitted to every kind of run ``for_run`` knows) compiles;
each worker or thread count in it is an expression of the machine's own cores that evaluates to a
positive count here; and each PyTorch fix that runs without a GPU is executed, in a subprocess with
a stub model and an in-memory dataset, on this machine (2 cores where the suite runs)."""

from __future__ import annotations

import ast
import importlib
import itertools
import json
import os
import subprocess
import sys
from dataclasses import fields

import pytest

from tb_gpuadvisor.checks import all_checks, fixes
from tb_gpuadvisor.checks.finding import Fix

# The arguments and calls that take a count of processes or threads.
_COUNTS = {"num_workers", "set_num_threads", "set_num_interop_threads", "workers", "cores"}
# A fix in shell, not Python (environment variables and driver settings made before the process starts).
_SHELL = ("export ", "pip ")
# A fix that needs a GPU (CUDA calls, a device id per rank, Apple's MPS backend) or a framework other
# than PyTorch only compiles here.
_NEEDS_GPU = ("cuda", "cudnn", "device_ids", "local_rank]", "nccl", "torch.mps")


def _catalogue() -> dict[str, list[Fix]]:
    """Every form of every fix the checks offer, per framework, fitted to every run."""
    offered: dict[str, list[Fix]] = {framework: [] for framework in fixes.FRAMEWORKS}
    for check in all_checks():
        module = importlib.import_module(check.function.__module__)
        for framework, found in fixes.offered(module).items():
            offered[framework] += [f for f in found if f not in offered[framework]]
    # Each fact either way; a count of busy threads none, a few, and more than any machine here has.
    facts_values = {f.name: (0, 3, 64) if f.type in (int, "int") else (False, True) for f in fields(fixes.RunFacts)}
    out: dict[str, list[Fix]] = {}
    for framework, found in offered.items():
        forms: list[Fix] = []
        for values in itertools.product(*facts_values.values()):
            facts = fixes.RunFacts(**dict(zip(facts_values, values)))
            forms += [f for f in fixes.for_run(found, framework, facts) if f not in forms]
        out[framework] = forms
    return out


CATALOGUE = _catalogue()
TORCH_FIXES = [f for f in CATALOGUE["pytorch"] if not any(word in f.code for word in _NEEDS_GPU)]


def _is_shell(code: str) -> bool:
    return code.startswith(_SHELL)


def test_the_catalogue_holds_every_framework_and_the_fitted_forms():
    names = {fix.code for fix in CATALOGUE["pytorch"]}
    for fix in (fixes.TORCH_WORKERS, fixes.TORCH_WORKERS_ON_CPU, fixes.TORCH_BATCHED_INDEXING,
                fixes.TORCH_FASTER_WORKERS):
        assert fix.code in names
    # sized from the threads a capture saw busy, the workers still at least one on this machine (below)
    assert any(fixes.spare_cores(64) in code for code in names)
    assert any("DistributedSampler(dataset)" in code and "shuffle=True" not in code for code in names)
    assert len(CATALOGUE["tensorflow"]) > 20 and len(CATALOGUE["jax"]) > 10 and len(TORCH_FIXES) > 10


@pytest.mark.parametrize("framework", fixes.FRAMEWORKS)
def test_every_code_fix_compiles(framework):
    """Python compiles; a shell fix passes bash's syntax check."""
    for fix in CATALOGUE[framework]:
        if _is_shell(fix.code):
            done = subprocess.run(["bash", "-n"], input=fix.code, capture_output=True, text=True)
            assert done.returncode == 0, (fix.code, done.stderr)
        else:
            compile(fix.code, fix.text[:60], "exec")


def test_every_count_of_workers_or_threads_is_positive_on_this_machine():
    """num_workers=, set_num_threads(...) and the like: each value that depends on nothing but os
    (os.cpu_count()) evaluates here to an int of at least 1; `os.cpu_count() - 4` on 2 cores did not."""
    seen = 0
    for fix in itertools.chain.from_iterable(CATALOGUE.values()):
        for node in ast.walk(ast.parse("" if _is_shell(fix.code) else fix.code)):
            values = []
            if isinstance(node, ast.keyword) and node.arg in _COUNTS:
                values = [node.value]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) in _COUNTS:
                values = node.args[:1]
            elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) in _COUNTS for t in node.targets):
                values = [node.value]
            for value in values:
                names = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
                if names <= {"os", "max", "min"}:
                    got = eval(compile(ast.Expression(value), "count", "eval"), {"os": os})
                    assert isinstance(got, int) and got >= 1, (ast.unparse(value), got, fix.text[:60])
                    seen += 1
    assert seen >= 5


# The names the fixes use, made small: a model (wrapped in DDP, as a multi-rank fix expects), an
# in-memory dataset, a loader and a step, raw items and their preprocessing; one rank of a gloo group.
_STUBS = """
import os, sys, json, tempfile, torch
torch.distributed.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
dataset = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))
batch_size, input_shape, num_classes, lr, epochs = 16, (8,), 4, 0.01, 1
per_rank_batch, local_rank, local_world_size = 16, 0, 1
device = torch.device("cpu")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=lr)
loss_fn = torch.nn.functional.cross_entropy
def train_step(x, y):
    loss = loss_fn(model(x), y)
    optimizer.zero_grad(); loss.backward(); optimizer.step()
    return loss.detach()
def augment_batch(samples):
    return torch.utils.data.default_collate(samples)
items = list(dataset.tensors[0])      # raw inputs the loop preprocesses
def preprocess(item):
    return item * 2
x, y = dataset.tensors[0][:16], dataset.tensors[1][:16]
loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size)
example_inputs, array, chunks, buffer = (x,), x.double().numpy(), [x, x], torch.empty(32, 8)
step, metric, log = 0, torch.zeros(()), print
logdir = tempfile.mkdtemp()
failed = []
for code in json.load(sys.stdin):
    try:
        exec(code, dict(globals()))
    except Exception as err:
        failed.append([code, repr(err)])
json.dump(failed, sys.stdout)
"""


def test_every_pytorch_fix_that_needs_no_gpu_runs_as_pasted():
    """Each one in a copy of the stubs' namespace, all in one subprocess; a loader it builds is
    read by the code that follows it where the fix has a loop, and its workers start then."""
    pytest.importorskip("torch")
    codes = [fix.code for fix in TORCH_FIXES]
    done = subprocess.run([sys.executable, "-c", _STUBS], input=json.dumps(codes), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
