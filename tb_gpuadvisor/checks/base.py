"""What a check is and what it returns.

A check is a small registered unit, like a linter rule: a stable id, a title,
and a function from the analysed session to one :class:`Finding`.  Each check
lives in its own module whose docstring explains what it measures, why it
matters and how to fix it; the registry reads that docstring for ``--explain``.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from tb_gpuadvisor.checks.context import Analysis


class Severity(str, enum.Enum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"
    OK = "ok"
    NOT_APPLICABLE = "not_applicable"

    @property
    def weight(self) -> int:
        """Ordering for ranking and --fail-on: larger is worse."""
        return {"critical": 4, "warning": 3, "info": 2, "ok": 1, "not_applicable": 0}[self.value]


def severity_by_threshold(value: float, critical: float | None, warning: float | None) -> Severity:
    """Severity for metrics where bigger is worse (the catalogue's ">= N" rules)."""
    if critical is not None and value >= critical:
        return Severity.CRITICAL
    if warning is not None and value >= warning:
        return Severity.WARNING
    return Severity.OK


@dataclass
class Fix:
    text: str
    code: str = ""
    doc: str = ""


@dataclass
class Evidence:
    """One offending op, kernel, step, device, pipeline stage or thread, with its number."""

    kind: str
    name: str
    value: float
    unit: str
    detail: str | None = None
    device: str | None = None
    host: str | None = None
    start_ms: float | None = None
    end_ms: float | None = None
    tool: str | None = None

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class Finding:
    check: str
    severity: Severity
    title: str
    summary: str
    metrics: dict[str, float | int | str | None] = field(default_factory=dict)
    estimated_savings_ms_per_step: float = 0.0
    evidence: list[Evidence] = field(default_factory=list)
    fixes: list[Fix] = field(default_factory=list)
    # How far the capture supports it ("high", "medium", "low") and why; set by the report from
    # the trust stage, or by the check itself when it knows better.
    confidence: str = "high"
    confidence_reasons: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "check": self.check,
            "severity": self.severity.value,
            "title": self.title,
            "summary": self.summary,
            "metrics": self.metrics,
            "estimated_savings_ms_per_step": round(float(self.estimated_savings_ms_per_step), 3),
            "confidence": self.confidence,
            "confidence_reasons": self.confidence_reasons,
            "evidence": [item.to_json() for item in self.evidence],
            "fixes": [asdict(fix) for fix in self.fixes],
        }


def needs_steps(check_id: str, subject: str, measure: str) -> Finding:
    """The not-applicable finding of a per-step check on a capture without steps."""
    return Finding(check_id, Severity.NOT_APPLICABLE, f"{subject} not measurable",
                   f"No training steps were found, so {measure} per step cannot be measured "
                   "(see the profile quality finding).")


def needs_gpu(check_id: str, subject: str) -> Finding:
    """The not-applicable finding of a GPU check on a capture where no GPU ran kernels."""
    return Finding(check_id, Severity.NOT_APPLICABLE, f"No GPU {subject} to assess",
                   f"The capture has no GPU that ran kernels, so there are no GPU {subject} to measure.")


CheckFunction = Callable[["Analysis"], Finding]


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    function: CheckFunction
    doc: str

    def run(self, analysis: "Analysis") -> Finding:
        return self.function(analysis)


REGISTRY: dict[str, Check] = {}


def register(check_id: str, title: str, doc: str | None) -> Callable[[CheckFunction], CheckFunction]:
    """Decorator: ``@register("input_bound", "Input pipeline bottleneck", __doc__)``."""

    def decorate(function: CheckFunction) -> CheckFunction:
        if check_id in REGISTRY:
            raise ValueError(f"check {check_id!r} registered twice")
        REGISTRY[check_id] = Check(check_id, title, function, (doc or "").strip())
        return function

    return decorate
