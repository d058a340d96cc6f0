"""The check catalogue: every module in this package registers one check."""

from __future__ import annotations

import importlib
import pkgutil

from tb_gpuadvisor.checks.base import REGISTRY, Check, Evidence, Finding, Fix, Severity

_NOT_CHECKS = {"base", "context", "fixes"}


def all_checks() -> list[Check]:
    """Import every check module once and return the registry in catalogue order."""
    for info in pkgutil.iter_modules(__path__):
        if info.name not in _NOT_CHECKS and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    return list(REGISTRY.values())


__all__ = ["REGISTRY", "Check", "Evidence", "Finding", "Fix", "Severity", "all_checks"]
