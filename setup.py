"""Packaging for tb-gpuadvisor: a TensorBoard plugin and CLI that turn profiler
captures into ranked GPU performance fixes."""

from setuptools import Extension, setup

# One TensorFlow package per machine: the CPU-only build where it exists (x86_64).
TF_CPU = [
    "tensorflow-cpu>=2.16; platform_machine=='x86_64'",
    "tensorflow>=2.16; platform_machine!='x86_64'",
]
# Analysing a session's hosts on a running Dask cluster (--engine dask); local processes need nothing.
DASK = ["dask[distributed]>=2023.1"]
TEST_REQUIRES = [
    "pytest>=7",
    "fsspec>=2023.1",
    "playwright>=1.40",
    "xprof>=2.20",
    *TF_CPU,
    "jax>=0.4.20",
    *DASK,
    "torch>=2.0",       # the default Linux wheel: tests profile a tiny CPU training loop
    # The in-loop callbacks' tests train through these on the CPU (tiny models from a config, nothing
    # downloaded); lightning adds torchmetrics and pydantic, transformers tokenizers, safetensors and
    # huggingface_hub, and its Trainer needs accelerate.
    "lightning>=2.0",
    "transformers>=4.40",
    "accelerate>=0.26",
    "orjson>=3.9",      # the Kineto reader's fallback decoder, compared with msgspec in tests
]

setup(
    name="tb-gpuadvisor",
    version="0.1.0",
    description="TensorBoard Advisor tab: ranked GPU performance fixes from TensorFlow/JAX/PyTorch profiles",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=[
        "tb_gpuadvisor",
        "tb_gpuadvisor.input",
        "tb_gpuadvisor.input.xplane",
        "tb_gpuadvisor.input.kineto",
        "tb_gpuadvisor.vocab",
        "tb_gpuadvisor.model",
        "tb_gpuadvisor.trust",
        "tb_gpuadvisor.attribution",
        "tb_gpuadvisor.checks",
        "tb_gpuadvisor.multihost",
        "tb_gpuadvisor.frontend",
        "tb_gpuadvisor.schema",
    ],
    package_dir={"tb_gpuadvisor.frontend": "frontend"},
    package_data={"tb_gpuadvisor.frontend": ["*.js", "*.css", "*.html", "vendor/*", "LICENSE*"],
                  "tb_gpuadvisor.schema": ["*.json"]},
    # The C event decoder and interval algebra are optional: without a compiler the pure-Python
    # decoder and the numpy interval functions are used.
    ext_modules=[Extension("tb_gpuadvisor.input.xplane._wire", ["tb_gpuadvisor/input/xplane/_wire.c"],
                           optional=True),
                 Extension("tb_gpuadvisor.model._intervals", ["tb_gpuadvisor/model/_intervals.c"],
                           optional=True)],
    install_requires=[
        "tensorboard>=2.12",
        "protobuf>=4.21",
        "numpy>=1.23",
        "werkzeug>=2.0",
        "msgspec>=0.18",    # PyTorch (Kineto JSON) traces: typed decoding, see benchmarks/README.md
        # and their gzip files inflated by ISA-L (zlib where isal ships no wheel)
        "isal>=1.6; platform_machine in 'x86_64 AMD64 aarch64 arm64'",
    ],
    extras_require={
        # `make demo` picks one: demo (CPU-only TensorFlow) or demo-gpu (TensorFlow with CUDA).
        "demo": ["xprof>=2.20", *TF_CPU],
        "demo-gpu": ["xprof>=2.20", "tensorflow[and-cuda]>=2.16"],
        "test": TEST_REQUIRES,
        # XProf's Profile tab, which the evidence links open (not a requirement: see README).
        "profile": ["xprof>=2.20"],
        "remote": ["fsspec>=2023.1"],
        "dask": DASK,
    },
    entry_points={
        "tensorboard_plugins": ["gpu_advisor = tb_gpuadvisor.loader:GpuAdvisorLoader"],
        "console_scripts": ["tb-gpuadvisor = tb_gpuadvisor.cli:main"],
    },
)
