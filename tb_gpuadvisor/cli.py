"""Command line: ``tb-gpuadvisor analyze PATH`` and ``tb-gpuadvisor compare BASE NEW``.

Exit codes (the contract): 0 ok; 1 when --fail-on was reached (analyze: a finding that
severe; compare: a regression that severe, or a step-time regression beyond the noise
band); 2 on a usage error, an unreadable PATH, or a session that could not be analysed at
all (every host file unreadable, refused or empty), so CI never passes on nothing, or one
with a host file the profiler is still writing (unless --partial), so no report of part of a
session passes for the whole of it.
Findings of ``low`` confidence never reach --fail-on on their own.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import posixpath
import re
import sys
import textwrap
from typing import TYPE_CHECKING

from tb_gpuadvisor.checks import Check, all_checks, fixes
from tb_gpuadvisor.checks.base import FAIL_ON, failing
from tb_gpuadvisor.input.discovery import DiscoveryError, SessionRef, find_sessions

if TYPE_CHECKING:
    from tb_gpuadvisor.multihost.engine import Engine

FORMATS = ("text", "json", "markdown")


class UsageError(Exception):
    """Bad arguments or an unusable PATH: exit 2 with one line on stderr."""


def _named(ref: SessionRef) -> SessionRef:
    """REF with its run named after its folder when discovery called it "." (PATH was the run
    folder itself): "train / <session>" in the output, as the user knows it."""
    run_dir = _run_dir(ref) if ref.run == "." else None
    if run_dir is None:
        return ref
    paths = os.path if ref.fs is None else posixpath
    return dataclasses.replace(ref, run=paths.basename(run_dir.rstrip("/")) or ".")


def _sessions(path: str) -> list[SessionRef]:
    # An absolute local path names a loose capture after its folder, not ".".
    local = "://" not in path
    try:
        refs = find_sessions(os.path.abspath(path) if local else path)
    except DiscoveryError as err:
        raise UsageError(str(err)) from None
    if not refs:
        raise UsageError(f"{path}: no profile sessions found (looked for <run>/plugins/profile/<session>/"
                         f"<host>.xplane.pb, <run>/<worker>.pt.trace.json[.gz] and Chrome-trace .json[.gz] files); capture with "
                         f"tb_gpuadvisor.keras.AdvisorCallback, tb_gpuadvisor.jax.profile_steps, "
                         f"torch.profiler's tensorboard_trace_handler or the TensorBoard callback (see the README)")
    return [_named(ref) for ref in refs]


def _print(text: str, stream=None) -> None:
    """Write TEXT whatever the stream's encoding: names from non-UTF-8 file names come
    back as lone surrogates, which a strict UTF-8 stream would refuse."""
    stream = stream or sys.stdout
    text = text if text.endswith("\n") else text + "\n"
    encoding = getattr(stream, "encoding", None) or "utf-8"
    stream.write(text.encode(encoding, "backslashreplace").decode(encoding))


def _emit(fmt: str, result: dict, as_text, as_markdown) -> None:
    """Print RESULT as JSON, or through the text or Markdown renderer."""
    _print(json.dumps(result, indent=2) if fmt == "json" else
           as_markdown(result) if fmt == "markdown" else as_text(result))


def _say_reached(fail_on: str, causes: list[str]) -> int:
    """Exit 1 with one stderr line naming the threshold and what reached it: a CI log that
    only says "exit 1" sends the reader hunting through the report."""
    from tb_gpuadvisor.render import printable

    _print(printable(f"tb-gpuadvisor: fail-on {fail_on} reached: {', '.join(causes)}"), sys.stderr)
    return 1


def _analyze_causes(sessions: list[dict], fail_on: str | None) -> list[str]:
    """"input_bound (critical)" per finding reaching FAIL_ON, prefixed by its session when
    the report holds several."""
    from tb_gpuadvisor.render import session_title

    prefix = (lambda s: f"{session_title(s)}: ") if len(sessions) > 1 else (lambda s: "")
    return [f"{prefix(s)}{f['check']} ({f['severity']})" for s in sessions for f in failing(s["findings"], fail_on)]


def _unanalysed(sessions: list[dict]) -> int:
    """Report on stderr every session nothing could be read from; their count."""
    from tb_gpuadvisor.render import printable, session_title, unreadable

    bad = [(s, unreadable(s)) for s in sessions]
    bad = [(s, why) for s, why in bad if why]
    for session, why in bad:
        message = f"tb-gpuadvisor: error: {session_title(session)}: could not be analysed: {why}"
        _print(printable(message), sys.stderr)
    return len(bad)


def _still_written(sessions: list[dict]) -> int:
    """Report on stderr every session analysed while one of its host files is still being written
    (the others' report is not the session's); their count."""
    from tb_gpuadvisor.render import printable, session_title, unreadable
    from tb_gpuadvisor.service import being_written

    partial = [(s, why) for s in sessions if not unreadable(s) and (why := being_written(s))]
    for session, why in partial:
        _print(printable(f"tb-gpuadvisor: error: {session_title(session)}: a host is still being written ({why}); "
                         "the report covers the other hosts only: run again once the profiler has finished, "
                         "or pass --partial to accept it"), sys.stderr)
    return len(partial)


def cmd_analyze(args: argparse.Namespace) -> int:
    from tb_gpuadvisor.render import render_markdown, render_text
    from tb_gpuadvisor.multihost import build_report

    refs = _sessions(args.path)
    if args.timeline is not None and args.format != "json":
        raise UsageError("--timeline draws a step for scripts: add --format json")
    with _engine(args) as engine:
        report = build_report(refs, args.jobs, engine=engine)
    if args.timeline is not None:
        _add_timelines(refs, report["sessions"], args.timeline)
    _emit(args.format, report, lambda r: render_text(r, verbose=args.verbose), render_markdown)
    unanalysed = _unanalysed(report["sessions"])        # every such session gets its line
    if unanalysed + (0 if args.partial else _still_written(report["sessions"])):
        return 2
    causes = _analyze_causes(report["sessions"], args.fail_on)
    return _say_reached(args.fail_on, causes) if causes else 0


def _add_timelines(refs: list[SessionRef], sessions: list[dict], step: int | str) -> None:
    """Each analysed session's STEP (a number, or its representative step) as the tab draws it, under
    "timeline" (stepview); a session without that step gets the reason under "timeline_error"."""
    from tb_gpuadvisor.pipeline import analysed_session
    from tb_gpuadvisor.render import unreadable
    from tb_gpuadvisor.stepview import StepNotFound

    for ref, session in zip(refs, sessions):
        if unreadable(session):
            continue
        try:
            session["timeline"] = analysed_session(ref).timeline(step if isinstance(step, int) else None)
        except StepNotFound as err:
            session["timeline_error"] = str(err)


def _step(text: str) -> int | str:
    """--timeline's STEP: a step number, or "representative"."""
    if text == "representative":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a step number or 'representative' (got {text!r})") from None


