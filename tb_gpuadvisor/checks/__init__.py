"""The check catalogue: every module in this package registers one check."""

from __future__ import annotations

import importlib
import pkgutil

from tb_gpuadvisor.attribution.replay import Scenario
from tb_gpuadvisor.checks.base import REGISTRY, Check, Finding, Replayed, Severity
from tb_gpuadvisor.checks.finding import Evidence, Fix
from tb_gpuadvisor.timeline import SessionModel

_NOT_CHECKS = {"base", "context", "fixes"}


def all_checks() -> list[Check]:
    """Import every check module once and return the registry in catalogue order."""
    for info in pkgutil.iter_modules(__path__):
        if info.name not in _NOT_CHECKS and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    return list(REGISTRY.values())


def declared(check_id: str) -> Check | None:
    """The registered check of that id (None: a check this version does not know, e.g. from a
    saved report)."""
    all_checks()
    return REGISTRY.get(check_id)


def replay_scenarios(model: SessionModel, device_kind: str) -> dict[str, Scenario]:
    """The what-if scenario of every replayed check for this capture, keyed by check id; on a
    CPU-only capture (DEVICE_KIND "cpu") only the causes that are time on the host's timeline, and
    only the checks of the capture's framework (a PyTorch-only scenario reads PyTorch kernel classes)."""
    return {c.id: c.what_if.scenario(model) for c in all_checks()
            if isinstance(c.what_if, Replayed) and c.applies_to(model.framework)
            and (device_kind != "cpu" or c.what_if.on_cpu)}


def explaining(bound: str | None, framework: str | None = None) -> list[str]:
    """The checks that explain a step bound (BOUND_GROUPS' kinds), most direct first; with a
    FRAMEWORK, only the checks of that framework's captures."""
    return [c.id for c in sorted(all_checks(), key=lambda c: c.explains_order)
            if bound and c.explains == bound and (framework is None or c.applies_to(framework))]


__all__ = ["REGISTRY", "Check", "Evidence", "Finding", "Fix", "Severity", "all_checks", "declared",
           "explaining", "replay_scenarios"]
