"""TensorFlow, Keras, XLA, JAX and PyTorch event names are spelled only in the vocabularies
(issues 22 and 33).

A stage that matches a framework's names itself would silently do nothing for a capture of
another format; the names belong to ``tb_gpuadvisor/vocab`` (read by the format adapters at
classification time), and stages import them from there.  The test reads string literals in
code (not docstrings or comments, which may explain the names) and fails on distinctive name
tokens.

Allowed to spell framework names:
- ``input/``, ``vocab/``: the input stage (its adapters) and the vocabularies themselves.
- ``keras.py``, ``jax.py``, ``inloop.py``: the profiling helpers run inside the user's
  framework and write the names the vocabularies read (Keras 3's "Profiled batch" marker).
- ``checks/fixes.py`` and the arguments of ``Fix(...)``/``Remedy(...)`` anywhere in checks/:
  fix texts and their code snippets are meant to be in the framework's own words.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tb_gpuadvisor

PACKAGE = Path(tb_gpuadvisor.__file__).parent
ALLOWED_DIRS = ("input", "vocab")
ALLOWED_FILES = ("keras.py", "jax.py", "inloop.py", "checks/fixes.py")
# Constructors whose arguments are fix texts, written for the user in the framework's words.
FIX_CALLS = frozenset({"Fix", "Remedy"})
# Name tokens only TensorFlow, Keras, tf.data, XLA, JAX or PyTorch write (case-sensitive).
TOKENS = (
    "tf_Compute", "Iterator::", "EagerLocalExecute", "ExecutorState", "XlaCompile", "backend_compile",
    "PjitFunction", "jit_", "tf_gpu_private", "TraceContext", "Profiled batch", "redzone",
    "WriteSummary", "IteratorGetNext", "_Send", "replica_", "EigenMetaKernel", "__inference_",
    "PjRt", "py_xla_execute", "tf_data_", "XlaModule", "cpp_pjit", "EagerPyFunc", "trace_to_jaxpr",
    "ThunkExecutor", "_bfc", "LossScale", "MemoryAllocation", "DoCompute",
    # PyTorch (Kineto) and the CUDA runtime calls its traces name.
    "aten::", "autograd::", "ProfilerStep#", "enumerate(DataLoader", "record_param_comms", "nccl:",
    "cudaLaunchKernel", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy",
    # Set-up the adapters now mark (issue 41): context creation, lazy loading, library queries,
    # graph launches, torch.compile's phases; and tf.data's dataset names.
    "cudaFree", "hipFree", "cuModuleLoad", "cudaGetSymbolAddress", "cudaFuncGetAttributes",
    "cudaGraphLaunch", "dynamo_timed", "torch/_dynamo", "inject/", "fused(", "MapAndBatch",
)

# The stages after the adapters and the model read kinds and facts, not names: none of their modules
# imports a vocabulary, but these, whose name rules are still to move into the adapters (issue 41).
# The list only shrinks: a module that stops importing one must leave it.
LATER_STAGES = ("trust", "attribution", "checks", "multihost")
STILL_READ_NAMES = frozenset({
    "attribution/breakdown.py", "attribution/replay.py",
    "checks/collectives.py", "checks/eval_mode.py", "checks/fixes.py", "checks/graph_fixes.py",
    "checks/helper_frames.py", "checks/host_overhead.py", "checks/kernel_launch.py", "checks/memcpy.py",
    "checks/memory.py", "checks/multi_gpu_imbalance.py", "checks/op_placement.py", "checks/precision.py",
    "checks/profile_quality.py", "checks/sync_stalls.py", "checks/tensor_core.py", "checks/unfused_ops.py",
    "checks/xla_ops.py",
    "trust/coverage.py", "trust/placement.py", "trust/typical.py", "trust/windows.py",
})
# Model modules that have handed their name rules to the adapters.
MODEL_WITHOUT_NAMES = ("model/pipeline.py",)


def _docstrings(tree: ast.AST) -> set[int]:
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, nodes) and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}


def _fix_texts(tree: ast.AST) -> set[int]:
    """String constants inside a Fix(...) or Remedy(...) call."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in FIX_CALLS:
                inside.update(id(n) for n in ast.walk(node) if isinstance(n, ast.Constant))
    return inside