def _engine(args: argparse.Namespace) -> "Engine":
    """The engine the flags ask for; one that cannot be built is a usage error."""
    from tb_gpuadvisor.multihost.engine import EngineError, make_engine

    try:
        return make_engine(args.engine, args.address, args.workers)
    except EngineError as err:
        raise UsageError(str(err)) from None


def _one_session(path: str) -> SessionRef:
    refs = _sessions(path)
    if len(refs) > 1:
        names = ", ".join(f"{r.run}/{r.session}" for r in refs[:5])
        raise UsageError(f"{path}: holds {len(refs)} sessions ({names}...); give a session folder")
    return refs[0]


def _run_dir(ref: SessionRef) -> str | None:
    """The run folder holding REF (<run>/plugins/profile/<session>; PyTorch traces sit in the run
    folder itself), or None for a loose capture."""
    if ref.files:
        return ref.path
    paths = os.path if ref.fs is None else posixpath
    run_dir = paths.dirname(paths.dirname(paths.dirname(ref.path)))
    return run_dir if paths.join(run_dir, "plugins", "profile", ref.session) == ref.path else None


def _side_names(base: SessionRef, new: SessionRef) -> tuple[SessionRef, SessionRef]:
    """BASE and NEW with their runs named by their folders' paths below the folder both share:
    "launch_bound/train" and "launch_bound_fixed/train", where each run's own folder name
    alone ("train", as Keras names it) would not tell the two sides apart."""
    dirs = [_run_dir(base), _run_dir(new)]
    if None in dirs or (base.fs is None) != (new.fs is None):
        return base, new
    paths = os.path if base.fs is None else posixpath
    try:
        common = paths.commonpath(dirs)
    except ValueError:          # nothing in common (two buckets, two drives)
        return base, new
    # One run on both sides, or one run inside the other: name it from its parent.
    anchor = paths.dirname(common) if common in dirs else common
    if not anchor:
        return base, new
    base_run, new_run = (paths.relpath(d, anchor).replace(os.sep, "/") for d in dirs)
    return dataclasses.replace(base, run=base_run), dataclasses.replace(new, run=new_run)


