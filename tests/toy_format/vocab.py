"""What the toy format's event names mean."""

from __future__ import annotations

from tb_gpuadvisor.kinds import DeviceEventKind, HostEventKind

HOST_KINDS = {"step": HostEventKind.STEP_MARKER, "launch": HostEventKind.LAUNCH,
              "wait_for_batch": HostEventKind.INPUT_WAIT}
DEVICE_KINDS = {"copy_in": DeviceEventKind.MEMCPY_H2D}


def host_kind(name: str) -> HostEventKind:
    return HOST_KINDS.get(name, HostEventKind.OTHER)


def device_kind(name: str) -> DeviceEventKind:
    return DEVICE_KINDS.get(name, DeviceEventKind.KERNEL)
