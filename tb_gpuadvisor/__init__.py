"""tb-gpuadvisor: ranked GPU performance fixes from TensorFlow and JAX profiles.

Importing the package is cheap on purpose (TensorBoard imports every plugin
at start-up); the heavy modules load when an analysis runs.
"""

__version__ = "0.1.0"
