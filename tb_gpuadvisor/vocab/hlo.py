"""What an XLA-compiled device event is, read from the HLO names the profiler records.

Where the names come from (checked on real JAX captures for ROCm GPUs, TPU and CPU):
- XLA GPU kernels carry stats ``hlo_op`` (the HLO instruction: ``input_transpose_fusion.1``,
  ``gemm_fusion_dot.6``, ``cudnn-conv.1.0``, ``custom-call.1``), ``hlo_module``
  (``jit_<function>``) and ``name`` (the JAX source op, ``jit(f)/jit(main)/conv_general_dilated``,
  or the name of the array a transpose reads, such as ``kernel``); their ``tf_op`` is the
  placeholder ``XlaModule:``.
- TPU "XLA Ops" events are named after the instruction's HLO text
  (``%copy-done.2 = f32[...] copy-done(...)``) and carry the JAX source op in ``tf_op``.
- XLA names a fusion after its kind and its root instruction (``loop_convert_fusion``,
  ``input_transpose_fusion``, ``gemm_fusion_dot``), so the name says what the fusion mostly does.

The categories answer the questions an expert asks of an XLA profile: how much time goes
to the math (convolutions, GEMMs, library calls such as fused attention), how much to moving
data between layouts, dtypes and memory spaces, and how much to communication.
"""

from __future__ import annotations

import re

from tb_gpuadvisor.vocab import jax

CONVOLUTION = "convolution"
GEMM = "dot/GEMM"
CUSTOM_CALL = "custom call"
TRANSPOSE = "layout transpose"
CONVERT = "dtype convert"
REDUCTION = "reduction"
FUSION = "other fusion"
COLLECTIVE = "collective"
COPY = "copy"
OTHER = "other"
# Categories that only move or re-encode data: removable by choosing layouts and dtypes.
CONVERSIONS = (TRANSPOSE, CONVERT)

# In order: the first rule that matches the instruction name decides.
_RULES: tuple[tuple[str, re.Pattern], ...] = (
    (COLLECTIVE, re.compile(r"all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute"
                            r"|all_reduce|all_gather|reduce_scatter|nccl|rccl", re.IGNORECASE)),
    (COPY, re.compile(r"^copy(?:-start|-done)?(?:[._]\d+)*$|^memcpy|^dynamic-update-slice", re.IGNORECASE)),
    (CONVOLUTION, re.compile(r"conv(?:olution)?(?![a-z])|cudnn-conv|miopen", re.IGNORECASE)),
    (GEMM, re.compile(r"gemm|(?<![a-z])dot(?![a-z])|cublas|hipblas|matmul", re.IGNORECASE)),
    (CUSTOM_CALL, re.compile(r"custom-call|_ffi|fmha|attn|attention", re.IGNORECASE)),
    (TRANSPOSE, re.compile(r"transpose", re.IGNORECASE)),
    (CONVERT, re.compile(r"convert", re.IGNORECASE)),
    (REDUCTION, re.compile(r"reduce", re.IGNORECASE)),
    (FUSION, re.compile(r"fusion", re.IGNORECASE)),
)

_HLO_TEXT = re.compile(r"^%?([\w.-]+)\s*=")


def instruction(name: str) -> str:
    """The HLO instruction name of an event named after its HLO text, else the name itself."""
    match = _HLO_TEXT.match(name)
    return match.group(1) if match else name


def category(hlo_op: str) -> str:
    """The category of an HLO instruction name (see the module docstring)."""
    for label, pattern in _RULES:
        if pattern.search(hlo_op):
            return label
    return OTHER


def base_name(hlo_op: str) -> str:
    """An instruction name without XLA's uniquifying suffix: "input_transpose_fusion.1" -> "input_transpose_fusion"."""
    return re.sub(r"(?:[._]\d+)+$", "", hlo_op)


def module_key(function: str) -> str | None:
    """The XLA module a JAX function event runs: "PjitFunction(f)", "jit_f:XLA GPU module",
    "jit_f(1234)" (a TPU XLA Modules run) -> "jit_f"; None for other (TensorFlow) functions."""
    match = jax.PJIT_CALL.match(function)
    if match:
        return jax.MODULE_PREFIX + re.sub(r"\W", "_", match.group(1))
    match = jax.MODULE.match(function)
    return match.group(1) if match else None
