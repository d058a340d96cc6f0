"""Command line: ``tb-gpuadvisor analyze PATH`` and ``tb-gpuadvisor compare BASE NEW``.

Exit codes (the contract): 0 ok, 1 when --fail-on was reached (or a comparison
regressed), 2 on a usage error or an unreadable PATH.
"""

from __future__ import annotations

import argparse
import json
import sys

from tb_gpuadvisor.checks import Severity, all_checks
from tb_gpuadvisor.discovery import DiscoveryError, SessionRef, find_sessions

FORMATS = ("text", "json", "markdown")
FAIL_ON = ("warning", "critical")


class UsageError(Exception):
    """Bad arguments or an unusable PATH: exit 2 with one line on stderr."""


def _sessions(path: str) -> list[SessionRef]:
    try:
        refs = find_sessions(path)
    except DiscoveryError as err:
        raise UsageError(str(err)) from None
    if not refs:
        raise UsageError(f"{path}: no profile sessions found (looked for <run>/plugins/profile/<session>/"
                         f"<host>.xplane.pb)")
    return refs


def _print(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _emit(fmt: str, result: dict, as_text, as_markdown) -> None:
    """Print RESULT as JSON, or through the text or Markdown renderer."""
    _print(json.dumps(result, indent=2) if fmt == "json" else
           as_markdown(result) if fmt == "markdown" else as_text(result))


def _reached(severities: list[str], fail_on: str | None) -> bool:
    if not fail_on:
        return False
    limit = Severity(fail_on).weight
    return any(Severity(s).weight >= limit for s in severities)


def cmd_analyze(args: argparse.Namespace) -> int:
    from tb_gpuadvisor.render import render_markdown, render_text
    from tb_gpuadvisor.report import build_report

    report = build_report(_sessions(args.path), args.jobs)
    _emit(args.format, report, lambda r: render_text(r, verbose=args.verbose), render_markdown)
    severities = [f["severity"] for s in report["sessions"] for f in s["findings"]]
    return 1 if _reached(severities, args.fail_on) else 0


def _one_session(path: str) -> SessionRef:
    refs = _sessions(path)
    if len(refs) > 1:
        names = ", ".join(f"{r.run}/{r.session}" for r in refs[:5])
        raise UsageError(f"{path}: holds {len(refs)} sessions ({names}...); give a session folder")
    return refs[0]


def cmd_compare(args: argparse.Namespace) -> int:
    from tb_gpuadvisor.compare import (
        compare_sessions, has_regression, render_comparison_markdown, render_comparison_text,
    )
    from tb_gpuadvisor.report import analyze_session

    base, new = _one_session(args.base), _one_session(args.new)
    result = compare_sessions(analyze_session(base), analyze_session(new))
    _emit(args.format, result, render_comparison_text, render_comparison_markdown)
    return 1 if args.fail_on and has_regression(result, args.fail_on) else 0


def cmd_checks(args: argparse.Namespace) -> int:
    checks = all_checks()
    if args.check:
        match = [c for c in checks if c.id == args.check]
        if not match:
            raise UsageError(f"unknown check {args.check!r}; known: {', '.join(c.id for c in checks)}")
        _print(f"{match[0].id}: {match[0].title}\n\n{match[0].doc}")
    else:
        _print("\n".join(f"{c.id:<22} {c.title}" for c in checks))
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="tb-gpuadvisor",
                                  description="Ranked GPU performance fixes from TensorFlow/JAX profiles.")
    sub = top.add_subparsers(dest="command", required=True)
    analyze = sub.add_parser("analyze", help="analyse every profile session under PATH")
    analyze.add_argument("path", help="a logdir, run folder, session folder or one .xplane.pb file")
    analyze.add_argument("--format", choices=FORMATS, default="text")
    analyze.add_argument("--fail-on", choices=FAIL_ON, help="exit 1 when a finding this severe appears")
    analyze.add_argument("--jobs", type=int, default=1, help="analyse sessions in N processes")
    analyze.add_argument("-v", "--verbose", action="store_true", help="show passing checks and evidence")
    analyze.set_defaults(func=cmd_analyze)
    compare = sub.add_parser("compare", help="compare two sessions: new, fixed, better, worse findings")
    compare.add_argument("base", help="the baseline session (folder or .xplane.pb)")
    compare.add_argument("new", help="the session to judge against it")
    compare.add_argument("--format", choices=FORMATS, default="text")
    compare.add_argument("--fail-on", choices=FAIL_ON,
                         help="exit 1 when a finding of this severity is new or got worse")
    compare.set_defaults(func=cmd_compare)
    checks = sub.add_parser("checks", help="list the checks, or explain one")
    checks.add_argument("check", nargs="?", help="a check id to explain")
    checks.set_defaults(func=cmd_checks)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as err:
        print(f"tb-gpuadvisor: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