def cmd_compare(args: argparse.Namespace) -> int:
    from tb_gpuadvisor.compare import (
        compare_sessions, refusal, regressions_reaching, render_comparison_markdown, render_comparison_text,
    )
    from tb_gpuadvisor.multihost import analyze_session

    refs = _side_names(_one_session(args.base), _one_session(args.new))
    with _engine(args) as engine:
        base, new = [analyze_session(ref, engine=engine) for ref in refs]
    why = refusal(base, new)
    if why:
        raise UsageError(why)
    result = compare_sessions(base, new)
    _emit(args.format, result, render_comparison_text, render_comparison_markdown)
    causes = regressions_reaching(result, args.fail_on) if args.fail_on else []
    return _say_reached(args.fail_on, causes) if causes else 0


_HEADING = re.compile(r"^#+\s*(.*)$", re.MULTILINE)


def terminal_doc(doc: str) -> str:
    """A check's docstring for the terminal: its own first line (the id again) dropped,
    Markdown headings as plain underlined lines, ``code`` without the backticks."""
    body = doc.split("\n", 1)[1].lstrip("\n") if "\n" in doc else ""
    body = _HEADING.sub(lambda m: f"{m.group(1)}\n{'-' * len(m.group(1))}", body)
    return body.replace("``", "")


_FRAMEWORK_NAMES = {"tensorflow": "TensorFlow", "jax": "JAX", "pytorch": "PyTorch"}


def fixes_by_framework(check: Check, only: str | None = None) -> str:
    """The fixes CHECK can give, under each framework it reads (ONLY: that one), in the words a
    report for that framework uses; a check's docstring speaks TensorFlow, its fixes do not."""
    offered = fixes.offered(sys.modules[check.function.__module__])
    blocks = []
    for framework in (only,) if only else fixes.FRAMEWORKS:
        title = f"Fixes it gives in {_FRAMEWORK_NAMES[framework]} runs"
        if not check.applies_to(framework):
            lines = ["  (the check does not run on these captures)"]
        else:
            lines = [textwrap.fill(fix.text, 96, initial_indent="  - ", subsequent_indent="    ")
                     for fix in offered[framework]] or ["  (none: the finding is for information)"]
        blocks.append("\n".join([title, "-" * len(title), *lines]))
    return "\n\n".join(blocks)


def cmd_checks(args: argparse.Namespace) -> int:
    checks = all_checks()
    if args.check:
        match = [c for c in checks if c.id == args.check]
        if not match:
            raise UsageError(f"unknown check {args.check!r}; known: {', '.join(c.id for c in checks)}")
        declaration = "\n".join(f"{name + ':':<19} {value}" for name, value in match[0].declaration())
        _print(f"{match[0].id}: {match[0].title}\n\n{declaration}\n\n{terminal_doc(match[0].doc)}\n\n"
               f"{fixes_by_framework(match[0], args.framework)}")
    else:
        _print("\n".join(f"{c.id:<22} {c.title}" for c in checks))
    return 0


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of processes, 1 or more (got {text!r})")
    return value


