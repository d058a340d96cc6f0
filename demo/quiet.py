"""The demo's child processes with TensorFlow's start-up notices dropped from their stderr.

Every process that imports TensorFlow 2.16+ on x86 prints, before absl's logging is set up (so
``TF_CPP_MIN_LOG_LEVEL`` cannot hold them back), absl's "All log messages before
absl::InitializeLog() ..." banner and an informational "oneDNN custom operations are on" line:
two of each per process, 36 lines in a ``make demo``. ``TF_ENABLE_ONEDNN_OPTS=0`` would silence
the second only by switching oneDNN off, which changes how the demo computes, so the demo drops
exactly these lines instead; everything else the child writes is passed on as it comes.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys

NOTICES = re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
                     r"|^I\d{4} [\d:.]+ +\d+ port\.cc:\d+\] oneDNN custom operations are on\.")


def harmless(line: str) -> bool:
    return bool(NOTICES.match(line.rstrip("\n")))


# Signals that stop this process (kill PID, a closed terminal): passed on to the child, so that
# stopping the parent by its PID never leaves the child (TensorBoard on its port) running.
PASSED_ON = (signal.SIGTERM, signal.SIGHUP)


def run_quietly(command: list[str], **options) -> int:
    """Runs COMMAND, its stderr passed on without TensorFlow's start-up notices; its exit code.
    Interrupted or terminated, it passes the signal on to the child and waits for it to exit."""
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1,
                          **options) as child:
        def pass_on(signum: int, _frame) -> None:
            if child.poll() is None:
                child.send_signal(signum)

        before = {signum: signal.signal(signum, pass_on) for signum in PASSED_ON}
        try:
            for line in child.stderr:
                if not harmless(line):
                    sys.stderr.write(line)
                    sys.stderr.flush()
        except KeyboardInterrupt:       # a terminal's Ctrl+C reached both; a lone SIGINT only us
            if child.poll() is None:
                child.send_signal(signal.SIGINT)
        finally:
            for signum, handler in before.items():
                signal.signal(signum, handler)
        return child.wait()
