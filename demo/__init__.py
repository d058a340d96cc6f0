"""Demo trainer: small Keras 3 jobs that each plant one performance problem for the Advisor.

Run ``python -m demo.train --help``.  Only this package imports TensorFlow; the
``tb_gpuadvisor`` package never does.
"""