def _add_engine_flags(command: argparse.ArgumentParser) -> None:
    """--engine, --address, --workers: where a session's hosts are analysed."""
    from tb_gpuadvisor.multihost.engine import ENGINES

    command.add_argument("--engine", choices=list(ENGINES), default=next(iter(ENGINES)),
                         help="where each host of a session is analysed: " +
                              "; ".join(f"{name}: {kind.summary}" for name, kind in ENGINES.items()))
    command.add_argument("--address", help="the Dask scheduler to attach to, e.g. tcp://10.0.0.5:8786 "
                                           "(default: $DASK_SCHEDULER_ADDRESS); only with --engine dask")
    command.add_argument("--workers", type=_jobs, help="local processes for a session's hosts (default: all cores)")


FORMAT_HELP = "text for a terminal (default), json for tools (the report contract), markdown for a PR comment"


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="tb-gpuadvisor", description="Ranked GPU performance fixes from TensorFlow, JAX and PyTorch profiles.",
        epilog="Exit codes: 0 ok; 1 --fail-on reached; 2 usage error, unreadable PATH, a session "
               "that could not be analysed at all, or one with a host file still being written "
               "(without --partial); the report is still printed.")
    sub = top.add_subparsers(dest="command", required=True)
    analyze = sub.add_parser("analyze", help="analyse every profile session under PATH")
    analyze.add_argument("path", help="a logdir, run folder, session folder, or one .xplane.pb or "
                         ".pt.trace.json[.gz] file")
    analyze.add_argument("--format", choices=FORMATS, default="text", help=FORMAT_HELP)
    analyze.add_argument("--fail-on", choices=FAIL_ON,
                         help="exit 1 when a finding this severe appears (low-confidence findings do not count); "
                              "a session that could not be analysed at all exits 2 in any case")
    analyze.add_argument("--jobs", type=_jobs, default=1, help="analyse sessions in N processes (N >= 1)")
    analyze.add_argument("--partial", action="store_true",
                         help="accept a session one of whose host files is still being written: report the "
                              "others and exit as usual (without it such a session exits 2)")
    analyze.add_argument("-v", "--verbose", action="store_true",
                         help="show passing checks, evidence and every fix")
    analyze.add_argument("--timeline", metavar="STEP", type=_step,
                         help="with --format json: add each session's step STEP (a step number, or "
                              "'representative') as the tab's timeline draws it, each finding's intervals marked")
    _add_engine_flags(analyze)
    analyze.set_defaults(func=cmd_analyze)
    compare = sub.add_parser("compare", help="compare two sessions: new, fixed, better, worse findings")
    compare.add_argument("base", help="the baseline session (folder, .xplane.pb or .pt.trace.json[.gz])")
    compare.add_argument("new", help="the session to judge against it")
    compare.add_argument("--format", choices=FORMATS, default="text", help=FORMAT_HELP)
    compare.add_argument("--fail-on", choices=FAIL_ON,
                         help="exit 1 when a finding of this severity is new or got worse in time per step, "
                              "or the step got slower beyond the noise band; without it compare only reports")
    _add_engine_flags(compare)
    compare.set_defaults(func=cmd_compare)
    checks = sub.add_parser("checks", help="list the checks, or explain one")
    checks.add_argument("check", nargs="?", help="a check id to explain")
    checks.add_argument("--framework", choices=fixes.FRAMEWORKS,
                        help="list the check's fixes for this framework only (default: each in turn)")
    checks.set_defaults(func=cmd_checks)
    return top


def main(argv: list[str] | None = None) -> int:
    from tb_gpuadvisor.heap import one_heap

    one_heap()      # before any thread allocates
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as err:
        from tb_gpuadvisor.render import printable

        _print(printable(f"tb-gpuadvisor: error: {err}"), sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
