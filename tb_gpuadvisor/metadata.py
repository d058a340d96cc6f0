"""Names shared by the plugin backend, the frontend and the CLI."""

PLUGIN_NAME = "gpu_advisor"
TAB_NAME = "Advisor"
SCHEMA_VERSION = 1

# Where TensorBoard's profiler callback and tf.profiler write captures.
PROFILE_DIR = ("plugins", "profile")
XPLANE_SUFFIX = ".xplane.pb"
