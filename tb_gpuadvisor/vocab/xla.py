"""What XLA and PjRt runtime names mean: the executables, executors and threads that run
compiled programs, the compiler's own work and its autotuning, and XLA-side op names.

Facts read from JAX (ROCm, TPU, CPU) and TensorFlow captures.  HLO instruction names (the device events of an XLA program) are read by
``vocab/hlo.py``.
"""

from __future__ import annotations

import re

# Lines of a GPU plane that the profiler derives from the streams (in TensorFlow's and JAX's
# captures alike); not device activity.
DERIVED_DEVICE_LINES = frozenset({
    "TensorFlow Ops", "TensorFlow Name Scope", "Steps", "XLA Modules", "Async XLA Ops",
    "XLA TraceMe", "Overlay", "Framework Ops", "Framework Name Scope", "Source code",
    "Launch Stats", "Host Offload Ops",
})
# The derived lines that carry facts: the step annotations, the XLA program runs, and a TPU's ops.
STEPS_LINE = "Steps"
XLA_MODULES_LINE = "XLA Modules"
TPU_OPS_LINE = "XLA Ops"

# Host events that run a loaded XLA executable (TPU runtimes and PjRt's C API).
FUNCTION = re.compile(r"^TfrtTpuLoadedExecutable::Execute$|^PjRtCApiLoadedExecutable::Execute$")
# PjRt and the XLA GPU runtime's thunks: executor work around programs, not ops.
EXECUTOR = re.compile(r"^PjRt|^ThunkExecutor|^Thunk::|^ThreadpoolListener|^BufferSequencingEvent")

# XLA's CPU backend runs the compiled HLO instructions ("dot", "ynn_fusion.1") on threads of
# its own pools (names seen in JAX CPU captures); those events are the computation itself.
CPU_THREAD = re.compile(r"^(tf_)?XLA(Eigen|PjRtCpuClient)")
# The thread that runs a compiled program for one device ("py_xla_execute", one per device).
EXECUTE_THREAD_PREFIX = "py_xla_execute"
# On the CPU, PjRt's client threads ("tf_XLAPjRtCpuClient/N") run each program: one top-level
# ThunkExecutor::Execute per run, followed by a wait for the run's parallel tasks when it has any.
# The host's dispatch of a run ("CommonPjRtLoadedExecutable::ExecuteHelperOnSingleDevice", older
# jaxlib "TfrtCpuExecutable::ExecuteHelper") returns before the run (asynchronous dispatch), and
# runs execute in the order they were dispatched. Seen in jaxlib 0.4-0.10 CPU captures.
CPU_CLIENT_THREAD = re.compile(r"^(tf_)?XLAPjRtCpuClient")
CPU_RUN = "ThunkExecutor::Execute"
CPU_RUN_WAIT = "ThunkExecutor::Execute (wait for completion)"
DISPATCH = re.compile(r"Executable::ExecuteHelper")

# cuDNN/XLA autotuning runs these checker kernels around every candidate algorithm.
AUTOTUNE_KERNEL = re.compile(r"redzone", re.IGNORECASE)
# Host events of tracing or compiling a function (TensorFlow and JAX names seen in captures).
COMPILE = re.compile(r"backend_compile|::Compile$|Compiler::|trace_to_jaxpr|XlaCompile|_XlaCompile|"
                     r"lower_jaxpr|jaxpr_to_mlir|FuncGraph|tracing", re.IGNORECASE)

# XLA instructions that lower to GEMM / convolution libraries (JAX, jit_compile=True).
TENSOR_CORE_ELIGIBLE = re.compile(r"^%?(?:dot|convolution|cublas|cudnn|gemm|triton_gemm)", re.IGNORECASE)
# The op of an XLA GPU kernel is the placeholder "XlaModule:", not the source op.
MODULE_OP_PREFIX = "XlaModule"