def framework_names(source: str) -> list[tuple[int, str, str]]:
    """(line, token, literal) of every string literal in code that spells a framework name."""
    tree = ast.parse(source)
    skip = _docstrings(tree) | _fix_texts(tree)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            hits += [(node.lineno, token, node.value) for token in TOKENS if token in node.value]
    return sorted(hits)


def _checked_files() -> list[Path]:
    files = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.split("/", 1)[0] not in ALLOWED_DIRS and rel not in ALLOWED_FILES:
            files.append(path)
    return files


def test_scanner_finds_names_in_code_only():
    source = ('"""Reads tf_gpuadvisor threads named tf_gpu_private_N."""\n'
              'THREAD = re.compile(r"^tf_gpu_private_(\\d+)")  # tf_Compute\n'
              'FIX = Fix("Use replica_ctx", "x = TraceContext()")\n'
              'label = f"{n} calls of cpp_pjit_shard_arg_fallback"\n')
    assert [(line, token) for line, token, _ in framework_names(source)] == [
        (2, "tf_gpu_private"), (4, "cpp_pjit"), (4, "jit_")]


def test_no_framework_names_outside_the_vocabularies():
    files = _checked_files()
    assert len(files) > 50, "the package was not found"
    found = [f"{path.relative_to(PACKAGE)}:{line}: {token!r} in {literal[:60]!r}"
             for path in files for line, token, literal in framework_names(path.read_text())]
    assert not found, "framework names outside tb_gpuadvisor/vocab:\n" + "\n".join(found)


def imports_vocabulary(source: str) -> bool:
    """Whether SOURCE imports ``tb_gpuadvisor.vocab`` or anything in it, in any spelling."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(a.name.startswith("tb_gpuadvisor.vocab") for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module is not None and (
                node.module.startswith("tb_gpuadvisor.vocab")
                or (node.module == "tb_gpuadvisor" and any(a.name == "vocab" for a in node.names))):
            return True
    return False


def test_import_scanner_finds_every_spelling():
    assert imports_vocabulary("from tb_gpuadvisor.vocab import pytorch\n")
    assert imports_vocabulary("from tb_gpuadvisor.vocab.gpu import SYNC_CALL\n")
    assert imports_vocabulary("import tb_gpuadvisor.vocab.tensorflow as tf\n")
    assert imports_vocabulary("def f():\n    from tb_gpuadvisor import vocab\n")
    assert not imports_vocabulary("from tb_gpuadvisor.kinds import HostEventKind  # not tb_gpuadvisor.vocab\n")


def test_later_stages_read_kinds_not_vocabularies():
    """trust/, attribution/, checks/ and multihost/ read what the adapters decided (event kinds,
    InputStage facts), not the vocabularies; only the modules still listed may import one."""
    files = {path.relative_to(PACKAGE).as_posix(): path for stage in LATER_STAGES
             for path in sorted((PACKAGE / stage).rglob("*.py"))}
    files.update({rel: PACKAGE / rel for rel in MODEL_WITHOUT_NAMES})
    assert len(files) > 30, "the package was not found"
    importing = {rel for rel, path in files.items() if imports_vocabulary(path.read_text())}
    assert not importing - STILL_READ_NAMES, "vocabulary imported after the adapters: " + ", ".join(
        sorted(importing - STILL_READ_NAMES))
    assert not STILL_READ_NAMES - importing, "no longer imports a vocabulary, drop it from STILL_READ_NAMES: " + \
        ", ".join(sorted(STILL_READ_NAMES - importing))
