"""What TensorFlow, Keras and tf.data event and thread names mean.

Facts read from TensorFlow 2.2-2.21 captures (``../shared/corpus``): the step markers Keras and
custom loops write, tf.data's iterator and stage names, graph ops ("scope/name:Type"), eager
dispatch, the summary writer ops of the TensorBoard callback, the GPU launch threads and the
allocator names.
"""

from __future__ import annotations

import re

from tb_gpuadvisor.kinds import InputStage, StageOrigin

FRAMEWORK = "tensorflow"

# Step markers written by Keras: Keras 2's TraceContext and Keras 3's "Profiled batch" (model.fit's
# own TensorBoard callback).
KERAS2_STEP = "TraceContext"
KERAS3_STEP = "Profiled batch"
STEP_MARKERS = frozenset({KERAS3_STEP, KERAS2_STEP})

# The op that waits for tf.data's next batch, as its kernel's compute call.
INPUT_WAIT = frozenset({
    "IteratorGetNextOp::DoCompute", "IteratorGetNextAsOptionalOp::DoCompute",
    "MultiDeviceIteratorGetNextFromShardOp::DoCompute",
})
# tf.data stages on the host timeline ("Iterator::Model::Prefetch::Map").
INPUT_STAGE_PREFIX = "Iterator::"
# Stages of a parallel map/interleave that record themselves without the Iterator:: prefix.
INPUT_STAGE_PREFIXES = (INPUT_STAGE_PREFIX, "ParallelMap", "ParallelInterleave")
# tf.data runs its producers (and their map functions' ops) on threads of its own.
INPUT_PIPELINE_THREAD_PREFIX = "tf_data_"

# A graph op, "scope/name:Type".
GRAPH_OP = re.compile(r"^[^\s:]+:[A-Za-z_][A-Za-z0-9_]*$")
# A tf.function's graph ("__inference_train_step_123") or a forward pass of one.
FUNCTION = re.compile(r"^__inference_|^__forward_|^[a-z_]*_function$")
# Eager dispatch wraps both single eager ops and whole tf.function calls, so it is executor
# work, not an op: counting it as one would count the ops of a function twice.
EXECUTOR = re.compile(r"^Executor|^Eager(Kernel|Local)?Execute")
# An op run eagerly, as the Python thread records it ("EagerLocalExecute: AddV2").
EAGER_DISPATCH = re.compile(r"^Eager\w*Execute: ")
# One op executed eagerly ("EagerLocalExecute: Conv2D"); calls of whole functions ("__inference_...")
# wrap the step and are not one op.
EAGER_SINGLE_OP = re.compile(r"EagerLocalExecute: (?!__)")
# A tf.function call ("EagerLocalExecute: __inference_multi_step_on_iterator_12", "FunctionRun");
# an eager fit (run_eagerly=True) records none.
GRAPH_CALL = re.compile(r"__inference_|^FunctionRun$")

# Allocator events of the BFC allocator, which names itself after its GPU ("GPU_0_bfc").
MEMORY_ALLOCATION = "MemoryAllocation"
MEMORY_EVENTS = frozenset({MEMORY_ALLOCATION, "MemoryDeallocation"})
GPU_ALLOCATOR = re.compile(r"^GPU_(\d+)_bfc$")
GPU_ALLOCATOR_PREFIX = "GPU_"
# Where a capture's allocator records come from, for one that has none.
MEMORY_RECORDS_HINT = ("TensorFlow records them when the profiler's memory tracking is on (the default for "
                       "tf.profiler captures of GPU runs).")
# Ops that initialise a variable sit in its "/Initializer/" scope ("dense/kernel/Initializer/random_uniform").
INITIALIZER_SCOPE = "/Initializer/"

# Handing the input batch from the host to the GPU: the iterator's outputs sent to the device
# ("IteratorGetNext/_1:_Send") and TF's host-to-device send of function inputs. The GPU idle
# behind them waits for input, not for launches.
INPUT_SEND = re.compile(r"IteratorGetNext[^:]*:_Send|^_Send input \d+ from \S*CPU\S* to \S*GPU")

# A distribution strategy's per-replica ops carry the replica in their name ("replica_1/...").
REPLICA = re.compile(r"replica_(\d+)")
# TF_GPU_THREAD_MODE=gpu_private gives each GPU its own launch threads ("tf_gpu_private_0").
GPU_PRIVATE_THREAD = re.compile(r"^tf_gpu_private_(\d+)")


def replica_scope(index: int) -> str:
    return f"replica_{index}"


def gpu_private_thread(index: int) -> str:
    return f"tf_gpu_private_{index}"

# Eigen's element-wise kernels spell their functors into the name ("scalar_conversion_op"...).
EIGEN_ELEMENTWISE_KERNEL = "Eigen::internal::EigenMetaKernel"

