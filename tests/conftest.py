"""Session-wide test set-up."""

from __future__ import annotations

import signal


def pytest_configure(config):
    # A SIGTERM (e.g. from `timeout` or a CI runner) becomes a KeyboardInterrupt, so that pytest still runs
    # fixture teardown and the server fixtures stop the SGLang processes they started.
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
