"""``tensorboard`` for the demo, with XProf's one harmless traceback per session filtered out.

The first time the Profile plugin lists a session's tools it tries to read its tool-list
cache, ``<session>/.cached_tools.json``, before that file exists; XProf logs the missing
file as an exception with a full traceback, then writes the cache and never logs it again.
Nothing is wrong, so the demo drops exactly those records (any other error still shows).
TensorBoard runs in a child process whose stderr goes through ``demo.quiet`` (TensorFlow's
start-up notices dropped).

    python -m demo.serve --logdir demo_logs --host 127.0.0.1 --port 6006
    python -m demo.serve --check-port --host 127.0.0.1 --port 6006   # exit 2 at once if taken

``make demo`` checks the port before training, so a busy port fails in a second, not after
the training.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys

from demo.quiet import run_quietly

CACHE_FILE = ".cached_tools.json"
XPROF_LOGGER = "tensorboard.plugins.profile"
_CHILD = "--tensorboard-child"


class MissingToolsCache(logging.Filter):
    """Drops XProf's "Error reading ... .cached_tools.json" records for a cache not yet written."""

    def filter(self, record: logging.LogRecord) -> bool:
        missing = record.exc_info is not None and isinstance(record.exc_info[1], FileNotFoundError)
        return not (missing and CACHE_FILE in record.getMessage())


def port_taken(host: str, port: int) -> str | None:
    """Why TensorBoard could not listen on HOST:PORT (None: it can), found by binding it once."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)    # as TensorBoard's server binds
        try:
            probe.bind((host, port))
        except OSError as err:
            return (f"port {port} on {host} is not free ({err.strerror or err}): stop what uses it "
                    f"(another TensorBoard?) or pick another, e.g. make demo PORT={port + 1}")
    return None


def _tensorboard(argv: list[str]) -> None:
    from tensorboard import main as tensorboard_main

    logging.getLogger(XPROF_LOGGER).addFilter(MissingToolsCache())
    sys.argv = ["tensorboard", *argv]
    tensorboard_main.run_main()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [_CHILD]:
        _tensorboard(argv[1:])
        return 0
    parser = argparse.ArgumentParser(prog="python -m demo.serve", add_help=False)
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--port", type=int, default=6006)
    parser.add_argument("--check-port", action="store_true")
    known, _ = parser.parse_known_args(argv)
    why = port_taken(known.host, known.port)
    if why:
        print(f"demo: {why}", file=sys.stderr)
        return 2
    if known.check_port:
        return 0
    return run_quietly([sys.executable, "-m", "demo.serve", _CHILD, *argv])


if __name__ == "__main__":
    sys.exit(main())