# The TensorBoard callback's trace export (and any summary written after a step) runs these ops
# after the step's own call returned; a summary writer op always comes last. Seen in TF 2.2-2.21.
EXPORT_SEQUENCE = re.compile(r"(^|: )(LogicalAnd|Identity|WriteSummary|FlushSummaryWriter|CloseSummaryWriter)(:|$)")
SUMMARY_WRITER = re.compile(r"(^|: )(WriteSummary|FlushSummaryWriter|CloseSummaryWriter)(:|$)")

# tf.data stages that only hand over elements another thread produced; their self time is waiting
# for that producer, so they never count as "the slowest stage" themselves.
BUFFER_STAGES = frozenset({"Model", "Root", "Prefetch", "MaxIntraOpParallelism", "PrivateThreadPool"})
# tf.data stages that run their function on several elements at once.
PARALLEL_STAGES = ("ParallelMap", "MapAndBatch", "ParallelBatch", "ParallelInterleave")
# Sources of a pipeline held in memory (from_tensor_slices, from_tensors, range) and stage kinds
# that read files (TFRecordDataset, TextLineDataset, FixedLengthRecordDataset, list_files, and
# interleave, which is how files are read in parallel).
IN_MEMORY_SOURCES = frozenset({"TensorSlice", "FromTensor", "Range"})
FILE_STAGES = ("TFRecord", "TextLine", "FixedLengthRecord", "ListFiles", "MatchingFiles", "Interleave",
               "ParallelInterleave")
# Stage kinds of a prefetch, of a sequential map, and of a map tf.data fused with its batch.
PREFETCH_STAGE = "Prefetch"
SEQUENTIAL_MAP_STAGES = ("Map", "MapV2")
MAP_AND_BATCH_STAGE = "MapAndBatch"
# A stage's dataset names the dataset ops behind it: "MapDataset:2", several fused into one stage
# as "fused(MapDataset:2,BatchDatasetV2:3)", and "inject/..." for the ones tf.data inserted itself.
FUSED_DATASET_PREFIX = "fused("
INJECTED_DATASET_PREFIX = "inject/"
MAP_DATASET_PREFIX = "Map"
PARALLEL_DATASETS = ("ParallelMap", "ParallelInterleave", "ParallelBatch")
SEQUENTIAL_MAP_DATASETS = ("MapDataset", "MapDatasetV2")
_INPUT_INDEX = re.compile(r"\[\d+\]$")
_DATASET_ID = re.compile(r":\d+$")


def stage_kind(long_name: str) -> str:
    """"Iterator::Model::ParallelMapV2::Zip[0]::FlatMap" -> "FlatMap"."""
    return _INPUT_INDEX.sub("", long_name.rsplit("::", 1)[-1])


def dataset_ops(dataset_name: str) -> list[str]:
    """"fused(MapDataset:2,BatchDatasetV2:3)" -> ["MapDataset", "BatchDatasetV2"]."""
    fused = dataset_name.startswith(FUSED_DATASET_PREFIX)
    inner = dataset_name[len(FUSED_DATASET_PREFIX):-1] if fused else dataset_name
    return [_DATASET_ID.sub("", part.strip()) for part in inner.split(",") if part.strip()]


def _stage_ancestors(long_name: str) -> frozenset[str]:
    """The stages a stage is nested in: every name it starts with followed by "::" or "[" (an
    input of a Zip is "...::Zip[0]::...")."""
    parts = long_name.split("::")
    prefixes = ["::".join(parts[:i]) for i in range(1, len(parts))]
    indexed = [p for p in prefixes + [long_name] if _INPUT_INDEX.search(p)]
    return frozenset(prefixes + [p[:p.rindex("[")] for p in indexed])


def _stage_origin(kind: str, dataset: str) -> StageOrigin:
    """What the stage's dataset name DATASET says the user wrote."""
    ops = dataset_ops(dataset)
    prefetch = kind.startswith(PREFETCH_STAGE)
    injected = prefetch and dataset.startswith(INJECTED_DATASET_PREFIX)
    fused = kind == MAP_AND_BATCH_STAGE and any(op.startswith(MAP_DATASET_PREFIX) for op in ops)
    return StageOrigin(prefetch=prefetch and not injected,
                       parallel=any(op.startswith(PARALLEL_DATASETS) for op in ops),
                       sequential_map=any(op in SEQUENTIAL_MAP_DATASETS for op in ops),
                       inserted="prefetch (inject_prefetch)" if injected else
                       "MapAndBatch (your map fused with batch, still sequential)" if fused else None)


