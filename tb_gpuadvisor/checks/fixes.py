"""Fixes that several checks recommend, written once so their wording and code agree.

Each is a :class:`Fix` with a sentence saying what to change and why, a code
snippet a user can paste, and the guide that explains it.  A fix written for one
framework is a :class:`Remedy`: its TensorFlow form plus its JAX and PyTorch forms (or none,
when that framework has no such knob).  Checks list remedies without asking which framework wrote the
capture; the report resolves them once (:func:`for_framework`), so a JAX user never
reads TensorFlow code and a TensorFlow user never reads JAX code.  A plain ``Fix``
says something true in both frameworks.

The report then fits them to the run (:func:`for_run`, from the capture's :class:`RunFacts`): a run
without a GPU gets each fix's CPU form or none (no copy engine, pinned memory or CUDA decode), a
fix the run has already applied (DataLoader workers, a jitted JAX step) is never shown first, and a
fix that undoes a setting the capture shows (Keras' run_eagerly=True) comes before any tuning, and a
count of DataLoader workers leaves the cores the capture saw the training process keep busy.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass, replace
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from tb_gpuadvisor.checks.finding import Fix
from tb_gpuadvisor.kinds import HostEventKind
from tb_gpuadvisor.model import intervals as iv
from tb_gpuadvisor.model.threads import busy_threads
from tb_gpuadvisor.vocab import jax, pytorch

if TYPE_CHECKING:
    from tb_gpuadvisor.checks.context import Analysis


@dataclass(eq=False)
class Remedy(Fix):
    """A fix in the user's framework: the TensorFlow form (this Fix's own fields, unless
    ``tensorflow`` is False), the JAX form ``jax`` and the PyTorch form ``pytorch`` (None:
    nothing to do in that framework)."""

    jax: Fix | None = None
    tensorflow: bool = True
    pytorch: Fix | None = None

    def variant(self, framework: str) -> Fix | None:
        """The fix to show in a capture written by FRAMEWORK ("unknown" reads as TensorFlow)."""
        if framework == "jax":
            return self.jax
        if framework == "pytorch":
            return self.pytorch
        return Fix(self.text, self.code, self.doc) if self.tensorflow else None


def jax_only(fix: Fix) -> Remedy:
    """A remedy that only exists in JAX (dropped from TensorFlow reports)."""
    return Remedy(fix.text, fix.code, fix.doc, jax=fix, tensorflow=False)


def for_framework(fixes: list[Fix], framework: str) -> list[Fix]:
    """FIXES as the user of FRAMEWORK should read them: one form each, repeats dropped."""
    out: list[Fix] = []
    for fix in fixes:
        chosen = fix.variant(framework) if isinstance(fix, Remedy) else fix
        if chosen is not None and chosen not in out:
            out.append(chosen)
    return out


@dataclass(frozen=True)
class RunFacts:
    """What the capture shows about the run, for fitting the fixes to it."""

    cpu_only: bool = False          # no GPU or TPU in the capture: the model ran on the host
    loader_workers: bool = False    # PyTorch: the DataLoader already loads in worker processes
    jitted_step: bool = False       # JAX: each step is one (or a few) jitted calls already
    op_by_op_step: bool = False     # JAX: each step dispatches dozens of jitted primitives from Python
    multi_rank: bool = False        # PyTorch: one of several ranks (its DataLoader keeps a DistributedSampler)
    cheap_batches: bool = False     # PyTorch: a batch costs less to make than a worker's hand-off
    busy_threads: int = 0           # the most threads of a host's process at work at once in the steps (0: none seen)


# A JAX step is compiled already when the trusted steps hold at most this many jitted calls each
# on average (the step function, perhaps a data or metric helper); a step written op by op calls
# one jitted primitive per operation (PjitFunction(mul), PjitFunction(dot_general), ... : dozens).
JITTED_CALLS_PER_STEP = 4


def run_facts(analysis: "Analysis") -> RunFacts:
    """The facts of ANALYSIS's capture that decide which fixes fit (see :func:`for_run`)."""
    model = analysis.model
    workers = jitted = op_by_op = multi_rank = cheap = False
    if model.framework == pytorch.FRAMEWORK:
        # Several ranks in the session, or one rank's trace of collectives (one rank's view of a DDP run).
        multi_rank = max(len(model.hosts), model.session_hosts) > 1 or any(
            pytorch.is_collective_call(name) for host in model.hosts for name in host.activity.names)
        waits = [iv.union(h.activity.start_ps[m], h.activity.end_ps[m]) for h in model.hosts
                 for m in [(h.activity.kind == HostEventKind.INPUT_WAIT) & (h.activity.step >= 0)] if m.any()]
        wait_ms = max((analysis.ms_per_step(iv.total(w)) for w in waits), default=0.0)
        cheap = 0.0 < wait_ms < pytorch.WORKER_HANDOFF_MS
    if model.framework in (pytorch.FRAMEWORK, jax.FRAMEWORK):
        steps = analysis.steps_count
        calls = 0
        for host in model.hosts:
            act = host.activity
            if model.framework == pytorch.FRAMEWORK:
                names = [i for i, n in enumerate(act.names) if pytorch.loads_in_workers(n)]
                workers = workers or bool(names and np.isin(act.name, names).any())
            else:
                names = [i for i, n in enumerate(act.names) if jax.PJIT_CALL.match(n)]
                calls += int(np.count_nonzero(np.isin(act.name, names) & (act.step >= 0))) if names else 0
        jitted = bool(steps) and 0 < calls <= JITTED_CALLS_PER_STEP * steps
        op_by_op = bool(steps) and calls > JITTED_CALLS_PER_STEP * steps
    windows = iv.union(model.steps.start_ps, model.steps.end_ps) if len(model.steps) else iv.EMPTY
    busy = max((busy_threads(host.activity, windows) for host in model.hosts), default=0)
    return RunFacts(cpu_only=analysis.trust.placement.where == "cpu_only", loader_workers=workers,
                    jitted_step=jitted, op_by_op_step=op_by_op, multi_rank=multi_rank, cheap_batches=cheap,
                    busy_threads=busy)


