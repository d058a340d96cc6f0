"""Per-framework name rules: what an event's name means, decided once per distinct name by the
format adapter that reads the capture (see tb_gpuadvisor/adapters)."""
