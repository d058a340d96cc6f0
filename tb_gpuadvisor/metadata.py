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

# The TensorBoard plugin the evidence links open (XProf's Profile tab), and what installs it: it
# is not a requirement (it adds about 230 MB to an environment with TensorBoard: XProf itself, then
# Cloud Storage, gRPC and DuckDB), so the tab says what to install where it is missing.
PROFILE_PLUGIN = "profile"
PROFILE_INSTALL = 'pip install xprof (or "tb-gpuadvisor[profile]"), then restart TensorBoard'
