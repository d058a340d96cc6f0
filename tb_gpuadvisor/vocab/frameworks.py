"""Rules that tell the frameworks apart, or span them: which framework wrote a capture, and
which GPU an allocator serves however its framework names it."""

from __future__ import annotations

from tb_gpuadvisor.vocab import jax, pytorch, tensorflow


def allocator_gpu(allocator: str) -> int | None:
    """The GPU an allocator serves, however its framework names it: TensorFlow's "GPU_0_bfc" or
    PyTorch's caching allocator "cuda:0"; None for host allocators."""
    index = tensorflow.gpu_allocator_index(allocator)
    return pytorch.gpu_allocator_index(allocator) if index is None else index


def framework_from_names(names: list[str], threads: list[str]) -> str:
    """Guess which framework wrote the capture from host event and thread names."""
    if any(n.startswith(pytorch.HOST_HINTS) for n in names):
        return pytorch.FRAMEWORK
    tf = (any(n.startswith(tensorflow.HOST_HINTS) for n in names)
          or any(t.startswith(tensorflow.THREAD_HINT) for t in threads))
    if tf and not any(n.startswith(jax.PJIT_PREFIX) for n in names):
        return tensorflow.FRAMEWORK
    if any(n.startswith(jax.HOST_HINTS) for n in names) or any(t.startswith(jax.THREAD_HINT) for t in threads):
        return jax.FRAMEWORK
    return "unknown"
