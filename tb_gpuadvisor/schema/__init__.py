"""The report's JSON schema: every field of ``--format json`` and of the tab's HTTP routes, its
unit, when it is absent, and the exit codes. ``report.schema.json`` is the source of truth
(versioned by ``metadata.SCHEMA_VERSION``); tests validate real outputs against it."""

from __future__ import annotations

import json
from importlib import resources

SCHEMA_FILE = "report.schema.json"


def report_schema() -> dict:
    """The schema, as shipped with the package."""
    return json.loads(resources.files(__name__).joinpath(SCHEMA_FILE).read_text(encoding="utf-8"))
