"""What a check returns: a finding, its severity, evidence and fixes.

Below the checks' context (``context.Analysis``) and their declarations (``base.py``), so that
both can name a finding without importing each other.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field


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


# The findings a user should act on, everywhere: the report's ranking, fix-first and what-if,
# the text and Markdown renderers, --fail-on and the tab (frontend/views.js ACTIONABLE mirrors it).
ACTIONABLE = frozenset({Severity.CRITICAL, Severity.WARNING})
# Checks with nothing to say: collapsed into one line (text) or one list (the tab).
QUIET = frozenset({Severity.OK, Severity.NOT_APPLICABLE})


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
