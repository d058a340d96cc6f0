"""The session model built from what the input stage read (``input.session``)."""

from __future__ import annotations

from tb_gpuadvisor.input.session import SessionCaptures
from tb_gpuadvisor.model.steps import find_steps, framework
from tb_gpuadvisor.stages import stage
from tb_gpuadvisor.timeline import HostModel, SessionModel


def build_session(read: SessionCaptures, session_hosts: int = 0) -> SessionModel:
    """The session model of the hosts READ: their tables, steps and framework (SESSION_HOSTS: the
    hosts of the whole session when READ holds one of them, for multihost's per-host map)."""
    host_captures = [c for c, _ in read.captures]
    made_by = framework(host_captures)
    with stage("model", hand_back=False):
        steps = find_steps(host_captures, made_by)
    if not host_captures and read.framework is not None:
        made_by = read.framework        # no file could be read: its format still says who wrote it
    hosts = [HostModel(c.host, path, c.activity, c.memory, c.devices, c.origin_ns, c.warnings, c.dropped_events,
                       c.partial_trace)
             for c, path in read.captures]
    model = SessionModel(read.run, read.session, hosts, steps, made_by, list(read.errors),
                         session_hosts=session_hosts)
    model.warnings.extend(read.warnings)
    for c in host_captures:
        model.warnings.extend(f"{c.host}: {w}" for w in c.warnings)
    return model
