"""The analysis of one session, said in one place: files -> input -> model -> ...

Each stage is a function from values to a value; nothing a stage returns is written by a later one.
"""

from __future__ import annotations

from tb_gpuadvisor.input.discovery import SessionRef
from tb_gpuadvisor.input.session import read_session
from tb_gpuadvisor.model import build_session
from tb_gpuadvisor.timeline import SessionModel


def load_session(ref: SessionRef) -> SessionModel:
    """The session model of REF: its hosts read by their formats' adapters, then joined."""
    return build_session(read_session(ref))
