"""The timeline model of a capture session: the hosts' tables (``tb_gpuadvisor.timeline``) joined
into one session (``session.py``), its training steps found (``steps.py``), and the views later
stages derive from the tables (``kernels.py``, ``intervals.py``, ``pipeline.py``).
"""
