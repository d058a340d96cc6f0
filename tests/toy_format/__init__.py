"""A toy third capture format, for tests only (tests/test_toy_format.py): ``<host>.toy.json``
files, each ``{"events": [{"name", "ts", "dur", "on", "step", "corr"}]}`` with times in us.

It is what a new format needs and nothing more: this package (its reader, ``read.py``, and its
vocabulary, ``vocab.py``) and one ``tb_gpuadvisor.input.register`` call with ADAPTER.
"""

from __future__ import annotations

from tb_gpuadvisor.input import Adapter

ADAPTER = Adapter("toy", (".toy.json",), reader="toy_format.read:read", xprof=False)
