"""The XPlane adapter: ``<host>.xplane.pb`` files written by TensorFlow's and JAX's profilers,
read by ``model.build``: ``model/classify.py`` sets each event's kind from the name rules of
``vocab/`` (tensorflow.py, xla.py, hlo.py, jax.py, gpu.py)."""

from __future__ import annotations

from tb_gpuadvisor.model.build import HostCapture, read_host
from tb_gpuadvisor.xspace.reader import Opener


def read(path: str, host: str, opener: Opener | None = None, budget: int | None = None) -> HostCapture:
    return read_host(path, host, opener, budget)