def input_stage(long_name: str, dataset: str | None) -> InputStage:
    """A tf.data stage's facts from its name and, where recorded, its dataset's name."""
    kind = stage_kind(long_name)
    return InputStage(kind=kind, ancestors=_stage_ancestors(long_name), prefetch=kind.startswith(PREFETCH_STAGE),
                      parallel=kind.startswith(PARALLEL_STAGES), sequential_map=kind in SEQUENTIAL_MAP_STAGES,
                      buffer=kind in BUFFER_STAGES, in_memory_source=kind in IN_MEMORY_SOURCES,
                      reads_files=kind.startswith(FILE_STAGES),
                      origin=_stage_origin(kind, dataset) if dataset else None)


# Op types that run Python inside a dataset function (they also hold the GIL), and the API that made them.
PYTHON_OPS = {"EagerPyFunc": "tf.py_function", "PyFunc": "tf.numpy_function",
              "PyFuncStateless": "tf.numpy_function"}
# Op types TensorFlow has no GPU kernel for (the guide's example is tf.unique).
HOST_ONLY_OPS = frozenset({
    "Unique", "UniqueV2", "UniqueWithCounts", "PyFunc", "EagerPyFunc", "StringSplit",
    "StringSplitV2", "StringToNumber", "RegexReplace", "DecodeJpeg", "DecodePng", "DecodeImage",
    "ParseExample", "ParseExampleV2",
})

# Ops that move or describe data rather than compute; they run on the host by design.
BOOKKEEPING_OPS = frozenset({
    "_Send", "_Recv", "_HostSend", "_HostRecv", "_Arg", "_Retval", "_DeviceArg", "_DeviceRetval",
    "Identity", "IdentityN", "NoOp", "Const", "Placeholder", "VarHandleOp", "ReadVariableOp",
    "AssignVariableOp", "Shape", "ShapeN", "Size", "Rank", "Reshape", "ExpandDims", "Squeeze",
    "StopGradient", "IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional",
    "OptionalGetValue", "OptionalHasValue", "MultiDeviceIteratorGetNextFromShard",
})

# Op types whose GPU kernels can run on Tensor Cores.
TENSOR_CORE_ELIGIBLE_OPS = frozenset({
    "MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "_FusedMatMul",
    "Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "_FusedConv2D",
    "Conv3D", "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2",
    "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
    "DepthwiseConv2dNativeBackpropFilter", "Einsum", "CudnnRNN", "CudnnRNNV2", "CudnnRNNV3",
    "CudnnRNNBackprop", "CudnnRNNBackpropV2", "CudnnRNNBackpropV3",
})
# The transposes the layout optimizer inserts around convolutions when the model's layout is
# not the one cuDNN prefers.
# A convolution op or op type, in any case (Conv2D, Conv3DBackpropInputV2, DepthwiseConv2dNative,
# an XLA "convolution").
CONV_OP = re.compile(r"conv", re.IGNORECASE)
LAYOUT_OP = re.compile(r"LayoutOptimizer|NHWCToNCHW|NCHWToNHWC", re.IGNORECASE)
# The loss scaling of mixed precision (LossScaleOptimizer and its ops).
LOSS_SCALE = re.compile(r"loss_?scal|LossScale", re.IGNORECASE)

# Names only TensorFlow writes: how a capture is known to be TensorFlow's.
HOST_HINTS = ("ExecutorState::Process", "EagerKernelExecute", KERAS2_STEP, KERAS3_STEP,
              "TFE_", "IteratorGetNextOp::DoCompute", "__inference_")
THREAD_HINT = "tf_Compute"


def is_graph_op(name: str) -> bool:
    """A TensorFlow graph op ("scope/name:Type"): placed on a device by the framework.  PyTorch's
    ops ("aten::add") run where their tensors are, so they are never misplaced graph ops."""
    return bool(GRAPH_OP.match(name))


def gpu_allocator_index(allocator: str) -> int | None:
    """The GPU a TensorFlow allocator serves ("GPU_0_bfc" -> 0), or None for other allocators."""
    match = GPU_ALLOCATOR.match(allocator)
    return int(match.group(1)) if match else None


def is_input_pipeline_thread(thread_name: str) -> bool:
    """tf.data runs its producers (and their map functions' ops) on threads of its own."""
    return thread_name.startswith(INPUT_PIPELINE_THREAD_PREFIX)


def op_key(op_name: str) -> str:
    """The op's node name without its type suffix ("scope/MatMul:MatMul" -> "scope/MatMul").

    Device events carry the TF op as "scope/name:Type" (or just the node name), host
    events as "scope/name:Type"; comparing node names links the two.
    """
    base = op_name.split("#", 1)[0]
    head, sep, tail = base.rpartition(":")
    return head if sep and "/" not in tail else base
