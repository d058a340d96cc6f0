"""TensorBoard entry point for the Advisor tab.

TensorBoard imports every registered loader at start-up, so this module
imports only TensorBoard's plugin base; the plugin module (and everything it
pulls in) loads when TensorBoard asks for the plugin instance.
"""

from tensorboard.plugins import base_plugin


class GpuAdvisorLoader(base_plugin.TBLoader):
    """Creates the Advisor plugin; registered as the `gpu_advisor` entry point."""

    def load(self, context: base_plugin.TBContext) -> base_plugin.TBPlugin:
        from tb_gpuadvisor.plugin import GpuAdvisorPlugin

        return GpuAdvisorPlugin(context)
