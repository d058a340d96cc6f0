"""Names shared by the plugin backend, the frontend and the CLI."""

PLUGIN_NAME = "gpu_advisor"
TAB_NAME = "Advisor"
SCHEMA_VERSION = 1

# Where TensorBoard's profiler callback and tf.profiler write captures.
PROFILE_DIR = ("plugins", "profile")
XPLANE_SUFFIX = ".xplane.pb"
# What torch.profiler.tensorboard_trace_handler (Kineto) writes into a run folder.
KINETO_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
# Endings of files that are Chrome traces (PyTorch's export_chrome_trace, per-rank layouts) only
# when their first bytes say so.
CHROME_TRACE_SUFFIXES = (".json", ".json.gz")
