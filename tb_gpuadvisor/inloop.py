"""Advice from inside a training loop: what the Keras callback and the JAX and PyTorch hooks share.

Both wait until step times settle, profile a few steps, analyse the capture in a
separate process (so a big or broken capture can never take training down, and
training keeps running while it is read) and print the top findings when
training ends. Nothing here imports a framework: the profiler calls come in as
a :class:`Tracer` from ``tb_gpuadvisor.keras``, ``tb_gpuadvisor.jax`` or
``tb_gpuadvisor.torch``.

Run as ``python -m tb_gpuadvisor.inloop CAPTURE`` (a session folder, or a trace file of a run
folder: then the session holding it), this module is the analysis process itself: it caps its
own memory and niceness, then prints the report JSON on stdout.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Callable, Literal, Union

from tb_gpuadvisor.checks.base import FAIL_ON, Severity, failing
from tb_gpuadvisor.render import marker_words, one_window

log = logging.getLogger("tb_gpuadvisor")

Warmup = Union[int, Literal["auto"]]

# "auto" warm-up: the last SETTLE_WINDOW step times must lie within SETTLE_TOLERANCE of their
# median. The first step (tracing, compilation) never counts, and after AUTO_WARMUP_CAP steps
# profiling starts anyway: a step time that never settles is worth profiling too.
SETTLE_WINDOW = 3
SETTLE_TOLERANCE = 0.25
AUTO_WARMUP_MIN = 2
AUTO_WARMUP_CAP = 50
# The guide's advice: more than about 10 profiled steps can exhaust profiler memory.
MAX_STEPS = 10
# Memory the analysis process may use when TB_GPUADVISOR_MEMORY_LIMIT_MB is not set.
DEFAULT_MEMORY_LIMIT_MB = 2048
MEMORY_ENV = "TB_GPUADVISOR_MEMORY_LIMIT_MB"
SINGLE_THREADED = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
# How long the end of training waits for an analysis that is still running.
RESULT_TIMEOUT_S = 300.0
TOP_FINDINGS = 3


class AdvisorFindingError(RuntimeError):
    """Raised after training when ``fail_on`` was given and a finding that severe appeared."""


def session_dirs(log_dir: str) -> list[str]:
    """The capture folders a profiler has written into LOG_DIR (``plugins/profile/<session>``)."""
    root = os.path.join(log_dir, "plugins", "profile")
    try:
        return [os.path.join(root, name) for name in os.listdir(root)
                if os.path.isdir(os.path.join(root, name))]
    except OSError:
        return []


@dataclass
class Tracer:
    """The profiler of one framework: start a capture into a log dir, stop it, mark one step.

    ``captures`` lists what the profiler has written into a log dir (session folders for XPlane,
    trace files for PyTorch): the new one after a stop is the capture. ``peers``, for a process of
    a multi-process job, returns once every process of the job has stopped its capture: then the
    analysis waits for it and reads the session of all of them.
    """

    start: Callable[[str], None]
    stop: Callable[[], None]
    step_marker: Callable[[int], AbstractContextManager]
    captures: Callable[[str], list[str]] = session_dirs
    peers: Callable[[], None] | None = None


def check_options(steps: int, warmup_steps: Warmup, fail_on: str | None) -> None:
    """Reject bad arguments when the hook is made, not in the middle of training."""
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be an int from 1 to {MAX_STEPS} (longer captures can exhaust "
                         f"profiler memory), got {steps!r}")
    if warmup_steps != "auto" and (not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool)
                                   or warmup_steps < 0):
        raise ValueError(f'warmup_steps must be "auto" or an int >= 0, got {warmup_steps!r}')
    if fail_on is not None and fail_on not in FAIL_ON:
        raise ValueError(f"fail_on must be one of {FAIL_ON} or None, got {fail_on!r}")


@dataclass
class WarmupClock:
    """Decides when warm-up is over, from the time each step takes."""

    warmup: Warmup
    done: int = 0                          # steps finished so far
    times: list[float] = field(default_factory=list)   # seconds per step, first step excluded

    def record(self, seconds: float | None, count: int) -> None:
        """COUNT steps (one execution of several with steps_per_execution) took SECONDS (None: they
        ended with their epoch or loop, whose own work makes the time meaningless)."""
        if self.done and seconds is not None:
            self.times.append(seconds / count)
        self.done += count

    def settled(self) -> bool:
        if self.warmup != "auto":
            return self.done >= self.warmup
        if self.done >= AUTO_WARMUP_CAP:
            return True
        if self.done < AUTO_WARMUP_MIN or len(self.times) < SETTLE_WINDOW:
            return False
        recent = self.times[-SETTLE_WINDOW:]
        middle = statistics.median(recent)
        return all(abs(t - middle) <= SETTLE_TOLERANCE * middle for t in recent)


class Phase(enum.Enum):
    WARMUP = "warmup"
    PROFILING = "profiling"
    ANALYSING = "analysing"
    DONE = "done"


class StepWindow:
    """Profiles STEPS steps once warm-up is over, then starts the background analysis.

    The owner calls :meth:`begin` when a step (or an execution of several steps) starts,
    optionally :meth:`end` when its host code is done, and :meth:`finish` when training
    ends. Steps are timed and marked from one start to the next: that is the time a
    training loop pays per step, and it needs no hook after the step (Keras then keeps
    dispatching its end-of-batch callbacks asynchronously).
    """

    def __init__(self, log_dir: str, tracer: Tracer, steps: int = 5, warmup_steps: Warmup = "auto",
                 print_report: bool = True, fail_on: str | None = None, analyse: bool = True) -> None:
        check_options(steps, warmup_steps, fail_on)
        self.log_dir = os.path.abspath(log_dir)
        self.tracer = tracer
        self.steps = steps
        self.print_report = print_report
        self.fail_on = fail_on
        self.analyse = analyse
        self.clock = WarmupClock(warmup_steps)
        self.phase = Phase.WARMUP
        self.profiled = 0                 # steps inside the capture so far
        self.profiled_numbers: list[int] = []   # the step number of each marker in the capture
        self.session_dir: str | None = None
        self.analysis: BackgroundAnalysis | None = None
        self.report: dict | None = None
        self.problem: str | None = None   # why there is no report
        self._last: tuple[int, float] | None = None   # number and start time of the running step
        self._marker: AbstractContextManager | None = None
        self._marked = False              # the running step is inside the capture
        self._execution = 1               # steps per begin (steps_per_execution)
        self._sessions_before: set[str] = set()

    def begin(self, step_num: int, room: int | None = None) -> None:
        """Step STEP_NUM starts, which ends the one before it.

        With steps_per_execution, STEP_NUM is the first step of the execution and the
        previous one held as many steps as the numbers differ. ROOM is how many steps
        the epoch has left including this one, when known: a capture starts only when
        it ends inside the epoch, so it never holds an epoch's end and validation.
        """
        now = time.perf_counter()
        if self._last is not None:
            self._execution = max(1, step_num - self._last[0])
            self._count(self._execution, now - self._last[1])
        if self.phase is Phase.PROFILING:
            self._marker = self.tracer.step_marker(step_num)
            self._marker.__enter__()
            self._marked = True
            self.profiled_numbers.append(step_num)
        elif self.phase is Phase.WARMUP and self.clock.settled() and (room is None or room >= self.steps + 2 * self._execution):
            # The profiler starts one step before the first marked one, so its start-up
            # (and the first traced step's extra cost) stays out of the profiled steps.
            self._start()
        self._last = (step_num, time.perf_counter())

    def end(self) -> None:
        """The host code of the running step is done (its marker closes; it is counted at the next
        :meth:`begin`)."""
        self._close_marker()

    def interrupt(self) -> None:
        """An epoch or the loop ended: the running step ends, and a running capture with it."""
        self._close_marker()
        if self._last is not None and self.phase is Phase.WARMUP:
            self.clock.record(None, self._execution)
        if self._marked:
            self.profiled += self._execution
            self._marked = False
        self._last = None
        if self.phase is Phase.PROFILING:
            self._stop()

    def finish(self) -> None:
        """Training ended: stop a running capture, wait for the analysis, print, maybe raise."""
        self.interrupt()
        if self.tracer.peers is not None:
            self.tracer.peers()     # every process calls it, whether or not it captured
            if self.phase is Phase.ANALYSING and self.analyse:
                self.analysis = BackgroundAnalysis(self.session_dir)
        if self.phase is Phase.WARMUP:
            self.problem = (f"training ended after {self.clock.done} steps, before warm-up was over and "
                            f"{self.steps} steps could be profiled")
        elif self.phase is Phase.ANALYSING and self.analysis is not None:
            self.report, self.problem = self.analysis.result()
        self.phase = Phase.DONE
        if not self.analyse:
            return
        text = advice_text(self.report, self.problem, self.session_dir, self.log_dir)
        if self.print_report:
            print(text, flush=True)
        line = summary_line(self.report, self.problem, self.session_dir)
        (log.warning if top_findings(self.report) else log.info)(line)
        reached = failing_findings(self.report, self.fail_on)
        if reached:
            raise AdvisorFindingError(f"{len(reached)} finding(s) at or above {self.fail_on!r}: "
                                      + "; ".join(f"{f['check']} ({f['severity']}): {f['title']}"
                                                  for f in reached))

    def _count(self, count: int, seconds: float) -> None:
        """The previous execution of COUNT steps took SECONDS."""
        self._close_marker()
        if self.phase is Phase.WARMUP:
            self.clock.record(seconds, count)
        elif self._marked:
            self._marked = False
            self.profiled += count
            if self.profiled >= self.steps:
                self._stop()

    def _start(self) -> None:
        self._sessions_before = set(self.tracer.captures(self.log_dir))
        try:
            self.tracer.start(self.log_dir)
        except Exception as err:  # another profiler running, a bad log dir: training goes on
            self.problem = f"could not start the profiler: {err}"
            log.warning("tb_gpuadvisor: %s", self.problem)
            self.phase = Phase.DONE
            return
        self.phase = Phase.PROFILING

    def _close_marker(self) -> None:
        if self._marker is not None:
            self._marker.__exit__(None, None, None)
            self._marker = None

    def _stop(self) -> None:
        try:
            self.tracer.stop()
        except Exception as err:
            self.problem = f"could not stop the profiler: {err}"
            log.warning("tb_gpuadvisor: %s", self.problem)
            self.phase = Phase.DONE
            return
        new = sorted(set(self.tracer.captures(self.log_dir)) - self._sessions_before)
        if not new:
            self.problem = f"the profiler wrote no capture under {self.log_dir}"
            self.phase = Phase.DONE
            return
        self.session_dir = new[-1]
        self.phase = Phase.ANALYSING
        if self.analyse and self.tracer.peers is None:
            self.analysis = BackgroundAnalysis(self.session_dir)


def memory_limit_mb() -> int:
    """The analysis process's memory limit: TB_GPUADVISOR_MEMORY_LIMIT_MB, or a default."""
    value = os.environ.get(MEMORY_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else DEFAULT_MEMORY_LIMIT_MB


class BackgroundAnalysis:
    """The report of one capture, computed by a low-priority child process.

    Its output goes to a temporary file, so the child never waits on a full pipe
    while training has not asked for the result yet.
    """

    def __init__(self, session_dir: str) -> None:
        self.session_dir = session_dir
        self._out = tempfile.TemporaryFile()
        self._err = tempfile.TemporaryFile()
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        # One thread for numerical libraries: their idle worker threads spin on CPUs training uses.
        env = dict(os.environ, **{MEMORY_ENV: str(memory_limit_mb())}, **SINGLE_THREADED)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
        try:
            self._process: subprocess.Popen | None = subprocess.Popen(
                [sys.executable, "-m", "tb_gpuadvisor.inloop", session_dir],
                stdin=subprocess.DEVNULL, stdout=self._out, stderr=self._err, env=env)
            self._launch_error = ""
        except OSError as err:
            self._process, self._launch_error = None, f"could not start the analysis: {err}"

    def running(self) -> bool:
        """Whether the analysis process is still at work."""
        return self._process is not None and self._process.poll() is None

    def result(self, timeout: float = RESULT_TIMEOUT_S) -> tuple[dict | None, str | None]:
        """(report, None) or (None, why there is none). Never raises."""
        if self._process is None:
            return None, self._launch_error
        try:
            code = self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
            return None, f"the analysis took longer than {timeout:.0f} s and was stopped"
        self._out.seek(0)
        self._err.seek(0)
        out, err = self._out.read().decode(errors="replace"), self._err.read().decode(errors="replace")
        self._out.close()
        self._err.close()
        if code != 0:
            last = err.strip().splitlines()[-1:] or [f"exit code {code}"]
            return None, f"the analysis failed: {last[0]}"
        try:
            return json.loads(out), None
        except ValueError as bad:
            return None, f"the analysis printed no report ({bad})"


def _session(report: dict | None) -> dict | None:
    return report["sessions"][0] if report and report.get("sessions") else None


def top_findings(report: dict | None, limit: int | None = TOP_FINDINGS) -> list[dict]:
    """The highest-ranked critical and warning findings worth acting on (LIMIT of them, or all)."""
    session = _session(report)
    if session is None:
        return []
    return failing(session["findings"], Severity.WARNING.value)[:limit]


def failing_findings(report: dict | None, fail_on: str | None) -> list[dict]:
    session = _session(report)
    return failing(session["findings"], fail_on) if session is not None else []


def _steps_sentence(steps: dict, framework: str | None) -> str:
    """The steps as the CLI and the tab name their markers (a JAX loop's are StepTraceAnnotation)."""
    if not steps.get("count"):
        return "no training steps were found in the capture"
    if one_window(steps):
        return one_window(steps)
    return f"{steps['count']} steps ({marker_words(steps, framework)} markers), mean {steps['mean_ms']:.2f} ms per step"


def _finding_lines(label: str, f: dict, mean_ms: float) -> list[str]:
    """One finding as printed: title, saving, summary, evidence and fixes."""
    saving = f["estimated_savings_ms_per_step"]
    share = f" ({100 * saving / mean_ms:.0f}% of the step)" if mean_ms and saving else ""
    out = [f"  {label} [{f['severity'].upper()}] {f['title']}",
           f"     saves about {saving:.2f} ms per step{share}; check: {f['check']}"]
    out += textwrap.wrap(f["summary"], 96, initial_indent="     ", subsequent_indent="     ")
    for ev in f.get("evidence", [])[:3]:
        out.append(f"     - {ev['name'][:80]}: {ev['value']:g} {ev['unit']}")
    for fix in f.get("fixes", [])[:3]:
        out += textwrap.wrap(fix["text"], 96, initial_indent="     fix: ", subsequent_indent="          ")
        if fix.get("code"):
            out.append(textwrap.indent(fix["code"], "          "))
    return out


def advice_text(report: dict | None, problem: str | None, session_dir: str | None, log_dir: str) -> str:
    """What is printed when training ends: the top findings, their savings and fixes, and where
    the capture is."""
    out = ["", "tb-gpuadvisor: " + ("no advice: " + problem if problem else "advice from the profiled steps")]
    session = _session(report)
    if session is not None:
        out.append(f"  {_steps_sentence(session['steps'], session.get('framework'))}")
        for err in session.get("errors", []):
            out.append(f"  error: {err['message']}")
        top = top_findings(report, limit=None)
        # What says the capture cannot be advised on as it stands (the model ran on the CPU, the
        # device trace is missing) is a note above the numbered fixes, which start with the program's.
        notes = [f for f in top if f.get("metrics", {}).get("leads") is True]
        ranked = [f for f in top if f not in notes][:TOP_FINDINGS]
        if not ranked:
            out.append("  nothing to fix: no critical or warning finding.")
        mean = session["steps"].get("mean_ms") or 0.0
        for label, f in [("note:", f) for f in notes] + [(f"{i}.", f) for i, f in enumerate(ranked, 1)]:
            out += _finding_lines(label, f, mean)
    if session_dir:
        # A trace file is one rank's: the CLI reads the session of all ranks from its run folder.
        # (and XProf's Profile tab opens no trace file).
        trace_file = os.path.isfile(session_dir)
        whole = os.path.dirname(session_dir) if trace_file else session_dir
        out.append(f"  capture: {session_dir}")
        tabs = "the Advisor tab" if trace_file else "the Advisor tab; the Profile tab with pip install xprof"
        out.append(f"  see it:  tensorboard --logdir {log_dir}   ({tabs})")
        out.append(f"  or:      tb-gpuadvisor analyze {whole}")
    return "\n".join(out) + "\n"


def summary_metrics(report: dict | None) -> dict[str, float]:
    """The advice as numbers a training logger plots beside its losses: the profiled mean step,
    how many findings are worth acting on, and the largest estimated saving among them."""
    session = _session(report)
    if session is None:
        return {}
    top = top_findings(report, limit=None)
    saving = max((f["estimated_savings_ms_per_step"] for f in top), default=0.0)
    return {"gpuadvisor/step_ms": session["steps"].get("mean_ms") or 0.0,
            "gpuadvisor/findings": float(len(top)), "gpuadvisor/top_saving_ms": saving}


def summary_line(report: dict | None, problem: str | None, session_dir: str | None) -> str:
    """The one line logged when training ends."""
    session = _session(report)
    if session is None:
        return f"tb_gpuadvisor: no advice: {problem}"
    top = top_findings(report)
    found = ("; ".join(f"{f['check']} {f['severity']} (saves {f['estimated_savings_ms_per_step']:.2f} ms/step)"
                       for f in top) if top else "no critical or warning finding")
    return f"tb_gpuadvisor: {_steps_sentence(session['steps'], session.get('framework'))}: {found}; capture {session_dir}"


def _limit_self(limit_mb: int) -> None:
    """Run only on CPU time training leaves idle, and cap this process's data memory.

    Best effort: SCHED_IDLE and RLIMIT_DATA are Linux features; elsewhere the lowest
    niceness and no cap.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        try:
            os.nice(19)
        except (AttributeError, OSError):
            pass
    try:
        import resource

        limit = limit_mb << 20
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass


def _sessions_of(capture: str) -> list:
    """The sessions to analyse for CAPTURE: a session folder's, or for a trace file of a run folder
    (PyTorch) the session holding it, with the files every other rank wrote in the same cycle. Only
    that folder is listed, never the folders below it (checkpoints, other runs)."""
    from tb_gpuadvisor.input.discovery import find_sessions, folder_sessions

    if not os.path.isfile(capture):
        return find_sessions(capture)
    folder, name = os.path.split(capture)
    refs = folder_sessions(None, os.path.basename(folder) or ".", folder, sorted(os.listdir(folder)))
    return [ref for ref in refs if name in dict(ref.files).values()]


def main(argv: list[str]) -> int:
    """The analysis process: one capture in, the report JSON out."""
    _limit_self(memory_limit_mb())
    from tb_gpuadvisor.multihost import build_report
    from tb_gpuadvisor.heap import one_heap

    one_heap()

    json.dump(build_report(_sessions_of(argv[0])), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