def for_run(fixes: list[Fix], framework: str, facts: RunFacts) -> list[Fix]:
    """FIXES in FRAMEWORK's words (:func:`for_framework`), fitted to the run FACTS describe: on a
    run without a GPU each fix in its CPU form, or dropped when it only works on a GPU; a fix the run
    has already applied replaced by what is left to do (or dropped) and moved after the others (first
    where what is left leads, ``_LEADING``); a fix that undoes a setting the capture shows moved first;
    a multi-rank run's loaders keep their DistributedSampler, and a count of workers leaves the threads
    the capture saw busy their cores."""
    leading: list[Fix] = []
    rest: list[Fix] = []
    after: list[Fix] = []
    for fix in for_framework(fixes, framework):
        if facts.cheap_batches and fix in _WORKER_FIXES:
            fix = TORCH_BATCHED_INDEXING
        if facts.cpu_only:
            fix = next((cpu for gpu, cpu in _CPU_FORMS if gpu == fix), fix)
            if fix is None:
                continue
        done = next((held for held in _ALREADY_DONE if held[0] == fix and getattr(facts, held[1])), None)
        if done is not None:
            left = done[2]
            if left is not None and left not in after + leading:
                (leading if _leads(left, facts) else after).append(left)
            continue
        (leading if _leads(fix, facts) else rest).append(fix)
    ordered = leading + rest + [fix for fix in after if fix not in leading + rest]
    if facts.multi_rank:
        ordered = [_with_sampler(fix) for fix in ordered]
    return [_sized(fix, facts.busy_threads) for fix in ordered]


def _sized(fix: Fix, busy: int) -> Fix:
    """FIX with its count of DataLoader workers leaving BUSY cores (the training process's threads the
    capture saw at work at once) instead of one, still at least one worker on any machine."""
    if busy <= 1 or SPARE_CORES not in fix.code:
        return fix
    return replace(fix, code=fix.code.replace(SPARE_CORES, spare_cores(busy)),
                   text=f"{fix.text} The worker count leaves {busy} cores to the training process: the "
                        f"capture saw {busy} of its threads at work at once.")


def _leads(fix: Fix, facts: RunFacts) -> bool:
    """Whether FIX comes before the others in a run of FACTS (``_LEADING``)."""
    return any(fix == lead and (fact is None or getattr(facts, fact)) for lead, fact in _LEADING)


# A DataLoader the fix builds with shuffle=True (DataLoader(<dataset>, ... shuffle=True), and a
# sampler that shuffles the whole dataset.
_SHUFFLED_LOADER = re.compile(r"DataLoader\((?P<before>\s*)(?P<data>\w+)(?P<between>[^()]*?)shuffle=True")
_WHOLE_DATASET_SAMPLER = re.compile(r"torch\.utils\.data\.RandomSampler\((\w+)\)")
_RANK_SAMPLER = "torch.utils.data.distributed.DistributedSampler"


def _with_sampler(fix: Fix) -> Fix:
    """FIX as a rank of a multi-rank run pastes it: each DataLoader it builds keeps the rank's share
    of the data (a DistributedSampler, which shuffles) instead of shuffling the whole dataset."""
    code = _SHUFFLED_LOADER.sub(lambda m: f"DataLoader({m['before']}{m['data']}{m['between']}"
                                f"sampler={_RANK_SAMPLER}({m['data']})", fix.code)
    code = _WHOLE_DATASET_SAMPLER.sub(lambda m: f"{_RANK_SAMPLER}({m.group(1)})", code)
    if code == fix.code:
        return fix
    return replace(fix, code=code + "\n# at each epoch's start call the DistributedSampler's set_epoch(epoch), "
                                    "so the ranks reshuffle alike")


FRAMEWORKS = ("tensorflow", "jax", "pytorch")
# A plain Fix written for one framework is named for it (JAX_..., TORCH_...); others speak to all.
_PREFIXES = {"JAX_": "jax", "TORCH_": "pytorch"}


