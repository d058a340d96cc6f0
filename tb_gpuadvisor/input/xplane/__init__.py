"""The XPlane adapter: ``<host>.xplane.pb`` files written by TensorFlow's and JAX's profilers.

``reader.py`` finds the planes of a file without decoding them, ``decode.py`` (with the C
decoder ``_wire.c``, and ``schema.py`` for the pure-Python one) turns a plane into numpy
columns, ``build.py`` turns those into the host's tables (``input.capture.HostCapture``), and
``classify.py`` sets each event's kind from the name rules of ``vocab/`` (tensorflow.py,
xla.py, hlo.py, jax.py, gpu.py), once per distinct name.
"""
