"""``tensorboard`` for the demo, with XProf's one harmless traceback per session filtered out.

The first time the Profile plugin lists a session's tools it tries to read its tool-list
cache, ``<session>/.cached_tools.json``, before that file exists; XProf logs the missing
file as an exception with a full traceback, then writes the cache and never logs it again.
Nothing is wrong, so the demo drops exactly those records (any other error still shows).

    python -m demo.serve --logdir demo_logs --port 6006
"""

from __future__ import annotations

import logging
import sys

CACHE_FILE = ".cached_tools.json"
XPROF_LOGGER = "tensorboard.plugins.profile"


class MissingToolsCache(logging.Filter):
    """Drops XProf's "Error reading ... .cached_tools.json" records for a cache not yet written."""

    def filter(self, record: logging.LogRecord) -> bool:
        missing = record.exc_info is not None and isinstance(record.exc_info[1], FileNotFoundError)
        return not (missing and CACHE_FILE in record.getMessage())


def main() -> None:
    from tensorboard import main as tensorboard_main

    logging.getLogger(XPROF_LOGGER).addFilter(MissingToolsCache())
    sys.argv = ["tensorboard", *sys.argv[1:]]
    tensorboard_main.run_main()


if __name__ == "__main__":
    main()