def offered(module: ModuleType) -> dict[str, list[Fix]]:
    """The fixes a check MODULE's functions name (``fixes.X``, or a Fix/Remedy or list of them the module holds),
    in the order they first appear, as each framework's user reads them: what ``tb-gpuadvisor
    checks ID`` lists. Fixes only named inside another fix's definition are forms, not offers."""
    tree = ast.parse(inspect.getsource(module))
    found: dict[str, Fix] = {}
    for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        for node in ast.walk(function):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "fixes":
                name, value = node.attr, globals().get(node.attr)
            elif isinstance(node, ast.Name):
                name, value = node.id, vars(module).get(node.id)
            else:
                continue
            for i, item in enumerate(value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(item, Fix):       # a fix, or one of a list of fixes the module keeps
                    found.setdefault(name if item is value else f"{name}[{i}]", item)
    out: dict[str, list[Fix]] = {}
    for framework in FRAMEWORKS:
        mine = [fix for name, fix in found.items() if isinstance(fix, Remedy)
                or _PREFIXES.get(name[:name.find("_") + 1], framework) == framework]
        out[framework] = for_framework(mine, framework)
    return out


def compiled_step(framework: str) -> str:
    """What the user's framework calls a compiled step, for the checks' wording."""
    return {"jax": "jax.jit", "pytorch": "torch.compile"}.get(framework, "tf.function")


JAX_JIT_GUIDE = "https://docs.jax.dev/en/latest/jit-compilation.html"
JAX_DONATION_GUIDE = "https://docs.jax.dev/en/latest/buffer_donation.html"
JAX_SHARDING_GUIDE = "https://docs.jax.dev/en/latest/sharded-computation.html"
JAX_GPU_TIPS = "https://docs.jax.dev/en/latest/gpu_performance_tips.html"
JAX_PROFILING_GUIDE = "https://docs.jax.dev/en/latest/profiling.html"
JAX_MEMORY_GUIDE = "https://docs.jax.dev/en/latest/gpu_memory_allocation.html"
JAX_SCAN_DOC = "https://docs.jax.dev/en/latest/_autosummary/jax.lax.scan.html"
JAX_DEVICE_PUT_DOC = "https://docs.jax.dev/en/latest/_autosummary/jax.device_put.html"
JAX_PRECISION_DOC = "https://docs.jax.dev/en/latest/_autosummary/jax.default_matmul_precision.html"

JAX_JIT_STEP = Fix(
    text="Compile the whole training step (forward, gradients and optimizer update) as one jax.jit "
         "function, so each step is one XLA program instead of many small dispatches from Python.",
    code="@jax.jit\n"
         "def train_step(params, opt_state, batch):\n"
         "    loss, grads = jax.value_and_grad(loss_fn)(params, batch)\n"
         "    updates, opt_state = optimizer.update(grads, opt_state, params)\n"
         "    return optax.apply_updates(params, updates), opt_state, loss",
    doc=JAX_JIT_GUIDE,
)

JAX_DONATE = Fix(
    text="Donate the buffers the step replaces (parameters, optimizer state), so XLA writes the new "
         "values in place instead of allocating and copying a second set every step.",
    code="train_step = jax.jit(train_step, donate_argnums=(0, 1))   # params, opt_state\n"
         "params, opt_state, loss = train_step(params, opt_state, batch)",
    doc=JAX_DONATION_GUIDE,
)

JAX_DEVICE_PUT = Fix(
    text="Place inputs on the devices with the sharding the step expects before calling it; an "
         "argument that lives elsewhere is re-sharded (copied between devices) on every call.",
    code="mesh = jax.make_mesh((jax.device_count(),), ('data',))\n"
         "sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))\n"
         "batch = jax.device_put(batch, sharding)        # once per batch, outside the step\n"
         "params = jax.device_put(params, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))",
    doc=JAX_SHARDING_GUIDE,
)

JAX_SCAN_STEPS = Fix(
    text="Run several steps per call with jax.lax.scan (or lax.fori_loop) inside one jitted "
         "function, so Python and dispatch run once per group of steps instead of every step.",
    code="@jax.jit\n"
         "def train_steps(state, batches):          # batches: leading axis = steps\n"
         "    def body(state, batch):\n"
         "        state, loss = train_step(state, batch)\n"
         "        return state, loss\n"
         "    return jax.lax.scan(body, state, batches)",
    doc=JAX_SCAN_DOC,
)

JAX_STEP_ANNOTATION = Fix(
    text="Mark each training step so the profile groups events into steps.",
    code="for step, batch in enumerate(batches):\n"
         "    with jax.profiler.StepTraceAnnotation('train', step_num=step):\n"
         "        state, loss = train_step(state, batch)",
    doc=JAX_PROFILING_GUIDE,
)

JAX_BF16 = Fix(
    text="Compute matmuls and convolutions in bfloat16 (keep float32 parameters for the update): "
         "cast the inputs and weights in the step, or let float32 matmuls use bf16 passes.",
    code="x = x.astype(jnp.bfloat16)\n"
         "y = jnp.dot(x, w.astype(jnp.bfloat16), preferred_element_type=jnp.float32)\n"
         "# or for float32 code: lower matmul precision globally\n"
         "jax.config.update('jax_default_matmul_precision', 'bfloat16')",
    doc=JAX_PRECISION_DOC,
)

JAX_PREFETCH = Fix(
    text="Copy the next batch to the device while the current step runs: jax.device_put returns "
         "at once, so issue it for batch i+1 before waiting on step i.",
    code="batches = iter(loader)\n"
         "next_batch = jax.device_put(next(batches), sharding)\n"
         "for step in range(num_steps):\n"
         "    batch, next_batch = next_batch, jax.device_put(next(batches), sharding)\n"
         "    state, loss = train_step(state, batch)",
    doc=JAX_DEVICE_PUT_DOC,
)

JAX_SYNTHETIC_INPUT_TEST = Fix(
    text="Confirm the diagnosis: time a few steps on one random batch already on the device. If "
         "the step time drops, the input pipeline is the bottleneck; if not, look elsewhere.",
    code="batch = jax.device_put(jax.random.normal(jax.random.key(0), (batch_size, *shape)))\n"
         "for _ in range(50):\n"
         "    state, loss = train_step(state, batch)\n"
         "loss.block_until_ready()",
    doc=JAX_PROFILING_GUIDE,
)

JAX_LARGER_BATCH = Fix(
    text="Use a larger batch (scaling the learning rate accordingly): each XLA kernel then does "
         "more work, so fixed per-launch costs shrink relative to compute.",
    code="batch_size = 256   # e.g. up from 32, as far as device memory allows",
    doc=JAX_GPU_TIPS,
)

JAX_CONV_LAYOUT = Fix(
    text="Give convolutions the layout the GPU library wants (channels last, NHWC / NDHWC, and "
         "kernels HWIO) in the model itself, so XLA needs no transpose fusions around each call.",
    code="y = jax.lax.conv_general_dilated(\n"
         "    x, w, window_strides=(1, 1), padding='SAME',\n"
         "    dimension_numbers=('NHWC', 'HWIO', 'NHWC'))   # x: [N, H, W, C], w: [H, W, I, O]",
    doc="https://docs.jax.dev/en/latest/_autosummary/jax.lax.conv_general_dilated.html",
)

JAX_PLACEMENT = Fix(
    text="Check that JAX sees the accelerator and that the step's arrays live on it; arrays "
         "created with NumPy or on the CPU backend make the step run there or copy each call.",
    code="print(jax.devices())                 # the GPUs, not only CpuDevice\n"
         "print(batch.sharding, params_leaf.devices())\n"
         "jax.config.update('jax_log_compiles', True)   # see which functions compile for which device",
    doc=JAX_DEVICE_PUT_DOC,
)

DATA_GUIDE = "https://www.tensorflow.org/guide/data_performance"
GPU_PERF_GUIDE = "https://www.tensorflow.org/guide/gpu_performance_analysis"
GPU_GUIDE = "https://www.tensorflow.org/guide/gpu"
MIXED_PRECISION_GUIDE = "https://www.tensorflow.org/guide/mixed_precision"
DISTRIBUTED_GUIDE = "https://www.tensorflow.org/guide/distributed_training"
FUNCTION_GUIDE = "https://www.tensorflow.org/guide/function"
XLA_GUIDE = "https://www.tensorflow.org/xla"
KERAS_FIT_DOC = "https://keras.io/api/models/model_training_apis/"

TORCH_DATA_GUIDE = "https://pytorch.org/docs/stable/data.html#multi-process-data-loading"
TORCH_TUNING_GUIDE = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html"
TORCH_AMP_DOC = "https://pytorch.org/docs/stable/amp.html"
TORCH_COMPILE_DOC = "https://pytorch.org/docs/stable/generated/torch.compile.html"
TORCH_CUDA_GRAPHS_DOC = "https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs"
TORCH_TF32_DOC = "https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices"
TORCH_DDP_DOC = "https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html"
TORCH_PROFILER_DOC = "https://pytorch.org/docs/stable/profiler.html"
TORCH_CHANNELS_LAST_DOC = "https://pytorch.org/tutorials/intermediate/memory_format_tutorial.html"

# Every code fix runs as pasted on any machine: a worker or thread count is an expression of the
# machine's own cores, at least 1 (os.cpu_count() may be None; 2 cores minus 4 is not a count).
_IMPORT_OS = "import os\n"


def spare_cores(busy: int = 1) -> str:
    """The DataLoader workers a machine can spare, as pasted code: its cores less the BUSY ones the
    training process keeps at work, at most 8, at least 1."""
    return f"max(1, min(8, (os.cpu_count() or 2) - {busy}))"


# The fixes' own count leaves one core to the training process; ``for_run`` leaves what the capture saw.
SPARE_CORES = spare_cores()

TORCH_WORKERS = Fix(
    text="Load batches in DataLoader worker processes that stay alive between epochs and keep "
         "batches queued ahead of the step, instead of in the training loop's own process.",
    code=_IMPORT_OS
         + "loader = torch.utils.data.DataLoader(\n"
         "    dataset, batch_size=batch_size, shuffle=True,\n"
         f"    num_workers={SPARE_CORES},  # the cores you can spare, at most 8\n"
         "    persistent_workers=True,  # no worker start-up at every epoch\n"
         "    prefetch_factor=4,        # batches each worker keeps ready\n"
         "    pin_memory=True)",
    doc=TORCH_DATA_GUIDE,
)

TORCH_WORKERS_ON_CPU = Fix(
    text="Load batches in DataLoader worker processes that stay alive between epochs and keep "
         "batches queued ahead of the step; without a GPU the workers share the cores with the "
         "training threads, so give each side its own.",
    code=_IMPORT_OS
         + "cores = os.cpu_count() or 2\n"
         "workers = max(1, cores // 4)                    # a quarter of the cores load, at least one\n"
         "torch.set_num_threads(max(1, cores - workers))  # the rest compute in the training process\n"
         "loader = torch.utils.data.DataLoader(\n"
         "    dataset, batch_size=batch_size, shuffle=True,\n"
         "    num_workers=workers,\n"
         "    persistent_workers=True,  # no worker start-up at every epoch\n"
         "    prefetch_factor=4)        # batches each worker keeps ready",
    doc=TORCH_DATA_GUIDE,
)

TORCH_FASTER_WORKERS = Fix(
    text="The DataLoader already loads in worker processes and the step still waits for it: make "
         "each sample cheaper first (above); then keep the workers alive between epochs, queue more "
         "batches per worker, and add workers only while cores are idle.",
    code=_IMPORT_OS
         + "loader = torch.utils.data.DataLoader(\n"
         "    dataset, batch_size=batch_size, shuffle=True,\n"
         f"    num_workers={SPARE_CORES},  # raise only while `top` shows idle cores\n"
         "    persistent_workers=True, prefetch_factor=4)",
    doc=TORCH_DATA_GUIDE,
)

TORCH_BATCHED_INDEXING = Fix(
    text="Each batch costs less to make than a DataLoader worker's hand-off of it (an in-memory dataset, "
         "a cheap collate), so workers would make the step slower: make the batch in one call instead of "
         "one per sample, with a sampler that yields whole batches of indices (a TensorDataset takes a "
         "list of them) or by slicing the tensors directly.",
    code="sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(dataset),\n"
         "                                        batch_size=batch_size, drop_last=False)\n"
         "loader = torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=None)  # dataset[indices]: one call a batch\n"
         "# or, with the tensors at hand:  x, y = x_all[i:i + batch_size], y_all[i:i + batch_size]",
    doc=TORCH_DATA_GUIDE,
)

TORCH_PINNED_COPIES = Fix(
    text="Copy batches from pinned (page-locked) host memory without blocking, so the copy runs "
         "on the GPU's copy engine while the host goes on launching work.",
    code=_IMPORT_OS
         + "loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, pin_memory=True,\n"
         f"                                     num_workers={SPARE_CORES})\n"
         "for x, y in loader:\n"
         "    x = x.to(device, non_blocking=True)\n"
         "    y = y.to(device, non_blocking=True)",
    doc=TORCH_TUNING_GUIDE,
)

TORCH_LIGHTER_DATASET = Fix(
    text="Make each sample cheaper to produce: decode and augment on the GPU or in a vectorised "
         "collate_fn, and cache samples whose preprocessing does not change between epochs.",
    code="# e.g. decode JPEGs on the GPU\n"
         "img = torchvision.io.decode_jpeg(torchvision.io.read_file(path), device=\"cuda\")",
    doc=TORCH_TUNING_GUIDE,
)

TORCH_LIGHTER_DATASET_ON_CPU = Fix(
    text="Make each sample cheaper to produce: cache samples whose preprocessing does not change "
         "between epochs, and augment a whole batch at once in a vectorised collate_fn instead of "
         "sample by sample.",
    code="cached = [dataset[i] for i in range(len(dataset))]   # decoded once, if it fits in memory\n"
         "loader = torch.utils.data.DataLoader(cached, batch_size=batch_size, shuffle=True,\n"
         "                                     collate_fn=augment_batch)  # one call per batch",
    doc=TORCH_TUNING_GUIDE,
)

TORCH_SYNTHETIC_INPUT_TEST = Fix(
    text="Confirm the diagnosis: run a few steps on one random batch kept on the GPU. If the step "
         "time drops, the DataLoader is the bottleneck; if not, look elsewhere.",
    code="x = torch.randn(batch_size, *input_shape, device=device)\n"
         "y = torch.randint(num_classes, (batch_size,), device=device)\n"
         "for _ in range(50):\n"
         "    train_step(x, y)",
    doc=TORCH_TUNING_GUIDE,
)

TORCH_SYNTHETIC_INPUT_TEST_ON_CPU = Fix(
    text="Confirm the diagnosis: run a few steps on one random batch made once, outside the loop. "
         "If the step time drops, the DataLoader is the bottleneck; if not, look elsewhere.",
    code="x = torch.randn(batch_size, *input_shape)\n"
         "y = torch.randint(num_classes, (batch_size,))\n"
         "for _ in range(50):\n"
         "    train_step(x, y)",
    doc=TORCH_TUNING_GUIDE,
)

# The step's own preprocessing (input_bound, when the loop prepares its batch on the host): moved
# into a Dataset whose workers prepare the next batches while the device runs this one.
_PREPROCESSED = ("class Preprocessed(torch.utils.data.Dataset):\n"
                 "    def __init__(self, items):           # the raw inputs: paths, bytes, frames\n"
                 "        self.items = items\n"
                 "    def __len__(self):\n"
                 "        return len(self.items)\n"
                 "    def __getitem__(self, i):\n"
                 "        return preprocess(self.items[i])  # what the loop did, one sample at a time\n")
_PREPROCESSED_LOOP = ("with torch.no_grad():\n"
                      "    for batch in loader:\n"
                      "        outputs = model(batch.to(device, non_blocking=True))")

TORCH_PREPROCESS_IN_WORKERS = Fix(
    text="Take the preprocessing out of the step: do it per sample in a Dataset, so DataLoader worker "
         "processes prepare the next batches while the GPU runs this one; pinned batches then copy "
         "with non_blocking=True.",
    code=_IMPORT_OS + _PREPROCESSED
         + "loader = torch.utils.data.DataLoader(\n"
         "    Preprocessed(items), batch_size=batch_size,\n"
         f"    num_workers={SPARE_CORES},  # the cores you can spare, at most 8\n"
         "    persistent_workers=True, prefetch_factor=4, pin_memory=True)\n" + _PREPROCESSED_LOOP,
    doc=TORCH_DATA_GUIDE,
)

TORCH_PREPROCESS_IN_WORKERS_ON_CPU = Fix(
    text="Take the preprocessing out of the step: do it per sample in a Dataset, so DataLoader worker "
         "processes prepare the next batches while the model runs this one; without a GPU the workers "
         "share the cores with the model's threads, so give each side its own.",
    code=_IMPORT_OS + _PREPROCESSED
         + "cores = os.cpu_count() or 2\n"
         "workers = max(1, cores // 4)                    # a quarter of the cores prepare, at least one\n"
         "torch.set_num_threads(max(1, cores - workers))  # the rest run the model\n"
         "loader = torch.utils.data.DataLoader(Preprocessed(items), batch_size=batch_size,\n"
         "                                     num_workers=workers, persistent_workers=True)\n"
         + _PREPROCESSED_LOOP.replace(".to(device, non_blocking=True)", ""),
    doc=TORCH_DATA_GUIDE,
)

TORCH_PREPROCESS_IN_DATASET = Fix(
    text="The DataLoader already runs worker processes, but the preprocessing runs in the loop after "
         "it: move it into the dataset, so the workers you have prepare each sample ahead of the step.",
    code=_PREPROCESSED
         + "loader = torch.utils.data.DataLoader(\n"
         "    Preprocessed(items), batch_size=loader.batch_size, num_workers=loader.num_workers,\n"
         "    persistent_workers=loader.num_workers > 0, pin_memory=loader.pin_memory)\n" + _PREPROCESSED_LOOP,
    doc=TORCH_DATA_GUIDE,
)

TORCH_PREPROCESS_ON_GPU = Fix(
    text="Or prepare the batch on the GPU: decode JPEGs there and resize and normalize them as tensors; "
         "with a Hugging Face image processor, ask it for tensors (return_tensors='pt') and copy them "
         "with .to(device, non_blocking=True).",
    code="from torchvision.io import decode_jpeg\n"
         "from torchvision.transforms.v2 import functional as F\n"
         "# jpegs: the encoded images as 1-D uint8 tensors (torchvision.io.read_file(path))\n"
         "images = decode_jpeg(jpegs, device=\"cuda\")   # decoded by the GPU\n"
         "batch = torch.stack([F.resize(image, [224, 224], antialias=True) for image in images])\n"
         "batch = F.normalize(batch.float() / 255, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])",
    doc="https://pytorch.org/vision/stable/generated/torchvision.io.decode_jpeg.html",
)

TORCH_COMPILE = Fix(
    text="Compile the model with torch.compile: it fuses chains of small element-wise ops into a "
         "few kernels, so the host launches far fewer kernels per step.",
    code="model = torch.compile(model)",
    doc=TORCH_COMPILE_DOC,
)

TORCH_CUDA_GRAPHS = Fix(
    text="Replay the step's kernels as a CUDA graph: one launch per step instead of one per kernel "
         "(needs static shapes).",
    code="model = torch.compile(model, mode=\"reduce-overhead\")  # captures CUDA graphs\n"
         "# or by hand: torch.cuda.CUDAGraph / torch.cuda.make_graphed_callables",
    doc=TORCH_CUDA_GRAPHS_DOC,
)

TORCH_LARGER_BATCH = Fix(
    text="Use a larger batch (in training, scale the learning rate with it): the same kernel launches "
         "and collectives then do more work each, so their fixed costs shrink relative to compute.",
    code=_IMPORT_OS
         + "loader = torch.utils.data.DataLoader(dataset, batch_size=256, pin_memory=True,\n"
         f"                                     num_workers={SPARE_CORES})",
    doc=TORCH_TUNING_GUIDE,
)

TORCH_NO_HOST_SYNC = Fix(
    text="Keep values on the GPU inside the loop: .item(), .cpu(), print(loss) and Python tests on "
         "tensors wait for the GPU to finish. Accumulate on the device and read once per N steps.",
    code="running = torch.zeros((), device=device)\n"
         "for i, (x, y) in enumerate(loader):\n"
         "    loss = train_step(x, y)\n"
         "    running += loss.detach()          # no sync\n"
         "    if i % 100 == 0:\n"
         "        print(running.item() / 100)   # one sync per 100 steps\n"
         "        running.zero_()",
    doc=TORCH_TUNING_GUIDE,
)

TORCH_AUTOCAST = Fix(
    text="Run the forward pass and loss under autocast in bfloat16 (Ampere or newer) or float16 with "
         "a GradScaler, and let float32 matmuls use TF32 where the rest stays 32-bit.",
    code="torch.set_float32_matmul_precision(\"high\")\n"
         "with torch.autocast(device_type=\"cuda\", dtype=torch.bfloat16):\n"
         "    loss = loss_fn(model(x), y)\n"
         "loss.backward()",
    doc=TORCH_AMP_DOC,
)

TORCH_TF32 = Fix(
    text="Let float32 matmuls and convolutions use TF32 Tensor Cores (Ampere or newer).",
    code="torch.set_float32_matmul_precision(\"high\")\n"
         "torch.backends.cuda.matmul.allow_tf32 = True\n"
         "torch.backends.cudnn.allow_tf32 = True",
    doc=TORCH_TF32_DOC,
)

TORCH_CHANNELS_LAST = Fix(
    text="Keep convolution inputs and weights in channels_last, the layout Tensor Core convolutions "
         "read, and let cuDNN pick the fastest algorithm once per input shape.",
    code="torch.backends.cudnn.benchmark = True  # shapes fixed from step to step\n"
         "model = model.to(memory_format=torch.channels_last)\n"
         "x = x.to(device, memory_format=torch.channels_last, non_blocking=True)",
    doc=TORCH_CHANNELS_LAST_DOC,
)

TORCH_DDP_BUCKETS = Fix(
    text="Let DDP overlap gradient all-reduces with the backward pass in larger buckets, reduce "
         "into the gradients in place, and skip the all-reduce on accumulation steps.",
    code="model = torch.nn.parallel.DistributedDataParallel(\n"
         "    model, device_ids=[local_rank], bucket_cap_mb=100, gradient_as_bucket_view=True)\n"
         "with model.no_sync():          # accumulation steps: no all-reduce\n"
         "    loss_fn(model(x1), y1).backward()\n"
         "loss_fn(model(x2), y2).backward()  # all-reduce once, here",
    doc=TORCH_DDP_DOC,
)

TORCH_OVERLAP_ALL_TO_ALL = Fix(
    text="Overlap the all-to-all with compute that does not need its result: issue it with "
         "async_op=True (it runs on NCCL's own stream) and wait only where its output is used.",
    code="work = torch.distributed.all_to_all_single(out, inp, async_op=True)  # returns at once\n"
         "shared = shared_expert(x)        # independent compute runs meanwhile\n"
         "work.wait()                      # block only here, where `out` is read\n"
         "y = experts(out) + shared",
    doc="https://pytorch.org/docs/stable/distributed.html#torch.distributed.all_to_all_single",
)

TORCH_FSDP_PREFETCH = Fix(
    text="Where FSDP issues these all-gathers and reduce-scatters, let it gather the next layer's "
         "parameters while the current one computes (forward and backward prefetch), so they hide "
         "behind compute.",
    code="from torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel as FSDP\n"
         "model = FSDP(model, forward_prefetch=True,\n"
         "             backward_prefetch=BackwardPrefetch.BACKWARD_PRE, limit_all_gathers=True)",
    doc="https://pytorch.org/docs/stable/fsdp.html",
)

TORCH_MEMORY_HEADROOM = Fix(
    text="Lower peak GPU memory: recompute activations in the backward pass (activation "
         "checkpointing), keep them in 16-bit under autocast, or use a smaller batch; let the caching "
         "allocator grow its segments instead of splitting new ones, which leaves less reserved but "
         "unusable memory.",
    code="# before the process starts:  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
         "from torch.utils.checkpoint import checkpoint\n"
         "h = checkpoint(block, h, use_reentrant=False)   # block's activations recomputed in backward\n"
         "with torch.autocast(device_type=\"cuda\", dtype=torch.bfloat16):\n"
         "    loss = loss_fn(model(x), y)\n"
         "print(torch.cuda.max_memory_allocated() / 2**30, \"GiB peak\")",
    doc="https://pytorch.org/docs/stable/notes/cuda.html#memory-management",
)

TORCH_MEMORY_LARGER_BATCH = Fix(
    text="Raise the batch size until torch.cuda.max_memory_allocated() approaches ~80% of the GPU; "
         "scale the learning rate with it.",
    code=_IMPORT_OS
         + "loader = torch.utils.data.DataLoader(dataset, batch_size=2 * batch_size, pin_memory=True,\n"
         f"                                     num_workers={SPARE_CORES})\n"
         "optimizer = torch.optim.AdamW(model.parameters(), lr=2 * lr)\n"
         "torch.cuda.reset_peak_memory_stats()\n"
         "train_step(*next(iter(loader)))\n"
         "print(torch.cuda.max_memory_allocated() / torch.cuda.get_device_properties(0).total_memory)",
    doc=TORCH_TUNING_GUIDE,
)

TORCH_EVAL_MODE = Fix(
    text="Switch the model to eval mode before inference (dropout off, batch norm on its running "
         "statistics) and run it under inference_mode; switch back with model.train() to train.",
    code="model.eval()\n"
         "with torch.inference_mode():\n"
         "    predictions = model(x)\n"
         "model.train()   # before the next training step",
    doc="https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.eval",
)

TORCH_FULL_TRACE = Fix(
    text="Record the CPU and the GPU on every rank for the same few steps, and analyse the trace files "
         "as the profiler wrote them: a trace sampled or filtered afterwards has lost the GPU work of "
         "every call it left out, so its idle time is unknown.",
    code="from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler\n"
         "with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],\n"
         "             schedule=schedule(wait=1, warmup=3, active=3),\n"
         "             on_trace_ready=tensorboard_trace_handler(logdir)) as prof:   # on every rank\n"
         "    for x, y in loader:\n"
         "        train_step(x, y)\n"
         "        prof.step()",
    doc=TORCH_PROFILER_DOC,
)

TORCH_WARM_CAPTURE = Fix(
    text="Profile warmed-up steps: skip the first iterations (the GPU context, cuDNN/cuBLAS or "
         "MIOpen/rocBLAS set-up, lazily loaded kernels) and record a few ordinary ones, marking each "
         "with prof.step().",
    code="with torch.profiler.profile(\n"
         "        schedule=torch.profiler.schedule(wait=1, warmup=3, active=5),\n"
         "        on_trace_ready=torch.profiler.tensorboard_trace_handler(logdir)) as prof:\n"
         "    for x, y in loader:\n"
         "        train_step(x, y)\n"
         "        prof.step()",
    doc=TORCH_PROFILER_DOC,
)

# The profiler recipe's one window around a model's first call holds the process's set-up: warm
# the model up before profiling, or let a schedule skip the first calls.
TORCH_WARM_CALL = Fix(
    text="Profile warmed-up calls: call the model once before the profiler starts (that call creates "
         "the CUDA context, initialises cuBLAS/cuDNN and loads the kernels), then profile a few calls, "
         "marking each with prof.step(), or let a schedule skip the first ones.",
    code="model(x)                      # warm-up call: the set-up happens here, untraced\n"
         "torch.cuda.synchronize()\n"
         "with torch.profiler.profile(\n"
         "        schedule=torch.profiler.schedule(wait=1, warmup=1, active=3),\n"
         "        on_trace_ready=torch.profiler.tensorboard_trace_handler(logdir)) as prof:\n"
         "    for _ in range(5):\n"
         "        model(x)\n"
         "        prof.step()",
    doc=TORCH_PROFILER_DOC,
)

PREFETCH = Remedy(
    text="Let tf.data prepare the next batches while the current step runs: end the pipeline with "
         "prefetch(tf.data.AUTOTUNE).",
    code="dataset = dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE)",
    doc=DATA_GUIDE,
    jax=JAX_PREFETCH,
    pytorch=TORCH_WORKERS,
)

PARALLEL_MAP = Remedy(
    text="Run the preprocessing function on several CPU cores; batching before map lets a "
         "vectorized function process a whole batch per call.",
    code="dataset = dataset.batch(batch_size)\n"
         "dataset = dataset.map(preprocess_batch, num_parallel_calls=tf.data.AUTOTUNE)",
    doc=DATA_GUIDE,
    jax=None,
    pytorch=TORCH_PINNED_COPIES,
)

CACHE_AND_INTERLEAVE = Remedy(
    text="Read files in parallel and cache what fits in memory (after the expensive, "
         "deterministic steps) so later epochs skip reading and decoding.",
    code="files = tf.data.Dataset.list_files(pattern)\n"
         "dataset = files.interleave(tf.data.TFRecordDataset, cycle_length=8,\n"
         "                           num_parallel_calls=tf.data.AUTOTUNE)\n"
         "dataset = dataset.map(decode, num_parallel_calls=tf.data.AUTOTUNE).cache()",
    doc=DATA_GUIDE,
    jax=None,
    pytorch=TORCH_LIGHTER_DATASET,
)

CACHE_AFTER_MAP = Remedy(
    text="The dataset is already in memory: cache it after its expensive, deterministic map steps "
         "so later epochs skip them (random augmentation goes after the cache).",
    code="dataset = dataset.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE).cache()\n"
         "dataset = dataset.shuffle(buffer_size).map(augment, num_parallel_calls=tf.data.AUTOTUNE)",
    doc=DATA_GUIDE,
    jax=None,
    pytorch=TORCH_LIGHTER_DATASET,
)

SYNTHETIC_INPUT_TEST = Remedy(
    text="Confirm the diagnosis: train a few steps on random tensors of the same shape. If the "
         "step time drops, the input pipeline is the bottleneck; if not, look elsewhere.",
    code="images = tf.random.uniform((batch_size, *image_shape))\n"
         "labels = tf.random.uniform((batch_size,), maxval=num_classes, dtype=tf.int32)\n"
         "synthetic = tf.data.Dataset.from_tensors((images, labels)).repeat()\n"
         "model.fit(synthetic, steps_per_epoch=50)",
    doc=GPU_PERF_GUIDE,
    jax=JAX_SYNTHETIC_INPUT_TEST,
    pytorch=TORCH_SYNTHETIC_INPUT_TEST,
)

TF_FUNCTION = Remedy(
    text="Run the whole training step as one tf.function graph instead of op by op from Python "
         "(Model.fit does this unless run_eagerly=True).",
    code="@tf.function\n"
         "def train_step(x, y):\n"
         "    with tf.GradientTape() as tape:\n"
         "        loss = loss_fn(y, model(x, training=True))\n"
         "    grads = tape.gradient(loss, model.trainable_variables)\n"
         "    optimizer.apply_gradients(zip(grads, model.trainable_variables))\n"
         "    return loss",
    doc=FUNCTION_GUIDE,
    jax=JAX_JIT_STEP,
    pytorch=TORCH_COMPILE,
)

XLA_JIT = Remedy(
    text="Compile the step with XLA: it fuses chains of small element-wise ops into a few "
         "kernels, so there are fewer launches per step.",
    code="model.compile(optimizer=optimizer, loss=loss, jit_compile=True)\n"
         "# or, in a custom loop:\n"
         "@tf.function(jit_compile=True)\n"
         "def train_step(x, y): ...",
    doc=XLA_GUIDE,
    jax=JAX_JIT_STEP,
    pytorch=TORCH_CUDA_GRAPHS,
)

LARGER_BATCH = Remedy(
    text="Use a larger batch (scaling the learning rate accordingly): the same number of kernel "
         "launches then does more work each, so fixed per-launch costs shrink relative to compute.",
    code="dataset = dataset.batch(256)  # e.g. up from 32, as far as device memory allows",
    doc=GPU_PERF_GUIDE,
    jax=JAX_LARGER_BATCH,
    pytorch=TORCH_LARGER_BATCH,
)

EAGER_FIT = Remedy(
    text="Drop run_eagerly=True from model.compile: model.fit then runs each step as one compiled "
         "tf.function graph instead of dispatching every op from Python (the eager dispatch, "
         "TFE_Py_FastPathExecute_C, is what fills the step). Keep it only to debug.",
    code="model.compile(optimizer=optimizer, loss=loss, metrics=metrics)   # run_eagerly=False, the default",
    doc=KERAS_FIT_DOC,
    jax=None,
    pytorch=None,
)

HOST_OPS_INTO_PIPELINE = Remedy(
    text="Move the ops that have no GPU kernel (named in the evidence) out of the training step into "
         "the input pipeline: in dataset.map they run on tf.data's threads ahead of the step, here and "
         "on a GPU machine later, where inside the step they would stall the GPU.",
    code="def preprocess(ids, label):\n"
         "    unique_ids, index = tf.unique(ids)     # the host-only op, now ahead of the step\n"
         "    return (unique_ids, index), label\n"
         "dataset = dataset.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)",
    doc=DATA_GUIDE,
    jax=None,
    pytorch=None,
)

STEPS_PER_EXECUTION = Remedy(
    text="Run several training steps per call into the compiled function, so Python and "
         "callback work between steps happens once per group of steps.",
    code="model.compile(optimizer=optimizer, loss=loss, steps_per_execution=32)",
    doc=KERAS_FIT_DOC,
    jax=JAX_SCAN_STEPS,
)

GPU_PRIVATE_THREADS = Remedy(
    text="Give each GPU its own host threads for launching kernels, so launches do not queue "
         "behind other host work. Set the variables before TensorFlow starts.",
    code="import os\n"
         "os.environ['TF_GPU_THREAD_MODE'] = 'gpu_private'\n"
         "os.environ['TF_GPU_THREAD_COUNT'] = '2'\n"
         "import tensorflow as tf",
    doc=GPU_PERF_GUIDE,
    jax=None,
)

LOG_DEVICE_PLACEMENT = Remedy(
    text="Print where every op runs to find the ones TensorFlow put on the CPU, then pin the "
         "model to the GPU explicitly.",
    code="tf.debugging.set_log_device_placement(True)\n"
         "strategy = tf.distribute.OneDeviceStrategy('/gpu:0')\n"
         "with strategy.scope():\n"
         "    model = build_model()",
    doc=GPU_GUIDE,
    jax=JAX_PLACEMENT,
)


# Fixes more than one check gives.
MIXED_PRECISION = Remedy(
    "Enable mixed precision before building the model: layers compute in float16 and keep "
    "float32 variables; Keras wraps the optimizer with dynamic loss scaling.",
    'import keras\nkeras.mixed_precision.set_global_policy("mixed_float16")\n\n'
    "model = build_model()\n"
    "# keep the model output (softmax / loss input) in float32 for numeric stability\n"
    'outputs = keras.layers.Activation("softmax", dtype="float32")(logits)',
    MIXED_PRECISION_GUIDE, jax=JAX_BF16, pytorch=TORCH_AUTOCAST)

TORCH_AUTOCAST_FP16 = Fix(
    text="Run the forward pass and loss under autocast in float16 and scale the loss with a GradScaler: "
         "this GPU's Tensor Cores (Volta/Turing) take float16 only, and float16 gradients need loss "
         "scaling not to underflow.",
    code="scaler = torch.amp.GradScaler(\"cuda\")  # before PyTorch 2.3: torch.cuda.amp.GradScaler()\n"
         "with torch.autocast(device_type=\"cuda\", dtype=torch.float16):\n"
         "    loss = loss_fn(model(x), y)\n"
         "scaler.scale(loss).backward()\n"
         "scaler.step(optimizer)\n"
         "scaler.update()",
    doc=TORCH_AMP_DOC)
# The same remedy where every GPU is a Volta or Turing: only its PyTorch form differs.
MIXED_PRECISION_FP16 = replace(MIXED_PRECISION, pytorch=TORCH_AUTOCAST_FP16)


def mixed_precision_remedy(gpus: list[tuple[str | None, int | None]]) -> Remedy:
    """The mixed-precision remedy for GPUS ((vendor, compute capability major) each): its PyTorch
    form autocasts to float16 with a GradScaler when every GPU takes only float16, else bfloat16."""
    fp16 = bool(gpus) and all(pytorch.autocast_dtype(vendor, major) == "float16" for vendor, major in gpus)
    return MIXED_PRECISION_FP16 if fp16 else MIXED_PRECISION


# PyTorch's form of "is the GPU usable": a CPU-only wheel or a CUDA build the driver cannot run says
# False, and a model or batch never moved with .to() computes on the CPU even when it says True.
TORCH_GPU_VISIBLE = Fix(
    text="Check that PyTorch can use the GPU (torch.cuda.is_available() is False with a CPU-only wheel, "
         "'+cpu' in torch.__version__, or a CUDA build newer than the driver supports), then move the model "
         "and every batch to it.",
    code="import torch\n"
         "print(torch.__version__, torch.version.cuda, torch.cuda.is_available())  # False: this build cannot use it\n"
         "device = torch.device('cuda')\n"
         "model = model.to(device)\n"
         "for x, y in loader:\n"
         "    x, y = x.to(device), y.to(device)\n"
         "    train_step(x, y)",
    doc="https://pytorch.org/get-started/locally/")

CHECK_GPU_VISIBLE = Remedy(
    text="Check that TensorFlow can use the GPU: it must list it, and the installed CUDA and cuDNN must "
         "be the versions this TensorFlow build was made with (pip install 'tensorflow[and-cuda]' brings "
         "matching ones).",
    code="import tensorflow as tf\n"
         "print(tf.config.list_physical_devices('GPU'))   # [] means TensorFlow cannot use the GPU\n"
         "build = tf.sysconfig.get_build_info()\n"
         "print(build.get('cuda_version'), build.get('cudnn_version'))  # must match the installed libraries",
    doc=GPU_GUIDE,
    jax=Fix(
        text="Check that JAX can use the GPU: jax.devices() must list GPU devices; a CPU-only jaxlib "
             "runs everything on the host. Install the CUDA build.",
        code="import jax\n"
             "print(jax.devices())          # [CpuDevice(id=0)] means JAX cannot use the GPU\n"
             "print(jax.default_backend())  # 'gpu' expected\n"
             "# pip install -U 'jax[cuda12]'",
        doc="https://docs.jax.dev/en/latest/installation.html"),
    pytorch=TORCH_GPU_VISIBLE,
)


# On a run without a GPU: each GPU fix's CPU form, or None where it only works on a GPU (the copy
# engine, pinned memory, CUDA decode and graphs, reading results back from the device, TF's GPU
# launch threads, Tensor Core precision).
_CPU_FORMS: tuple[tuple[Fix, Fix | None], ...] = (
    (TORCH_WORKERS, TORCH_WORKERS_ON_CPU),
    (TORCH_PINNED_COPIES, None),
    (TORCH_PREPROCESS_IN_WORKERS, TORCH_PREPROCESS_IN_WORKERS_ON_CPU),
    (TORCH_PREPROCESS_ON_GPU, None),
    (TORCH_LIGHTER_DATASET, TORCH_LIGHTER_DATASET_ON_CPU),
    (TORCH_SYNTHETIC_INPUT_TEST, TORCH_SYNTHETIC_INPUT_TEST_ON_CPU),
    (TORCH_NO_HOST_SYNC, None),
    (TORCH_CUDA_GRAPHS, None),
    (TORCH_TF32, None),
    (TORCH_AUTOCAST, None),
    (GPU_PRIVATE_THREADS.variant("tensorflow"), None),
    (LOG_DEVICE_PLACEMENT.variant("tensorflow"), None),
)
# The fixes that add or tune DataLoader workers: not the fix where a batch is cheaper than a hand-off.
_WORKER_FIXES: tuple[Fix, ...] = (TORCH_WORKERS, TORCH_WORKERS_ON_CPU, TORCH_FASTER_WORKERS)
# (fix, the RunFacts field that says the run has applied it, what is left to do or None).
_ALREADY_DONE: tuple[tuple[Fix, str, Fix | None], ...] = (
    (TORCH_WORKERS, "loader_workers", TORCH_FASTER_WORKERS),
    (TORCH_WORKERS_ON_CPU, "loader_workers", TORCH_FASTER_WORKERS),
    (TORCH_PREPROCESS_IN_WORKERS, "loader_workers", TORCH_PREPROCESS_IN_DATASET),
    (TORCH_PREPROCESS_IN_WORKERS_ON_CPU, "loader_workers", TORCH_PREPROCESS_IN_DATASET),
    (JAX_JIT_STEP, "jitted_step", None),
)
# Fixes that come first: one that undoes a setting the capture shows (offered only then), jitting
# a JAX step the trace shows dispatched op by op, and the
# one that is left when the run applied the usual first fix (with workers on, a DataLoader that
# still falls behind makes its samples too slowly; preprocessing in the loop after one belongs in its
# dataset). (fix, the RunFacts field it needs or None).
_LEADING: tuple[tuple[Fix, str | None], ...] = (
    (EAGER_FIT.variant("tensorflow"), None),
    (JAX_JIT_STEP, "op_by_op_step"),
    (TORCH_LIGHTER_DATASET, "loader_workers"),
    (TORCH_LIGHTER_DATASET_ON_CPU, "loader_workers"),
    (TORCH_PREPROCESS_IN_DATASET, "loader_workers"),
)
